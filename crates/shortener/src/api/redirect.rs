//! `GET|HEAD /{code}`: the hot path. A hit in the L1 cache costs no allocation of ours: the
//! code is a slice of the request path, the `Location` value and the code in the click event
//! are reference-counted clones from the cache entry.

use super::AppState;
use super::error::{ApiError, EXPIRED_BODY, GONE_BODY, NOT_FOUND_BODY, fixed};
use crate::clicks::ClickEvent;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use shortener_core::alias::could_be_code;
use std::time::Instant;

/// Follow a short link: 302 to its destination.
#[utoipa::path(
    get, path = "/{code}", tag = "redirect",
    params(("code" = String, Path, description = "Short code or alias")),
    responses(
        (status = 302, description = "Redirect; the destination is in Location"),
        (status = 404, description = "Unknown or expired", body = super::error::ErrorBody),
        (status = 410, description = "Disabled", body = super::error::ErrorBody),
        (status = 503, description = "Store unavailable", body = super::error::ErrorBody),
    )
)]
pub(super) async fn follow(State(app): State<AppState>, request: Request) -> Response {
    let started = Instant::now();
    // Only the head is needed; the body type is not Sync, the head is.
    let (head, _) = request.into_parts();
    let response = answer(&app, &head).await;
    app.metrics
        .redirect_seconds
        .observe(started.elapsed().as_secs_f64());
    response
}

async fn answer(app: &super::App, request: &Parts) -> Response {
    let code = request.uri.path().trim_start_matches('/');
    if !could_be_code(code) {
        app.metrics.redirect_not_found.inc();
        return fixed(StatusCode::NOT_FOUND, NOT_FOUND_BODY);
    }
    let link = match app.cache.get(code).await {
        Ok(Some(link)) => link,
        Ok(None) => {
            app.metrics.redirect_not_found.inc();
            return fixed(StatusCode::NOT_FOUND, NOT_FOUND_BODY);
        }
        Err(e) => {
            app.metrics.redirect_error.inc();
            return ApiError::from(e).into_response();
        }
    };
    if link.disabled {
        app.metrics.redirect_gone.inc();
        return fixed(StatusCode::GONE, GONE_BODY);
    }
    let now = crate::now();
    if now >= link.expires_at {
        app.metrics.redirect_not_found.inc();
        return fixed(StatusCode::NOT_FOUND, EXPIRED_BODY);
    }
    let Some(location) = link.location.clone() else {
        app.metrics.redirect_error.inc();
        tracing::error!(code = %link.code, "stored destination is not a valid header value");
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
        .into_response();
    };
    app.metrics.redirect_found.inc();
    let bot = app.bots.is_bot(&request.method, &request.headers);
    if !(bot && app.drop_bot_clicks) {
        app.clicks.record(ClickEvent {
            code: link.code.clone(),
            at: now,
            bot,
        });
    }
    (
        StatusCode::FOUND,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, app.cache_control.clone()),
        ],
    )
        .into_response()
}
