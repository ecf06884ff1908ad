//! Operations endpoints: liveness, readiness, metrics, the OpenAPI document.

use super::AppState;
use super::error::ApiError;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::json;

/// Alive: the process answers.
pub(super) async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Ready: the store answers. In the scale-out mode, `degraded` (still 200: redirects and
/// creates work on local fallbacks) while Redis does not answer or this instance does not
/// hear other instances' invalidations.
pub(super) async fn readyz(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    match app.store.ping().await {
        Ok(()) => Ok(axum::Json(match &app.scaleout {
            None => json!({"status": "ready"}),
            Some(scaleout) => {
                let redis = if scaleout.redis.ping().await {
                    "ok"
                } else {
                    "unreachable"
                };
                let invalidations = if scaleout.invalidations.is_subscribed() {
                    "subscribed"
                } else {
                    "not subscribed"
                };
                let ready = redis == "ok" && scaleout.invalidations.is_subscribed();
                json!({
                    "status": if ready { "ready" } else { "degraded" },
                    "redis": redis,
                    "invalidations": invalidations,
                })
            }
        })),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the link store does not answer",
            ))
        }
    }
}

/// Prometheus text exposition.
pub(super) async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    app.metrics
        .store_up
        .set(i64::from(app.store.ping().await.is_ok()));
    app.metrics
        .click_queue_depth
        .set(i64::try_from(app.clicks.depth()).unwrap_or(i64::MAX));
    if let Some(scaleout) = &app.scaleout {
        app.metrics.redis_up.set(i64::from(scaleout.redis.is_up()));
        app.metrics
            .unannounced_changes
            .set(i64::try_from(scaleout.invalidations.pending()).unwrap_or(i64::MAX));
    }
    let (entries, bytes) = app.cache.size();
    app.metrics
        .cache_entries
        .set(i64::try_from(entries).unwrap_or(i64::MAX));
    app.metrics
        .cache_bytes
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        app.metrics.render(),
    )
}

/// The OpenAPI 3 document of this API, generated from the handlers.
pub(super) async fn openapi() -> impl IntoResponse {
    axum::Json(super::openapi::document())
}
