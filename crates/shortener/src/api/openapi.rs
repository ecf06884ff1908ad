//! The OpenAPI document, generated from the handlers' annotations.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{RefOr, Schema};
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
    modifiers(&BearerAuth, &StoreUnavailable, &Links, &EditRules),
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

/// What a client may call next with a value an answer gave (stateful sequences follow these):
/// a created link's code reaches every operation on a code, a disable its enable, a filed
/// report its resolution.
struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use service_edge::openapi::{LinkValue::Parameter, add_links, operations_on};
        let on_code = operations_on(openapi, "code");
        let code = Parameter("code", "$response.body#/short_code");
        add_links(
            openapi,
            "create",
            "201",
            on_code.iter().map(|op| (op.as_str(), code.clone())),
        );
        add_links(
            openapi,
            "disable",
            "200",
            [("enable", Parameter("code", "$request.path.code"))],
        );
        add_links(
            openapi,
            "file",
            "202",
            [("resolve", Parameter("id", "$response.body#/id"))],
        );
    }
}

/// A PATCH body's rules beyond its fields (see `EditRequest::document_rules`).
struct EditRules;

impl Modify for EditRules {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let schemas = openapi.components.as_mut().map(|c| &mut c.schemas);
        if let Some(RefOr::T(Schema::Object(edit))) = schemas.and_then(|s| s.get_mut("EditRequest"))
        {
            super::changes::EditRequest::document_rules(edit);
        }
    }
}

/// The document as served at `/api/v1/openapi.json`.
pub(super) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
