//! `GET /{code}`: the hot path.

use super::AppState;
use super::error::ApiError;
use crate::clicks::ClickEvent;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use shortener_core::alias::could_be_code;
use shortener_core::link::LinkStatus;

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
pub(super) async fn follow(
    State(app): State<AppState>,
    method: Method,
    Path(code): Path<String>,
) -> Response {
    if !could_be_code(&code) {
        app.metrics.redirect_not_found.inc();
        return ApiError::not_found().into_response();
    }
    let link = match app.store.get_link(&code).await {
        Ok(Some(link)) => link,
        Ok(None) => {
            app.metrics.redirect_not_found.inc();
            return ApiError::not_found().into_response();
        }
        Err(e) => {
            app.metrics.redirect_error.inc();
            return ApiError::from(e).into_response();
        }
    };
    let now = crate::now();
    match link.status(now) {
        LinkStatus::Active => {}
        LinkStatus::Expired => {
            app.metrics.redirect_not_found.inc();
            return ApiError::new(StatusCode::NOT_FOUND, "not_found", "this link has expired")
                .into_response();
        }
        LinkStatus::Disabled => {
            app.metrics.redirect_gone.inc();
            return ApiError::new(StatusCode::GONE, "gone", "this link has been disabled")
                .into_response();
        }
    }
    let Ok(location) = HeaderValue::from_str(&link.long_url) else {
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
    app.clicks.record(ClickEvent {
        code: link.code.into_boxed_str(),
        at: now,
        // HEAD fetches no page: a monitor or a preview, not a person.
        bot: method == Method::HEAD,
    });
    (
        StatusCode::FOUND,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, app.cache_control.clone()),
        ],
    )
        .into_response()
}
