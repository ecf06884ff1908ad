//! The accept loop both HTTP/1.1 servers on hyper share (the shortener, the proxypool API):
//! connections under [`HttpLimits`], graceful drain at shutdown; and the one way a request
//! reaches an axum router there (its request budget and time limit).

use crate::head_watch::{HeadWatch, Watched};
use crate::supervise::Supervised;
use crate::{HttpLimits, RequestBudget, close_after};
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulConnection;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// How long in-flight requests may take to finish once shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

type Connection<S> = hyper::server::conn::http1::Connection<TokioIo<TcpStream>, Watched<S>>;

/// Serves until `shutdown` resolves, each connection (past the `--max-connections` gate)
/// with the service `service(peer, budget)` makes and the head timeout of `head_watch.rs`;
/// then stops accepting and waits (up to [`DRAIN_TIMEOUT`]) for in-flight requests; idle
/// keep-alive connections are closed.
pub async fn serve_connections<M, S, B>(
    listener: TcpListener,
    limits: &HttpLimits,
    service: M,
    shutdown: impl Future<Output = ()>,
) where
    M: Fn(SocketAddr, Arc<RequestBudget>) -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    Connection<S>: GracefulConnection + Send + 'static,
    <Connection<S> as Future>::Output: Send,
{
    // Every connection holds a receiver until it ends: a send starts their drains, and
    // `closed()` is when the last one ended.
    let (drain, _) = tokio::sync::watch::channel(());
    let http = limits.http1_untimed();
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
        let watch = HeadWatch::new();
        let service = Watched {
            inner: service(peer, limits.requests()),
            watch: watch.clone(),
        };
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let header_timeout = limits.header_timeout;
        let mut drained = drain.subscribe();
        tokio::spawn(async move {
            // A head awaited past the timeout (slowloris, an idle keep-alive) drops the
            // connection, which closes it.
            let _ = Supervised::new(
                connection,
                async move {
                    let _ = drained.changed().await;
                    drained
                },
                async move { watch.expired(header_timeout).await },
                GracefulConnection::graceful_shutdown,
            )
            .await;
            drop(permit);
        });
    }
    drop(listener);
    drain.send_replace(());
    if tokio::time::timeout(DRAIN_TIMEOUT, drain.closed())
        .await
        .is_err()
    {
        tracing::warn!("some requests were still running after {DRAIN_TIMEOUT:?}; closing them");
    }
}

/// `request` through `router` within `limits.request_timeout` (a body that trickles in ends
/// there with `timed_out()`, a 408 in the API's shape, and the connection closes); the
/// connection's last request closes it, and so does a 413. The peer is the router's `ConnectInfo`.
pub async fn route(
    router: Router,
    request: Request<Incoming>,
    peer: SocketAddr,
    budget: &RequestBudget,
    request_timeout: Duration,
    timed_out: fn() -> Response<axum::body::Body>,
) -> Response<axum::body::Body> {
    let last = budget.take_is_last();
    let (mut head, body) = request.into_parts();
    head.extensions.insert(ConnectInfo(peer));
    let request = Request::from_parts(head, axum::body::Body::new(body));
    let mut response = match tokio::time::timeout(request_timeout, router.oneshot(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(never)) => match never {},
        Err(_) => {
            let mut response = timed_out();
            close_after(&mut response);
            response
        }
    };
    // A refused body is not read to its end: the connection cannot carry another request.
    if last || response.status() == hyper::StatusCode::PAYLOAD_TOO_LARGE {
        close_after(&mut response);
    }
    response
}
