//! Abuse reports: anyone files one (rate limited per client IP); reports from enough
//! distinct addresses disable the link pending review; admins read the queue and resolve.

use super::audit::{decode_cursor, encode_cursor};
use super::auth::{client_ip, origin, principal, required_principal};
use super::error::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::{App, AppState};
use crate::ratelimit::Creator;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use shortener_core::alias::could_be_code;
use shortener_core::audit::MAX_PAGE;
use shortener_core::day::rfc3339;
use shortener_core::report::{
    Category, MAX_COMMENT_CHARS, MAX_RESOLUTION_CHARS, NewReport, Report, ReportOutcome,
    ReportQuery, Resolution, ResolveOutcome,
};
use std::net::SocketAddr;
use utoipa::{IntoParams, ToSchema};

/// A report on a link.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReportRequest {
    /// `phishing`, `malware`, `spam` or `other`.
    #[schema(example = "phishing", pattern = "^(phishing|malware|spam|other)$")]
    pub category: String,
    /// Up to 1000 characters.
    #[schema(max_length = 1000)]
    pub comment: Option<String>,
}

/// A report received.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ReportReceived {
    pub id: i64,
    /// Always `received`.
    pub status: &'static str,
}

/// A report in the queue, with the state of its link.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ReportInfo {
    pub id: i64,
    pub code: String,
    /// RFC 3339, UTC.
    pub at: String,
    pub category: &'static str,
    pub comment: Option<String>,
    /// The reporter's address.
    pub ip: String,
    /// `open` or `resolved`.
    pub status: &'static str,
    pub resolution: Option<String>,
    pub resolved_by: Option<String>,
    pub resolved_at: Option<String>,
    /// `active`, `disabled` or `deleted` (expiry is not considered here).
    pub link_status: &'static str,
    /// Why the link is disabled, if it is (`pending review: …` for automatic disables).
    pub link_disabled_reason: Option<String>,
    /// Who disabled it: a user, an admin, `auto-reports`, `threat-feed`.
    pub link_disabled_by: Option<String>,
}

impl ReportInfo {
    fn of(report: Report) -> Self {
        let link_status = if report.link_deleted {
            "deleted"
        } else if report.link_disabled.is_some() {
            "disabled"
        } else {
            "active"
        };
        let resolution = report.resolution;
        Self {
            id: report.id,
            code: report.filed.code,
            at: rfc3339(report.filed.at),
            category: report.filed.category.as_str(),
            comment: report.filed.comment,
            ip: report.filed.ip,
            status: if resolution.is_some() {
                "resolved"
            } else {
                "open"
            },
            resolved_at: resolution.as_ref().map(|r| rfc3339(r.at)),
            resolved_by: resolution.as_ref().map(|r| r.by.clone()),
            resolution: resolution.map(|r| r.text),
            link_status,
            link_disabled_reason: report.link_disabled.as_ref().map(|d| d.reason.clone()),
            link_disabled_by: report.link_disabled.map(|d| d.by),
        }
    }
}

/// A page of the queue.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ReportPage {
    /// Newest first.
    pub reports: Vec<ReportInfo>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// The query string of `GET /api/v1/reports`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ReportParams {
    /// `open` (default) or `resolved`.
    #[param(pattern = "^(open|resolved)$")]
    pub(super) status: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$")]
    pub(super) cursor: Option<String>,
    /// Reports per page (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub(super) limit: Option<String>,
}

/// How an admin closes a report.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolveRequest {
    /// 1 to 500 characters: what was decided.
    #[schema(
        example = "confirmed phishing; link stays disabled",
        max_length = 500,
        pattern = r"[^ \t\n\r\f\u000b]"
    )]
    pub resolution: String,
}

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

/// Report a link as abusive (anyone; rate limited per client IP).
#[utoipa::path(
    post, path = "/api/v1/links/{code}/reports", tag = "reports",
    params(("code" = String, Path, description = "Short code or alias")),
    request_body = ReportRequest,
    security((), ("bearer" = [])),
    responses(
        (status = 202, description = "Received", body = ReportReceived),
        (status = 400, description = "Unknown category (`invalid_category`), comment over 1000 characters (`invalid_comment`), or a bad body", body = ErrorBody),
        (status = 401, description = "A token was sent and is not valid", body = ErrorBody),
        (status = 404, description = "Unknown link", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
        (status = 429, description = "Too many reports from this address; see Retry-After", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn file(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
    body: Result<ApiJson<ReportRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let who = principal(&app, &headers).await?;
    let ApiJson(req) = body?;
    let category = Category::parse(&req.category).ok_or_else(|| {
        bad(
            "invalid_category",
            "category must be one of phishing, malware, spam, other",
        )
    })?;
    if req
        .comment
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_COMMENT_CHARS)
    {
        return Err(bad(
            "invalid_comment",
            format!("comment must be at most {MAX_COMMENT_CHARS} characters"),
        ));
    }
    if !could_be_code(&code) {
        return Err(ApiError::not_found());
    }
    let ip = client_ip(&app, peer, &headers);
    app.limits
        .check(Creator::Reporter(ip))
        .await
        .map_err(|refused| ApiError::rate_limited(refused.retry_after.as_secs().max(1)))?;
    let Some(link) = app.store.get_link(&code).await? else {
        return Err(ApiError::not_found());
    };
    let trusted = url::Url::parse(&link.long_url)
        .ok()
        .and_then(|u| u.host_str().map(|h| app.trusted_domains.get().blocks(h)))
        .unwrap_or(false);
    let report = NewReport {
        code: link.code,
        at: crate::now(),
        ip: ip.to_string(),
        category,
        comment: req.comment.filter(|c| !c.trim().is_empty()),
    };
    let origin = origin(&app, peer, &headers, who.as_ref());
    let auto = (!trusted).then_some(app.auto_disable);
    match app.store.insert_report(&report, &origin, auto).await? {
        ReportOutcome::NotFound => Err(ApiError::not_found()),
        ReportOutcome::Filed { id, disabled } => {
            if let Some(link) = disabled {
                app.cache.written(&link).await;
                app.metrics.auto_disabled.inc();
                tracing::info!(code = %link.code, "link disabled automatically after reports");
            }
            let received = ReportReceived {
                id,
                status: "received",
            };
            Ok((StatusCode::ACCEPTED, axum::Json(received)).into_response())
        }
    }
}

async fn admin(app: &App, headers: &HeaderMap) -> Result<String, ApiError> {
    let who = required_principal(app, headers).await?;
    if !who.admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this is for admin tokens",
        ));
    }
    Ok(who.user)
}

