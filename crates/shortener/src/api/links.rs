//! The links API: create, read metadata, read analytics (changes are in `changes.rs`).

use super::auth::{client_ip, origin, principal, required_principal};
use super::error::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::{App, AppState};
use crate::analytics::{Analytics, link_analytics};
use crate::captcha::Refused;
use crate::new_link;
use crate::ratelimit::{Budget, Creator};
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use service_edge::Integer;
use shortener_core::alias::could_be_code;
use shortener_core::day::{Day, rfc3339};
use shortener_core::link::{DEFAULT_EXPIRES_IN_DAYS, Link};
use shortener_core::people::Dimension;
use shortener_core::store::InsertOutcome;
use shortener_core::token::Principal;
use std::net::SocketAddr;
use utoipa::{IntoParams, ToSchema};

/// A request to shorten a URL.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateLink {
    /// The destination: an absolute http or https URL without credentials, at most 2048
    /// characters (also once normalised). A URL to this service itself or to a blocked domain
    /// answers 400 `invalid_url`. The pattern is the plain spelling (a DNS name, a path);
    /// IP hosts, IDN, percent-encoding and fragments are accepted too.
    #[schema(
        example = "https://example.com/some/long/path",
        max_length = 2048,
        pattern = r"^https?://([A-Za-z0-9]+(-[A-Za-z0-9]+)*\.)*[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?/[A-Za-z0-9._~!$&'()*+,;=:@/-]*(\?[A-Za-z0-9._~!$&()*+,;=:@/?-]*)?$"
    )]
    pub long_url: String,
    /// A code of your choice: 4 to 30 characters of A-Z, a-z, 0-9 and '-'. Reserved words
    /// (`api`, `healthz`, … in any case) and offensive words answer 400 `invalid_alias`.
    #[schema(example = "spring-sale", pattern = "^[A-Za-z0-9-]{4,30}$")]
    pub custom_alias: Option<String>,
    /// Lifetime in days, 1 to 3650 (default 1825).
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 3650, example = 30)]
    pub expires_in_days: Option<Integer>,
    /// A solved CAPTCHA (base64 JSON), instead of the `X-Altcha` header.
    pub altcha: Option<String>,
}

/// A link just created.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CreatedLink {
    pub short_code: String,
    pub short_url: String,
    pub long_url: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// RFC 3339, UTC.
    pub expires_at: String,
}

/// Everything known about a link.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LinkInfo {
    pub short_code: String,
    pub short_url: String,
    pub long_url: String,
    pub created_at: String,
    pub expires_at: String,
    /// `active`, `expired`, `disabled` (410 until enabled) or `deleted` (410 for good).
    pub status: &'static str,
    /// Raised by every change (disable, enable, delete, edit).
    pub version: u64,
    /// Set while the link is disabled.
    pub disabled: Option<DisabledInfo>,
    /// RFC 3339, UTC; set once deleted.
    pub deleted_at: Option<String>,
    pub custom_alias: bool,
    /// The user that created it; absent for anonymous links.
    pub owner: Option<String>,
    /// Clicks by people (eventually consistent).
    pub total_clicks: u64,
    /// Clicks by known bots and link previews.
    pub bot_clicks: u64,
}

/// Why and by whom a link is disabled.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DisabledInfo {
    /// RFC 3339, UTC.
    pub at: String,
    pub reason: String,
    /// A user name, or a system actor (`auto-reports`, `threat-feed`).
    pub by: String,
    /// `user` (the owner: they may enable it again), `admin` or `system` (only an admin may).
    pub by_kind: &'static str,
}

pub(super) fn short_url(app: &App, code: &str) -> String {
    [app.base_url.as_str(), "/", code].concat()
}

fn budget_headers(response: &mut Response, budget: Budget) {
    let headers = response.headers_mut();
    headers.insert("ratelimit-limit", HeaderValue::from(budget.limit));
    headers.insert("ratelimit-remaining", HeaderValue::from(budget.remaining));
}

