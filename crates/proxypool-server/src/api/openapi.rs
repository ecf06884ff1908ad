//! The OpenAPI document, generated from the handlers' annotations. The answers every route
//! shares — 401 from the credentials layer, 400/413/415 from the JSON extractor — are added
//! here once, from the layers that produce them, so a new operation gets them too.

use crate::config::DEFAULT_API_MAX_BODY_BYTES;
use service_edge::openapi::{LinkValue, add_error_answer, add_links, operations_mut};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "proxypool",
        description = "A pool of outbound proxies: leases, outcomes, addresses, the address × site matrix. \
            With an auth file every route but /healthz wants HTTP Basic credentials of one of its users."
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
    components(schemas(super::error::ErrorBody, super::error::ErrorDetail)),
    modifiers(&SharedAnswers, &Links)
)]
struct ApiDoc;

/// Paths outside the credentials layer (`require_credentials`).
const OPEN_PATHS: [&str; 1] = ["/healthz"];

struct SharedAnswers;

impl Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "basic",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)),
            );
        for (path, operation) in operations_mut(openapi) {
            if !OPEN_PATHS.contains(&path) {
                // No credentials needed without an auth file, Basic with one.
                operation.security = Some(vec![
                    SecurityRequirement::default(),
                    SecurityRequirement::new("basic", Vec::<String>::new()),
                ]);
                add_error_answer(operation, "401", "credentials required (with an auth file)");
            }
            if operation.request_body.is_some() {
                add_error_answer(operation, "400", "`invalid_body`: not JSON of this shape");
                let too_large = format!(
                    "body over --api-max-body-bytes ({} KiB by default)",
                    DEFAULT_API_MAX_BODY_BYTES / 1024
                );
                add_error_answer(operation, "413", &too_large);
                add_error_answer(operation, "415", "body is not `application/json`");
            }
        }
    }
}

/// What a client may call next with a value an answer gave (stateful sequences follow these):
/// an acquired lease's release, an added address's removal. (Feedback names a gateway
/// session, which no API answer gives.)
struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let lease = serde_json::json!({"lease_id": "$response.body#/lease_id"});
        add_links(
            openapi,
            "acquire",
            "200",
            [("release", LinkValue::Body(lease))],
        );
        add_links(
            openapi,
            "add",
            "201",
            [("remove", LinkValue::Parameter("id", "$response.body#/id"))],
        );
    }
}

/// The document as served at `/v1/openapi.json`.
pub(super) fn document() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    // A reported success needs its latency (feedback has no acquire to time it from): a
    // JSON Schema `if`/`then`, which the derive cannot write.
    if let Some(feedback) = doc.pointer_mut("/components/schemas/FeedbackRequest") {
        feedback["if"] = serde_json::json!({
            "properties": {"outcome": {"const": "success"}},
            "required": ["outcome"],
        });
        feedback["then"] = serde_json::json!({
            "properties": {"latency_ms": {"type": "integer"}},
            "required": ["latency_ms"],
        });
        // A whole report, so that a client (and the fuzz test, which opens this session
        // through the gateway first) has one call that is recorded.
        feedback["example"] = serde_json::json!({
            "session": "alice-session-cart42",
            "site": "example.com",
            "outcome": "success",
            "latency_ms": 120,
        });
    }
    doc
}
