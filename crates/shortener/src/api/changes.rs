//! Changes of a link's state: disable, enable, delete, edit. Each is one store transaction with
//! its audit row and change note; then this instance's caches and, in the scale-out mode,
//! every other instance hear of it.

use super::auth::{origin, required_principal};
use super::error::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::links::{LinkInfo, checked_destination, link_info};
use super::{App, AppState};
use crate::new_link;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::json;
use service_edge::Integer;
use shortener_core::alias::could_be_code;
use shortener_core::audit::Origin;
use shortener_core::day::UnixSeconds;
use shortener_core::link::{Link, LinkChange, MAX_REASON_CHARS, Refusal};
use shortener_core::store::ChangeOutcome;
use std::net::SocketAddr;
use utoipa::ToSchema;
use utoipa::openapi::schema::Object;

/// Why a link is disabled.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DisableRequest {
    /// 1 to 500 characters; shown in the link's metadata and the audit trail.
    #[schema(
        example = "phishing page reported by abuse@example.net",
        max_length = 500,
        pattern = r"[^ \t\n\r\f\u000b]"
    )]
    pub reason: String,
}

/// An admin's free text (a disable's reason, a report's resolution) trimmed of ASCII
/// whitespace, if it has another character and at most `max` characters: what the schemas'
/// pattern `[^ \t\n\r\f\u000b]` states (Unicode's other spaces differ between regex
/// dialects, so they count as text).
pub(super) fn admin_text(text: &str, max: usize) -> Option<&str> {
    let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\u{b}');
    (!trimmed.is_empty() && text.chars().count() <= max).then_some(trimmed)
}

/// Checks a disable reason (API and CLI alike).
pub(crate) fn check_reason(reason: &str) -> Result<&str, String> {
    admin_text(reason, MAX_REASON_CHARS)
        .ok_or_else(|| format!("reason must be 1 to {MAX_REASON_CHARS} characters"))
}

/// The disable a reason asks for, or 400 `invalid_reason`.
pub(super) fn disable_change(reason: &str) -> Result<LinkChange, ApiError> {
    let reason = check_reason(reason).map_err(|m| ApiError::bad_request("invalid_reason", m))?;
    Ok(LinkChange::Disable {
        reason: reason.to_owned(),
    })
}

/// Applies `change` for `origin` and tells the caches; the link as it now is.
pub(super) async fn apply(
    app: &App,
    code: &str,
    change: &LinkChange,
    origin: &Origin,
) -> Result<Link, ApiError> {
    if !could_be_code(code) {
        return Err(ApiError::not_found());
    }
    match app
        .store
        .change_link(code, change, origin, crate::now())
        .await?
    {
        ChangeOutcome::Changed { after, .. } => {
            app.cache.written(&after).await;
            tracing::info!(code, by = %origin.actor.name, version = after.version, ?change, "link changed");
            Ok(after)
        }
        ChangeOutcome::Unchanged(link) => Ok(link),
        ChangeOutcome::Refused(Refusal::NotFound) => Err(ApiError::not_found()),
        ChangeOutcome::Refused(refusal @ Refusal::Forbidden) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            refusal.to_string(),
        )),
        ChangeOutcome::Refused(refusal @ Refusal::Deleted) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "link_deleted",
            refusal.to_string(),
        )),
    }
}

/// Delete a link (its owner or an admin): 410 for good, never enabled again, its code never
/// reused.
#[utoipa::path(
    delete, path = "/api/v1/links/{code}", tag = "links",
    params(("code" = String, Path, description = "Short code or alias")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deleted (also when it already was)"),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn delete(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let origin = origin(&app, peer, &headers, Some(&who));
    apply(&app, &code, &LinkChange::Delete, &origin).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Disable a link (its owner or an admin): 410 on every instance within about a second,
/// until enabled.
#[utoipa::path(
    post, path = "/api/v1/links/{code}/disable", tag = "links",
    params(("code" = String, Path, description = "Short code or alias")),
    request_body = DisableRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Disabled (also when it already was: the first reason stays)", body = LinkInfo),
        (status = 400, description = "Missing or too long reason, or a bad body", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 409, description = "The link is deleted (`link_deleted`)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn disable(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
    body: Result<ApiJson<DisableRequest>, ApiError>,
) -> Result<axum::Json<LinkInfo>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let ApiJson(req) = body?;
    let change = disable_change(&req.reason)?;
    let origin = origin(&app, peer, &headers, Some(&who));
    let link = apply(&app, &code, &change, &origin).await?;
    Ok(axum::Json(link_info(&app, link)))
}

