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
use futures_util::future;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use service_edge::{HttpLimits, RequestBudget, close_after};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
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

/// What the service answers with: a redirect the cache answered, ready; anything else in a
/// box (a redirect waiting on the store, the router). A ready answer is all a hit moves
/// around inside hyper, not the state of a lookup that might have waited.
type Answer = future::Either<
    std::future::Ready<Result<Response<Body>, Infallible>>,
    Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>,
>;

fn handle(
    app: &Arc<App>,
    router: &Router,
    peer: SocketAddr,
    request: Request<Incoming>,
    budget: &Arc<RequestBudget>,
    request_timeout: Duration,
) -> Answer {
    if !is_redirect(request.method(), request.uri().path()) {
        let routed = routed(
            router.clone(),
            request,
            peer,
            budget.clone(),
            request_timeout,
        );
        return future::Either::Right(Box::pin(routed));
    }
    let last = budget.take_is_last();
    let (head, _body) = request.into_parts();
    let sent = move |mut response: Response<Full<Bytes>>| {
        if last {
            close_after(&mut response);
        }
        Ok(response.map(Either::Left))
    };
    match redirect::answer_now(app, &head, peer) {
        Some(response) => future::Either::Left(std::future::ready(sent(response))),
        None => {
            let app = app.clone();
            future::Either::Right(Box::pin(async move {
                sent(redirect::answer_from_store(&app, &head, peer).await)
            }))
        }
    }
}

async fn routed(
    router: Router,
    request: Request<Incoming>,
    peer: SocketAddr,
    budget: Arc<RequestBudget>,
    request_timeout: Duration,
) -> Result<Response<Body>, Infallible> {
    let response = service_edge::route(
        router,
        request,
        peer,
        &budget,
        request_timeout,
        request_timed_out,
    );
    Ok(response.await.map(Either::Right))
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
            handle(&app, &router, peer, request, &budget, request_timeout)
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
