//! The JSON API and the dashboard, on their own port: axum, apart from the gateway's data path.

mod addresses;
mod error;
mod json;
mod leases;
mod openapi;
mod ops;

use crate::addresses::Registry;
use crate::auth::{Credentials, parse_basic};
use crate::sessions::SessionTable;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use proxypool::Pool;
use std::sync::Arc;
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;

pub(crate) use leases::LeaseBook;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Api {
    pub(crate) pool: Pool,
    pub(crate) registry: Registry,
    pub(crate) sessions: SessionTable,
    pub(crate) leases: LeaseBook,
    pub(crate) credentials: Option<Arc<Credentials>>,
    pub(crate) prometheus: PrometheusHandle,
    pub(crate) lease_ttl: Duration,
    /// Largest accepted request body (`--api-max-body-bytes`).
    pub(crate) max_body_bytes: usize,
}

type ApiState = Arc<Api>;

pub(crate) fn router(api: ApiState) -> Router {
    let protected = Router::new()
        .route("/", get(crate::dashboard::page))
        .route("/v1/acquire", post(leases::acquire))
        .route("/v1/release", post(leases::release))
        .route("/v1/feedback", post(leases::feedback))
        .route("/v1/addresses", get(addresses::list).post(addresses::add))
        .route("/v1/addresses/{id}", delete(addresses::remove))
        .route("/v1/matrix", get(addresses::matrix))
        .route("/v1/snapshot", get(addresses::snapshot))
        .route("/v1/openapi.json", get(ops::openapi))
        .route("/metrics", get(ops::metrics))
        .layer(middleware::from_fn_with_state(
            api.clone(),
            require_credentials,
        ));
    Router::new()
        .merge(protected)
        .route("/healthz", get(ops::healthz))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(DefaultBodyLimit::max(api.max_body_bytes))
        .layer(CatchPanicLayer::custom(error::panic_response))
        .with_state(api)
}

/// With an auth file, every route but `/healthz` wants `Authorization: Basic` of one of its
/// users (the same accounts as the gateway; a session suffix in the name is allowed).
async fn require_credentials(
    State(api): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(creds) = &api.credentials {
        let ok = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| parse_basic(v.as_bytes()))
            .is_some_and(|(user, password)| {
                creds.check(crate::sessions::parse_username(&user).user, &password)
            });
        if !ok {
            return error::ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Serves the API under `limits` until `shutdown` (see [`service_edge::serve_connections`]).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    limits: service_edge::HttpLimits,
    router: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let request_timeout = limits.request_timeout;
    let service = move |peer, budget: Arc<service_edge::RequestBudget>| {
        let router = router.clone();
        hyper::service::service_fn(move |request| {
            let (router, budget) = (router.clone(), budget.clone());
            async move {
                let response = service_edge::route(
                    router,
                    request,
                    peer,
                    &budget,
                    request_timeout,
                    request_timed_out,
                )
                .await;
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    service_edge::serve_connections(listener, &limits, service, shutdown).await;
}

fn request_timed_out() -> Response {
    error::ApiError::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        "the request took longer than --request-timeout",
    )
    .into_response()
}