/// Enable a disabled link: admins always, the owner only a link they disabled themselves.
#[utoipa::path(
    post, path = "/api/v1/links/{code}/enable", tag = "links",
    params(("code" = String, Path, description = "Short code or alias")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Enabled (also when it was not disabled)", body = LinkInfo),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The owner may not enable a link an admin or the system disabled", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 409, description = "The link is deleted (`link_deleted`)", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn enable(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<axum::Json<LinkInfo>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let origin = origin(&app, peer, &headers, Some(&who));
    let link = apply(&app, &code, &LinkChange::Enable, &origin).await?;
    Ok(axum::Json(link_info(&app, link)))
}

/// What to change of a link: at least one field; `expires_at` and `expires_in_days` exclude
/// each other.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EditRequest {
    /// The new destination, validated like a create's (threat feeds included; see
    /// `long_url` of a create for what the pattern leaves out).
    #[schema(
        example = "https://example.com/new/path",
        max_length = 2048,
        pattern = r"^https?://([A-Za-z0-9]+(-[A-Za-z0-9]+)*\.)*[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?/[A-Za-z0-9._~!$&'()*+,;=:@/-]*(\?[A-Za-z0-9._~!$&()*+,;=:@/?-]*)?$"
    )]
    pub long_url: Option<String>,
    /// The new expiry, RFC 3339, in the future and at most 3650 days away (else 422).
    #[schema(example = "2027-06-01T00:00:00Z", format = DateTime)]
    pub expires_at: Option<String>,
    /// The new lifetime, 1 to 3650 days counted from now.
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 3650, example = 30)]
    pub expires_in_days: Option<Integer>,
}

impl EditRequest {
    /// The rules of `change` beyond the fields' own, in the body's schema: a field that is not
    /// null, and not both expiry fields. (Through the extensions: utoipa 5.5 has no `not`, and
    /// writes `min_properties` as `maxProperties`.)
    pub(super) fn document_rules(schema: &mut Object) {
        let given = |field: &str, kind: &str| json!({"required": [field], "properties": {field: {"type": kind}}});
        let both = json!({
            "required": ["expires_at", "expires_in_days"],
            "properties": {"expires_at": {"type": "string"}, "expires_in_days": {"type": "integer"}},
        });
        let rules = [
            (
                "anyOf",
                json!([
                    given("long_url", "string"),
                    given("expires_at", "string"),
                    given("expires_in_days", "integer"),
                ]),
            ),
            ("not", both),
        ];
        schema
            .extensions
            .get_or_insert_with(Default::default)
            .extend(rules.map(|(k, v)| (k.to_owned(), v)));
    }

    /// The change this request asks for at `now`, or why it is refused.
    pub(super) fn change(&self, app: &App, now: UnixSeconds) -> Result<LinkChange, ApiError> {
        let expires_at = match (&self.expires_at, self.expires_in_days) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "invalid_expiry",
                    "send expires_at or expires_in_days, not both",
                ));
            }
            (Some(at), None) => Some(new_link::expiry_at(now, at)?),
            (None, Some(days)) => Some(new_link::expiry_in_days(now, days.0)?),
            (None, None) => None,
        };
        let long_url = self
            .long_url
            .as_deref()
            .map(|raw| checked_destination(app, raw))
            .transpose()?;
        if long_url.is_none() && expires_at.is_none() {
            return Err(ApiError::bad_request(
                "invalid_body",
                "nothing to change: send long_url, expires_at or expires_in_days",
            ));
        }
        Ok(LinkChange::Edit {
            long_url,
            expires_at,
        })
    }
}

/// Edit a link's destination or expiry (its owner or an admin): every instance redirects to
/// the new destination within about a second.
#[utoipa::path(
    patch, path = "/api/v1/links/{code}", tag = "links", operation_id = "edit_link",
    params(("code" = String, Path, description = "Short code or alias")),
    request_body = EditRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Edited (also when it changed nothing)", body = LinkInfo),
        (status = 400, description = "An empty body or unknown field (`invalid_body`), an invalid destination (`invalid_url`) or one on a threat feed (`url_blocked`), an expiry off its schema or both expiry fields (`invalid_expiry`)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 409, description = "The link is deleted (`link_deleted`)", body = ErrorBody),
        (status = 422, description = "`expires_at` is an RFC 3339 instant, but not in the future or more than 3650 days away (`invalid_expiry`): a bound that moves with the clock, so no schema states it", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn edit(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
    body: Result<ApiJson<EditRequest>, ApiError>,
) -> Result<axum::Json<LinkInfo>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let ApiJson(req) = body?;
    let change = req.change(&app, crate::now())?;
    let origin = origin(&app, peer, &headers, Some(&who));
    let link = apply(&app, &code, &change, &origin).await?;
    Ok(axum::Json(link_info(&app, link)))
}

#[cfg(test)]
mod admin_text_tests {
    use super::admin_text;

    #[test]
    fn blank_is_ascii_whitespace_only_as_the_schemas_pattern_says() {
        assert_eq!(admin_text(" \t\n\r\u{c}\u{b}", 500), None);
        assert_eq!(admin_text("  spam  ", 500), Some("spam"));
        // U+0085 is whitespace to Rust but not to the pattern's dialects: it is text.
        assert_eq!(admin_text("\u{85}\u{85}", 500), Some("\u{85}\u{85}"));
        assert_eq!(admin_text(&"x".repeat(501), 500), None);
        assert_eq!(admin_text(&"x".repeat(500), 500).map(str::len), Some(500));
    }
}