/// The report queue (admins), newest first; automatically disabled links show there with
/// their `pending review` reason.
#[utoipa::path(
    get, path = "/api/v1/reports", tag = "reports",
    params(ReportParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of the queue", body = ReportPage),
        (status = 400, description = "Unknown parameter or status, bad cursor, limit outside 1-500", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "Not an admin token", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn queue(
    State(app): State<AppState>,
    headers: HeaderMap,
    params: Result<Query<ReportParams>, QueryRejection>,
) -> Result<axum::Json<ReportPage>, ApiError> {
    admin(&app, &headers).await?;
    let Query(p) = params.map_err(|e| bad("invalid_query", e.body_text()))?;
    Ok(axum::Json(queue_page(&app, p).await?))
}

/// The page of the queue `p` asks for (the API's and the web app's).
pub(super) async fn queue_page(app: &App, p: ReportParams) -> Result<ReportPage, ApiError> {
    let open = match p.status.as_deref() {
        None | Some("open") => true,
        Some("resolved") => false,
        Some(_) => return Err(bad("invalid_query", "status must be open or resolved")),
    };
    let limit = match p.limit.as_deref().map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(bad(
                "invalid_query",
                format!("limit must be between 1 and {MAX_PAGE}"),
            ));
        }
    };
    let before = p
        .cursor
        .as_deref()
        .map(|c| {
            decode_cursor(c)
                .ok_or_else(|| bad("invalid_cursor", "cursor is not one this API gave out"))
        })
        .transpose()?;
    let reports = app
        .store
        .reports(&ReportQuery {
            open,
            before,
            limit,
        })
        .await?;
    let next_cursor = (reports.len() == limit)
        .then(|| reports.last().map(|r| encode_cursor(r.id)))
        .flatten();
    Ok(ReportPage {
        reports: reports.into_iter().map(ReportInfo::of).collect(),
        next_cursor,
    })
}

/// Resolve a report (admins). Enabling or keeping the link disabled is a separate call.
#[utoipa::path(
    post, path = "/api/v1/reports/{id}/resolve", tag = "reports",
    params(("id" = i64, Path, description = "The report's id")),
    request_body = ResolveRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Resolved", body = ReportInfo),
        (status = 400, description = "Missing or too long resolution, or a bad body", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "Not an admin token", body = ErrorBody),
        (status = 404, description = "No such report", body = ErrorBody),
        (status = 409, description = "Already resolved (`already_resolved`)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn resolve(
    State(app): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<ApiJson<ResolveRequest>, ApiError>,
) -> Result<axum::Json<ReportInfo>, ApiError> {
    let by = admin(&app, &headers).await?;
    let ApiJson(req) = body?;
    Ok(axum::Json(
        resolve_as(&app, by, &id, &req.resolution).await?,
    ))
}

/// Resolves report `id` as admin `by` (the API's and the web app's).
pub(super) async fn resolve_as(
    app: &App,
    by: String,
    id: &str,
    resolution: &str,
) -> Result<ReportInfo, ApiError> {
    let Some(text) = super::changes::admin_text(resolution, MAX_RESOLUTION_CHARS) else {
        return Err(bad(
            "invalid_resolution",
            format!("resolution must be 1 to {MAX_RESOLUTION_CHARS} characters"),
        ));
    };
    let Ok(id) = id.parse::<i64>() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such report",
        ));
    };
    let resolution = Resolution {
        at: crate::now(),
        by,
        text: text.to_owned(),
    };
    match app.store.resolve_report(id, &resolution).await? {
        ResolveOutcome::Resolved(report) => Ok(ReportInfo::of(report)),
        ResolveOutcome::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such report",
        )),
        ResolveOutcome::AlreadyResolved(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_resolved",
            "the report is already resolved",
        )),
    }
}
