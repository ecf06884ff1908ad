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
    modifiers(&BearerAuth),
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

/// The document as served at `/api/v1/openapi.json`.
pub(super) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
