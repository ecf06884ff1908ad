//! Operations endpoints: liveness, Prometheus metrics, the OpenAPI document.

use super::ApiState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;

/// Alive: the process answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
pub(super) async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Prometheus text exposition: the library's metrics and the gateway's.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text")))]
pub(super) async fn metrics(State(api): State<ApiState>) -> impl IntoResponse {
    metrics::gauge!("proxypool_gateway_sessions").set(api.sessions.len() as f64);
    // Pool-wide judgements the alert rules read, as the store (memory or Redis) sees them now.
    let pool = api.pool.snapshot().await.pool;
    metrics::gauge!("proxypool_addresses_offered").set(pool.offered as f64);
    metrics::gauge!("proxypool_our_side_failing").set(if pool.frozen { 1.0 } else { 0.0 });
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        api.prometheus.render(),
    )
}

/// The OpenAPI 3 document of this API.
pub(super) async fn openapi() -> impl IntoResponse {
    axum::Json(super::openapi::document())
}