/// Shorten a URL.
#[utoipa::path(
    post, path = "/api/v1/links", tag = "links",
    request_body = CreateLink,
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Created", body = CreatedLink),
        (status = 400, description = "Invalid URL (`invalid_url`), alias, expiry or body; a destination on a threat feed (`url_blocked`, naming the feed); a replayed, expired, forged or malformed CAPTCHA payload (`captcha_invalid`)", body = ErrorBody),
        (status = 401, description = "Bad token, or a token is required", body = ErrorBody),
        (status = 409, description = "The alias is taken", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
        (status = 428, description = "Anonymous create near its hourly limit (or --captcha always): `captcha_required`, with `challenge`", body = ErrorBody),
        (status = 429, description = "Rate limited; see Retry-After", body = ErrorBody),
        (status = 503, description = "Store unavailable or silent past --store-timeout-ms. A create that timed out may have committed: retrying a custom alias then gives 409, retrying a generated code may make a second link", body = ErrorBody),
    ),
    params(("X-Altcha" = Option<String>, Header, description = "A solved challenge of GET /api/v1/challenge: base64 of {algorithm, challenge, number, salt, signature}")),
)]
pub(super) async fn create(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<ApiJson<CreateLink>, ApiError>,
) -> Result<Response, ApiError> {
    let result = create_inner(&app, peer, &headers, body).await;
    count_create(&app, result.as_ref().err());
    result
}

/// Counts a create's outcome (`None`: created) in the metrics, for the API and the web app.
pub(super) fn count_create(app: &App, error: Option<&ApiError>) {
    app.metrics.count_create(match error {
        None => "created",
        Some(e) => match e.status() {
            StatusCode::CONFLICT => "conflict",
            StatusCode::TOO_MANY_REQUESTS => "rate_limited",
            StatusCode::PRECONDITION_REQUIRED => "captcha_required",
            StatusCode::UNAUTHORIZED => "unauthorized",
            s if s.is_server_error() => "error",
            _ => "invalid",
        },
    });
}

async fn create_inner(
    app: &App,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Result<ApiJson<CreateLink>, ApiError>,
) -> Result<Response, ApiError> {
    let who = principal(app, headers).await?;
    let budget = admit(app, who.as_ref(), client_ip(app, peer, headers)).await?;
    let ApiJson(req) = body?;
    let link = create_link(app, peer, headers, who, budget, req).await?;
    let location = ["/api/v1/links/", &link.code].concat();
    let created = CreatedLink {
        short_url: short_url(app, &link.code),
        short_code: link.code,
        long_url: link.long_url,
        created_at: rfc3339(link.created_at),
        expires_at: rfc3339(link.expires_at),
    };
    let mut response = (StatusCode::CREATED, axum::Json(created)).into_response();
    if let Ok(location) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if let Some(budget) = budget {
        budget_headers(&mut response, budget);
    }
    Ok(response)
}

/// Whether `who` (`None`: anonymous, from `ip`) may create now: takes one create from their
/// hourly budget (admins have none) and says what is left.
pub(super) async fn admit(
    app: &App,
    who: Option<&Principal>,
    ip: std::net::IpAddr,
) -> Result<Option<Budget>, ApiError> {
    if who.is_none() && app.no_anonymous {
        return Err(ApiError::unauthorized(
            "authentication_required",
            "anonymous link creation is disabled; send a bearer token",
        ));
    }
    match who {
        Some(Principal { admin: true, .. }) => None,
        Some(p) => Some(app.limits.check(Creator::User(&p.user)).await),
        None => Some(app.limits.check(Creator::Anonymous(ip)).await),
    }
    .transpose()
    .map_err(|refused| ApiError::rate_limited(refused.retry_after.as_secs().max(1)))
}

