//! The HTTP/1.1 server: accepts connections, answers redirects straight from hyper and hands
//! every other request to the axum router.
//!
//! Redirects skip the router on purpose: routing, its per-request extensions and boxed bodies
//! cost a measurable share of a redirect's budget, and the redirect path is what the service
//! is for. Everything else — the API, operations endpoints, the router's 404/405 — goes
//! through axum.

use crate::api::{App, OWN_SINGLE_SEGMENT_PATHS, redirect};
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, Response};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use service_edge::{HttpLimits, RequestBudget, close_after};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How long in-flight requests may take to finish once shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

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
    let last = budget.take_is_last();
    let (mut head, body) = request.into_parts();
    let mut response = match router {
        None => redirect::answer(&app, &head, peer).await.map(Either::Left),
        Some(router) => {
            head.extensions.insert(ConnectInfo(peer));
            let request = Request::from_parts(head, body);
            // A body that trickles in (or anything else that holds one request open) ends here.
            match tokio::time::timeout(request_timeout, router.oneshot(request)).await {
                Ok(response) => response?.map(Either::Right),
                Err(_) => return Ok(request_timed_out()),
            }
        }
    };
    if last {
        close_after(&mut response);
    }
    Ok(response)
}

fn request_timed_out() -> Response<Body> {
    let mut response = Response::new(Either::Left(Full::from(
        r#"{"error":{"code":"request_timeout","message":"the request took too long to arrive"}}"#,
    )));
    *response.status_mut() = axum::http::StatusCode::REQUEST_TIMEOUT;
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    close_after(&mut response);
    response
}

/// Serves until `shutdown` resolves, then stops accepting and waits (up to
/// [`DRAIN_TIMEOUT`]) for in-flight requests; idle keep-alive connections are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: HttpLimits,
    app: Arc<App>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let http = limits.http1();
    let gate = limits.gate();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(permit) = gate.admit() else {
            tracing::debug!(%peer, "at --max-connections: connection closed");
            drop(stream);
            continue;
        };
        // Small responses: send them at once rather than waiting to coalesce.
        let _ = stream.set_nodelay(true);
        let (app, router) = (app.clone(), router.clone());
        let budget = limits.requests();
        let request_timeout = limits.request_timeout;
        let service = service_fn(move |request: Request<Incoming>| {
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
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some requests were still running after {DRAIN_TIMEOUT:?}; closing them");
    }
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
