//! The OpenAPI document, generated from the handlers' annotations.

use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "proxypool",
        description = "A pool of outbound proxies: leases, outcomes, addresses, the address × site matrix."
    ),
    paths(
        super::leases::acquire,
        super::leases::release,
        super::leases::feedback,
        super::addresses::list,
        super::addresses::add,
        super::addresses::remove,
        super::addresses::matrix,
        super::addresses::snapshot,
        super::ops::healthz,
        super::ops::metrics,
    ),
    components(schemas(super::error::ErrorBody, super::error::ErrorDetail))
)]
struct ApiDoc;

/// The document as served at `/v1/openapi.json`.
pub(super) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