/// Creates the link `req` asks for on behalf of `who`, admitted with `budget` left: the
/// CAPTCHA when it is due, validation, the store, the caches. The API and the web app both
/// create through here.
pub(super) async fn create_link(
    app: &App,
    peer: SocketAddr,
    headers: &HeaderMap,
    who: Option<Principal>,
    budget: Option<Budget>,
    req: CreateLink,
) -> Result<Link, ApiError> {
    let ip = client_ip(app, peer, headers);
    if who.is_none() && app.captcha.required(budget) {
        let payload = headers
            .get("x-altcha")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| req.altcha.clone());
        let Some(payload) = payload else {
            let challenge =
                super::challenge::ChallengeJson::from(app.captcha.challenge(crate::now()));
            return Err(ApiError::captcha_required(
                serde_json::to_value(challenge).unwrap_or_default(),
            ));
        };
        app.captcha
            .check(&payload, crate::now())
            .await
            .map_err(|refused| match refused {
                Refused::Invalid(m) => ApiError::bad_request("captcha_invalid", m),
                Refused::Store(e) => e.into(),
            })?;
    }
    let long_url = checked_destination(app, &req.long_url)?;
    if let Some(alias) = &req.custom_alias {
        new_link::alias(alias)?;
    }
    let now = crate::now();
    let expires_at = new_link::expiry_in_days(
        now,
        req.expires_in_days
            .map_or(i64::from(DEFAULT_EXPIRES_IN_DAYS), |d| d.0),
    )?;
    let origin = origin(app, peer, headers, who.as_ref());
    let mut link = Link {
        owner_admin: who.as_ref().is_some_and(|p| p.admin),
        owner: who.map(|p| p.user),
        custom_alias: req.custom_alias.is_some(),
        // The origin's, formatted once: an address's `Display` costs over a thousand instructions.
        created_ip: origin.ip.clone(),
        ..Link::new("", &long_url, now, expires_at)
    };
    let link = match req.custom_alias {
        Some(alias) => {
            link.code = alias;
            match app.store.insert_link(&link, &origin).await? {
                InsertOutcome::Inserted => link,
                InsertOutcome::CodeTaken => {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "alias_taken",
                        format!("the alias {:?} is already taken", link.code),
                    ));
                }
            }
        }
        None => {
            app.allocator
                .insert_generated(link, &origin, || {
                    app.metrics.generated_code_skips.inc();
                })
                .await?
        }
    };
    app.cache.written(&link).await;
    tracing::info!(
        code = %link.code, owner = link.owner.as_deref().unwrap_or("-"), ip = %ip,
        "link created"
    );
    Ok(link)
}

/// A destination as a create or an edit accepts it (normalised), or 400 `invalid_url` /
/// `url_blocked`.
pub(super) fn checked_destination(app: &App, raw: &str) -> Result<String, ApiError> {
    Ok(new_link::destination(
        &app.policy,
        &app.threats.get().feeds,
        raw,
    )?)
}

/// What the API shows of a link.
pub(super) fn link_info(app: &App, link: Link) -> LinkInfo {
    LinkInfo {
        short_url: short_url(app, &link.code),
        status: link.status(crate::now()).as_str(),
        version: link.version,
        disabled: link.disabled.map(|d| DisabledInfo {
            at: rfc3339(d.at),
            reason: d.reason,
            by: d.by,
            by_kind: d.by_kind.as_str(),
        }),
        deleted_at: link.deleted_at.map(rfc3339),
        created_at: rfc3339(link.created_at),
        expires_at: rfc3339(link.expires_at),
        custom_alias: link.custom_alias,
        total_clicks: link.clicks,
        bot_clicks: link.bot_clicks,
        short_code: link.code,
        long_url: link.long_url,
        owner: link.owner,
    }
}

/// The link if it exists and `who` may see it; 404 otherwise, so that a token cannot probe
/// for other users' links.
pub(super) async fn visible_link(app: &App, code: &str, who: &Principal) -> Result<Link, ApiError> {
    if !could_be_code(code) {
        return Err(ApiError::not_found());
    }
    match app.store.get_link(code).await? {
        Some(link) if link.visible_to(who) => Ok(link),
        _ => Err(ApiError::not_found()),
    }
}

