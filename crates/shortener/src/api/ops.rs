//! Operations endpoints: liveness, readiness, metrics, the OpenAPI document.

use super::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;

/// Alive: the process answers.
pub(super) async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Ready: 200 whenever the instance can serve. `degraded` (still 200, so that a load
/// balancer keeps an instance that serves cached and stale links) while the store does not
/// answer within the store timeout, and in the scale-out mode while Redis does not answer or
/// this instance does not hear other instances' invalidations. With read replicas, each is
/// named `ok` or `skipped`.
pub(super) async fn readyz(State(app): State<AppState>) -> impl IntoResponse {
    let store = match app.store.ping().await {
        Ok(()) => "ok",
        Err(e) => {
            tracing::warn!(error = %e, "readiness: the store does not answer");
            "unavailable"
        }
    };
    let mut ready = store == "ok";
    let mut body = json!({"store": store});
    if let Some(scaleout) = &app.scaleout {
        let redis = if scaleout.redis.ping().await {
            "ok"
        } else {
            "unreachable"
        };
        let subscribed = scaleout.invalidations.is_subscribed();
        ready &= redis == "ok" && subscribed;
        body["redis"] = json!(redis);
        body["invalidations"] = json!(if subscribed {
            "subscribed"
        } else {
            "not subscribed"
        });
    }
    if let Some(replicas) = &app.replicas {
        // Skipped replicas leave the instance ready: the primary answers their reads.
        let health: serde_json::Map<String, serde_json::Value> = replicas
            .health()
            .into_iter()
            .map(|(name, in_use)| {
                (
                    name.to_owned(),
                    json!(if in_use { "ok" } else { "skipped" }),
                )
            })
            .collect();
        body["replicas"] = health.into();
    }
    body["status"] = json!(if ready { "ready" } else { "degraded" });
    axum::Json(body)
}

/// Prometheus text exposition.
pub(super) async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    app.metrics
        .store_up
        .set(i64::from(app.store.ping().await.is_ok()));
    app.metrics
        .click_queue_depth
        .set(crate::metrics::gauge(app.clicks.depth()));
    if let Some(scaleout) = &app.scaleout {
        app.metrics.redis_up.set(i64::from(scaleout.redis.is_up()));
        app.metrics
            .unannounced_changes
            .set(crate::metrics::gauge(scaleout.invalidations.pending()));
    }
    let (entries, bytes) = app.cache.size();
    app.metrics
        .cache_entries
        .set(crate::metrics::gauge(entries));
    app.metrics.cache_bytes.set(crate::metrics::gauge(bytes));
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
