//! The OpenAPI document, generated from the handlers' annotations.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "shortener", description = "Short links, redirects and click analytics."),
    paths(
        super::links::create,
        super::links::info,
        super::links::analytics,
        super::links::analytics_csv,
        super::qr::image,
        super::listing::list,
        super::changes::edit,
        super::changes::delete,
        super::changes::disable,
        super::changes::enable,
        super::audit::list,
        super::challenge::issue,
        super::reports::file,
        super::reports::queue,
        super::reports::resolve,
        super::redirect::follow,
    ),
    components(schemas(super::error::ErrorBody, super::error::ErrorDetail)),
    modifiers(&BearerAuth, &StoreUnavailable),
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// Every operation reads the store, and a store that is away answers 503 `store_unavailable`
/// wherever it is read (`ApiError: From<StoreError>`): listed here once, so new operations get it.
struct StoreUnavailable;

impl Modify for StoreUnavailable {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (_, operation) in service_edge::openapi::operations_mut(openapi) {
            service_edge::openapi::add_error_answer(
                operation,
                "503",
                "`store_unavailable`: the store is away; try again shortly",
            );
        }
    }
}

/// The document as served at `/api/v1/openapi.json`.
pub(super) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