/// Metadata of a link (its owner or an admin).
#[utoipa::path(
    get, path = "/api/v1/links/{code}", tag = "links",
    params(("code" = String, Path, description = "Short code or alias")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The link, in every state: also after DELETE (`status: deleted`, `deleted_at` set) and while disabled", body = LinkInfo),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 503, description = "Store unavailable or silent past --store-timeout-ms", body = ErrorBody),
    )
)]
pub(super) async fn info(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<axum::Json<LinkInfo>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let link = visible_link(&app, &code, &who).await?;
    Ok(axum::Json(link_info(&app, link)))
}

/// The query string of the analytics; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AnalyticsParams {
    /// Breakdowns to add, comma-separated: `referrers`, `browsers`, `os`, `devices`,
    /// `countries` (only with `--geoip`).
    #[param(
        pattern = "^(referrers|browsers|os|devices|countries)(,(referrers|browsers|os|devices|countries))*$"
    )]
    breakdown: Option<String>,
}

impl AnalyticsParams {
    /// The breakdowns asked for, each once; 400 for an unknown one, or `countries` without
    /// a country database.
    fn breakdowns(&self, app: &App) -> Result<Vec<Dimension>, ApiError> {
        let mut out = Vec::new();
        for name in self.breakdown.iter().flat_map(|b| b.split(',')) {
            let dimension = Dimension::parse(name).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_query",
                    format!(
                        "unknown breakdown {name:?}: use referrers, browsers, os, devices or countries"
                    ),
                )
            })?;
            if dimension == Dimension::Countries && !app.countries {
                return Err(ApiError::bad_request(
                    "breakdown_unavailable",
                    "the countries breakdown needs a country database (--geoip) on the server",
                ));
            }
            if !out.contains(&dimension) {
                out.push(dimension);
            }
        }
        Ok(out)
    }
}

/// Click analytics of a link (its owner or an admin): the last 30 days with unique
/// visitors, and the breakdowns asked for, each merged over the 30 days.
#[utoipa::path(
    get, path = "/api/v1/links/{code}/analytics", tag = "links",
    params(("code" = String, Path, description = "Short code or alias"), AnalyticsParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Totals, the last 30 days and the breakdowns asked for (top 20 values over the window and `other`; people only)", body = Analytics),
        (status = 400, description = "Unknown parameter or breakdown (`invalid_query`); `countries` on a server without --geoip (`breakdown_unavailable`)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 503, description = "Store unavailable or silent past --store-timeout-ms", body = ErrorBody),
    )
)]
pub(super) async fn analytics(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
    params: Result<Query<AnalyticsParams>, QueryRejection>,
) -> Result<axum::Json<Analytics>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let Query(params) =
        params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let breakdowns = params.breakdowns(&app)?;
    let link = visible_link(&app, &code, &who).await?;
    let today = Day::from_unix(crate::now());
    Ok(axum::Json(
        link_analytics(app.store.as_ref(), &link, today, &breakdowns).await?,
    ))
}

/// The last 30 days of a link as CSV (its owner or an admin).
#[utoipa::path(
    get, path = "/api/v1/links/{code}/analytics.csv", tag = "links",
    params(("code" = String, Path, description = "Short code or alias")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "`date,clicks,bot_clicks,unique_visitors`, one row per UTC day, oldest first, zero-filled", content_type = "text/csv", body = String),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 503, description = "Store unavailable or silent past --store-timeout-ms", body = ErrorBody),
    )
)]
pub(super) async fn analytics_csv(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let link = visible_link(&app, &code, &who).await?;
    let today = Day::from_unix(crate::now());
    let analytics = link_analytics(app.store.as_ref(), &link, today, &[]).await?;
    Ok(csv_download(&analytics))
}

/// The analytics as a CSV download: what the API and the web app's download serve.
pub(super) fn csv_download(analytics: &Analytics) -> Response {
    let disposition = format!(
        "attachment; filename=\"{}-analytics.csv\"",
        analytics.short_code
    );
    let mut response = analytics.to_csv().into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    // Codes are [A-Za-z0-9-]: always a valid header value.
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}
