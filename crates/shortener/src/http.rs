//! The HTTP/1.1 server: accepts connections, answers redirects straight from hyper and hands
//! every other request to the axum router.
//!
//! Redirects skip the router on purpose: routing, its per-request extensions and boxed bodies
//! cost a measurable share of a redirect's budget, and the redirect path is what the service
//! is for. Everything else — the API, operations endpoints, the router's 404/405 — goes
//! through axum.

use crate::api::{App, OWN_SINGLE_SEGMENT_PATHS, redirect};
use axum::Router;
use axum::http::{Method, Request, Response};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use service_edge::{HttpLimits, RequestBudget, close_after};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

type Body = Either<Full<Bytes>, axum::body::Body>;

/// Whether a request is a redirect: `GET`/`HEAD` of one non-empty path segment that the
/// router does not serve itself.
fn is_redirect(method: &Method, path: &str) -> bool {
    if !(method == Method::GET || method == Method::HEAD) {
        return false;
    }
    match path.strip_prefix('/') {
        Some(segment) => {
            !segment.is_empty()
                && !segment.contains('/')
                && !OWN_SINGLE_SEGMENT_PATHS.contains(&segment)
        }
        None => false,
    }
}

/// `router` is `None` exactly for redirects, which do not need it (one reference count less
/// to bump on the hot path).
async fn handle(
    app: Arc<App>,
    router: Option<Router>,
    peer: SocketAddr,
    request: Request<Incoming>,
    budget: Arc<RequestBudget>,
    request_timeout: Duration,
) -> Result<Response<Body>, Infallible> {
    let Some(router) = router else {
        let last = budget.take_is_last();
        let (head, _body) = request.into_parts();
        let mut response = redirect::answer(&app, &head, peer).await;
        if last {
            close_after(&mut response);
        }
        return Ok(response.map(Either::Left));
    };
    let response = service_edge::route(
        router,
        request,
        peer,
        &budget,
        request_timeout,
        request_timed_out,
    )
    .await;
    Ok(response.map(Either::Right))
}

fn request_timed_out() -> Response<axum::body::Body> {
    let mut response = Response::new(axum::body::Body::from(
        r#"{"error":{"code":"request_timeout","message":"the request took too long to arrive"}}"#,
    ));
    *response.status_mut() = axum::http::StatusCode::REQUEST_TIMEOUT;
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves until `shutdown` resolves (see [`service_edge::serve_connections`]).
pub(crate) async fn serve(
    listener: TcpListener,
    limits: HttpLimits,
    app: Arc<App>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let request_timeout = limits.request_timeout;
    let service = move |peer: SocketAddr, budget: Arc<RequestBudget>| {
        let (app, router) = (app.clone(), router.clone());
        service_fn(move |request: Request<Incoming>| {
            let redirect = is_redirect(request.method(), request.uri().path());
            let router = (!redirect).then(|| router.clone());
            handle(
                app.clone(),
                router,
                peer,
                request,
                budget.clone(),
                request_timeout,
            )
        })
    };
    service_edge::serve_connections(listener, &limits, service, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_segment_gets_that_the_router_does_not_own_are_redirects() {
        assert!(is_redirect(&Method::GET, "/abcdefg"));
        assert!(is_redirect(&Method::HEAD, "/spring-sale"));
        assert!(is_redirect(&Method::GET, "/x"));
        assert!(!is_redirect(&Method::POST, "/abcdefg"));
        assert!(!is_redirect(&Method::GET, "/"));
        assert!(!is_redirect(&Method::GET, "/api/v1/links"));
        for own in OWN_SINGLE_SEGMENT_PATHS {
            assert!(!is_redirect(&Method::GET, &format!("/{own}")));
        }
    }
}
