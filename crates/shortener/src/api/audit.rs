//! `GET /api/v1/audit`: the audit trail for admins, newest first, a page at a time. The
//! rows' JSON and the filters' parsing are shared with `shortener audit`.

use super::auth::required_principal;
use super::error::{ApiError, ErrorBody};
use super::{App, AppState};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use shortener_core::audit::{AuditAction, AuditQuery, AuditRow, MAX_PAGE};
use shortener_core::day::{parse_rfc3339, rfc3339};
use utoipa::{IntoParams, ToSchema};

/// Rows per page unless `limit` says otherwise.
const DEFAULT_PAGE: usize = 100;

/// One row of the audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditEntry {
    /// RFC 3339, UTC.
    pub at: String,
    /// A user name, `anonymous`, `cli`, or a system actor (`auto-reports`, `threat-feed`).
    pub actor: String,
    /// `created`, `edited`, `disabled`, `enabled`, `deleted`, `reported`, `token_issued`,
    /// `token_revoked`.
    pub action: &'static str,
    pub code: Option<String>,
    pub ip: Option<String>,
    pub user_agent: Option<String>,
    /// The destination before the change (or at the time of it).
    pub old_url: Option<String>,
    /// The destination after a create or an edit.
    pub new_url: Option<String>,
    /// The reason of a disable, the category of a report, the token's holder.
    pub detail: Option<String>,
}

impl AuditEntry {
    pub(crate) fn of(row: AuditRow) -> Self {
        let r = row.record;
        Self {
            at: rfc3339(r.at),
            actor: r.actor,
            action: r.action.as_str(),
            code: r.code,
            ip: r.ip,
            user_agent: r.user_agent,
            old_url: r.old_url,
            new_url: r.new_url,
            detail: r.detail,
        }
    }

    /// One line of text for the CLI.
    pub(crate) fn line(&self) -> String {
        let mut line = format!("{}  {:<12}  {}", self.at, self.action, self.actor);
        for (name, value) in [
            ("code", &self.code),
            ("ip", &self.ip),
            ("old", &self.old_url),
            ("new", &self.new_url),
            ("detail", &self.detail),
        ] {
            if let Some(value) = value {
                line.push_str(&format!("  {name}={value:?}"));
            }
        }
        line
    }
}

/// A page of the audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// The filters of the trail, as text (query string or CLI flags).
#[derive(Debug, Default)]
pub(crate) struct AuditFilter {
    /// Only this link.
    pub code: Option<String>,
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// From this instant on, RFC 3339.
    pub since: Option<String>,
    /// Before this instant, RFC 3339.
    pub until: Option<String>,
}

impl AuditFilter {
    /// The store query these filters mean, or what is wrong with them.
    pub(crate) fn query(&self) -> Result<AuditQuery, String> {
        let instant = |name: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    parse_rfc3339(v).ok_or_else(|| {
                        format!("{name} must be an RFC 3339 instant such as 2026-12-01T00:00:00Z")
                    })
                })
                .transpose()
        };
        let action = self
            .action
            .as_deref()
            .map(|a| {
                AuditAction::parse(a).ok_or_else(|| {
                    let names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
                    format!("action must be one of {}", names.join(", "))
                })
            })
            .transpose()?;
        Ok(AuditQuery {
            code: self.code.clone(),
            actor: self.actor.clone(),
            action,
            since: instant("since", &self.since)?,
            until: instant("until", &self.until)?,
            before: None,
            limit: DEFAULT_PAGE,
        })
    }
}

/// The query string of `GET /api/v1/audit`; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditParams {
    /// Only this link.
    pub(super) code: Option<String>,
    /// Only this actor (a user, `anonymous`, `cli`, `auto-reports`, `threat-feed`).
    pub(super) actor: Option<String>,
    /// Only this action: `created`, `edited`, `disabled`, `enabled`, `deleted`, `reported`,
    /// `token_issued`, `token_revoked`.
    #[param(
        pattern = "^(created|edited|disabled|enabled|deleted|reported|token_issued|token_revoked)$"
    )]
    pub(super) action: Option<String>,
    /// From this instant on (inclusive), RFC 3339.
    #[param(format = DateTime)]
    pub(super) since: Option<String>,
    /// Before this instant (exclusive), RFC 3339.
    #[param(format = DateTime)]
    pub(super) until: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub(super) cursor: Option<String>,
    /// Rows per page (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub(super) limit: Option<String>,
}

pub(super) fn encode_cursor(id: i64) -> String {
    URL_SAFE_NO_PAD.encode(id.to_be_bytes())
}

pub(super) fn decode_cursor(cursor: &str) -> Option<i64> {
    let bytes: [u8; 8] = URL_SAFE_NO_PAD.decode(cursor).ok()?.try_into().ok()?;
    Some(i64::from_be_bytes(bytes))
}

/// The audit trail (admins): every change, newest first.
#[utoipa::path(
    get, path = "/api/v1/audit", tag = "audit",
    params(AuditParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of the trail", body = AuditPage),
        (status = 400, description = "Unknown parameter or action, a time that is not RFC 3339, a bad cursor, limit outside 1-500", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "Not an admin token", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn list(
    State(app): State<AppState>,
    headers: HeaderMap,
    params: Result<Query<AuditParams>, QueryRejection>,
) -> Result<axum::Json<AuditPage>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    if !who.admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the audit trail is for admin tokens",
        ));
    }
    let Query(p) = params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    Ok(axum::Json(page(&app, p).await?))
}

/// The page of the trail `p` asks for (the API's and the web app's).
pub(super) async fn page(app: &App, p: AuditParams) -> Result<AuditPage, ApiError> {
    let filter = AuditFilter {
        code: p.code,
        actor: p.actor,
        action: p.action,
        since: p.since,
        until: p.until,
    };
    let mut query = filter
        .query()
        .map_err(|m| ApiError::bad_request("invalid_query", m))?;
    query.limit = match p.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_PAGE,
        Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("limit must be between 1 and {MAX_PAGE}"),
            ));
        }
    };
    query.before = p
        .cursor
        .as_deref()
        .map(|c| {
            decode_cursor(c).ok_or_else(|| {
                ApiError::bad_request("invalid_cursor", "cursor is not one this API gave out")
            })
        })
        .transpose()?;
    let rows = app.store.audit(&query).await?;
    let next_cursor = (rows.len() == query.limit)
        .then(|| rows.last().map(|r| encode_cursor(r.id)))
        .flatten();
    Ok(AuditPage {
        entries: rows.into_iter().map(AuditEntry::of).collect(),
        next_cursor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        for id in [0, 1, 1 << 40, i64::MAX] {
            assert_eq!(decode_cursor(&encode_cursor(id)), Some(id));
        }
        for bad in ["", "abc", "!!!!", "AAAAAAAAAAAAAAAA"] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
    }
}
