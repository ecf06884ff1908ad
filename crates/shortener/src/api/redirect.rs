//! `GET|HEAD /{code}`: the hot path.
//!
//! [`answer`] is the one implementation. The server calls it straight from its hyper service
//! for every `GET`/`HEAD` of a single path segment (see `server.rs`), so that a redirect does
//! not pay for the router; the axum route below calls the same function for the rest (it
//! exists for the OpenAPI document and the 405 on other methods). A cache hit allocates
//! nothing of ours: the code is a slice of the request path, the `Location` value is a
//! reference-counted clone from the cache entry, the click event's code an inline copy, and
//! bodies are static.

use super::App;
use super::AppState;
use super::error::{DELETED_BODY, EXPIRED_BODY, GONE_BODY, NOT_FOUND_BODY};
use crate::cache::CachedLink;
use crate::clicks::ClickEvent;
use crate::scaleout::l2::Gone;
use crate::visits::Visit;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::Full;
use shortener_core::alias::could_be_code;
use shortener_core::store::StoreError;
use std::cell::Cell;
use std::net::SocketAddr;
use std::time::Instant;

/// One redirect in this many (per worker thread) is timed for the latency histogram: the two
/// precise clock reads cost a cache hit more than its lookup, and an even sample keeps the
/// quantiles. Outcomes are counted for every redirect all the same.
pub(crate) const TIMED_ONE_IN: u32 = 16;

/// Follow a short link: 302 to its destination.
#[utoipa::path(
    get, path = "/{code}", tag = "redirect",
    params(("code" = String, Path, description = "Short code or alias")),
    responses(
        (status = 302, description = "Redirect; the destination is in Location"),
        (status = 301, description = "Redirect with --edge-status 301 (always with Cache-Control: public, max-age)"),
        (status = 303, description = "`/_`: the web app, at `/_/` (`_` is outside the alias alphabet, so no link has that code)"),
        (status = 404, description = "Unknown or expired", body = super::error::ErrorBody),
        (status = 410, description = "Disabled (`gone`, until enabled) or deleted (also `gone`)", body = super::error::ErrorBody),
        (status = 503, description = "Store unavailable or silent past --store-timeout-ms, and no cached entry (fresh, or stale within --stale-max-age) to serve", body = super::error::ErrorBody),
    )
)]
pub(super) async fn follow(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> axum::response::Response {
    // Only the head is needed; the body type is not Sync, the head is.
    let (head, _) = request.into_parts();
    answer(&app, &head, peer).await.map(axum::body::Body::new)
}

fn fixed(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn unavailable(e: &StoreError) -> Response<Full<Bytes>> {
    let (status, body) = match e {
        StoreError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"store_unavailable","message":"the link store is unavailable; try again shortly"}}"#,
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"error":{"code":"internal","message":"internal error"}}"#,
        ),
    };
    tracing::warn!(error = %e, "redirect lookup failed");
    fixed(status, body)
}

/// Answers a redirect request from `peer`; `request.uri` is `/{code}`.
pub(crate) async fn answer(app: &App, request: &Parts, peer: SocketAddr) -> Response<Full<Bytes>> {
    match answer_now(app, request, peer) {
        Some(response) => response,
        None => answer_from_store(app, request, peer).await,
    }
}

/// The answer when the cache (or the code's shape) gives it, without waiting: every hit and
/// known unknown code. `None`: the store must be asked ([`answer_from_store`]). The server
/// calls this straight from its service, so that a hit's future is a ready response rather
/// than the state of a lookup that might have waited.
pub(crate) fn answer_now(
    app: &App,
    request: &Parts,
    peer: SocketAddr,
) -> Option<Response<Full<Bytes>>> {
    let started = sample_start();
    let now = crate::now();
    let found = match code_of(request) {
        Some(code) => app.cache.cached(code, now)?,
        None => None,
    };
    Some(timed(
        app,
        started,
        respond(app, request, peer, now, Ok(found)),
    ))
}

/// The answer once the store was asked, for a request [`answer_now`] could not answer.
pub(crate) async fn answer_from_store(
    app: &App,
    request: &Parts,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let started = sample_start();
    let now = crate::now();
    let found = match code_of(request) {
        Some(code) => app.cache.read(code, now).await,
        None => Ok(None),
    };
    timed(app, started, respond(app, request, peer, now, found))
}

/// The request's code, if its path could be one (anything else is unknown, unread).
fn code_of(request: &Parts) -> Option<&str> {
    let path = request.uri.path();
    Some(path.strip_prefix('/').unwrap_or(path)).filter(|code| could_be_code(code))
}

/// When this request started, if it is one of the sample [`TIMED_ONE_IN`] picks.
fn sample_start() -> Option<Instant> {
    thread_local! {
        static SEEN: Cell<u32> = const { Cell::new(0) };
    }
    let seen = SEEN.with(|seen| {
        let next = seen.get().wrapping_add(1);
        seen.set(next);
        next
    });
    seen.is_multiple_of(TIMED_ONE_IN).then(Instant::now)
}

fn timed(
    app: &App,
    started: Option<Instant>,
    response: Response<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    if let Some(started) = started {
        app.metrics
            .redirect_seconds
            .observe(started.elapsed().as_secs_f64());
    }
    response
}

/// The response to what the cache or the store said of the requested code.
fn respond(
    app: &App,
    request: &Parts,
    peer: SocketAddr,
    now: shortener_core::day::UnixSeconds,
    found: Result<Option<CachedLink>, StoreError>,
) -> Response<Full<Bytes>> {
    let link = match found {
        Ok(Some(link)) => link,
        Ok(None) => {
            app.metrics.redirect_not_found.inc();
            return fixed(StatusCode::NOT_FOUND, NOT_FOUND_BODY);
        }
        Err(e) => {
            app.metrics.redirect_error.inc();
            return unavailable(&e);
        }
    };
    if let Some(gone) = link.gone {
        app.metrics.redirect_gone.inc();
        let body = match gone {
            Gone::Disabled => GONE_BODY,
            Gone::Deleted => DELETED_BODY,
        };
        return fixed(StatusCode::GONE, body);
    }
    if now >= link.expires_at {
        app.metrics.redirect_not_found.inc();
        return fixed(StatusCode::NOT_FOUND, EXPIRED_BODY);
    }
    let Some(location) = link.location else {
        app.metrics.redirect_error.inc();
        tracing::error!(code = %link.code, "stored destination is not a valid header value");
        return unavailable(&StoreError::Backend("invalid stored destination".into()));
    };
    app.metrics.redirect_found.inc();
    let bot = app.bots.is_bot(&request.method, &request.headers);
    if !(bot && app.drop_bot_clicks) {
        app.clicks.record(ClickEvent {
            code: link.code,
            at: now,
            bot,
            visit: (!bot).then(|| visit(app, request, peer)).flatten(),
        });
    }
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = app.redirect_status;
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location);
    headers.insert(header::CACHE_CONTROL, app.cache_control.clone());
    response
}

/// A person's raw facts, copied for the click fold: no parsing here. A person always has a
/// readable User-Agent ([`crate::bots::BotDetector::is_bot`] says so).
fn visit(app: &App, request: &Parts, peer: SocketAddr) -> Option<Box<Visit>> {
    let headers = &request.headers;
    let user_agent = headers.get(header::USER_AGENT)?.to_str().ok()?;
    let referer = headers.get(header::REFERER).and_then(|v| v.to_str().ok());
    Some(Visit::new(
        super::auth::client_ip(app, peer, headers),
        user_agent,
        referer,
    ))
}
