//! The gateway: an HTTP forward proxy on hyper (not the API router) that takes a lease from
//! the pool for every request, sends the request through that upstream and reports how it went.
//!
//! - `CONNECT host:port` → a tunnel through the upstream (`connect.rs`).
//! - Absolute-form plain HTTP (`GET http://host/path`) → the request through the upstream
//!   (`forward.rs`), its answer judged: 403, 429, 5xx, captcha markers, success with latency.
//!
//! The session comes from the username of `Proxy-Authorization: Basic`
//! (`NAME-session-ID[-ttl-MINUTES]`), the site from the target host's registrable domain.

mod connect;
mod forward;
mod headers;
mod reply;
mod report;

use crate::auth::{Credentials, parse_basic};
use crate::config::GatewaySettings;
use crate::sessions::{SessionTable, parse_username};
use crate::site::site_of;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use memchr::memmem::Finder;
use proxypool::dial::{DialError, Upstream};
use proxypool::{Pool, ProxyAddress, Ticket};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub(crate) use report::Reported;

/// Every gateway answer: our own plain-text replies, or an upstream's body passed through.
pub(crate) type GatewayBody = Either<Full<Bytes>, Reported>;

/// How long open requests and tunnels may run once shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the gateway shares between connections.
#[derive(Debug)]
pub(crate) struct Gateway {
    pub(crate) pool: Pool,
    pub(crate) sessions: SessionTable,
    /// `None`: no credentials asked (loopback only, checked at start-up).
    pub(crate) credentials: Option<Arc<Credentials>>,
    pub(crate) settings: GatewaySettings,
    markers: Arc<[Finder<'static>]>,
    /// Parsed upstreams by full URL, so a request does not parse its lease's URL again.
    upstreams: RwLock<HashMap<Box<str>, Arc<Upstream>>>,
}

impl Gateway {
    pub(crate) fn new(
        pool: Pool,
        sessions: SessionTable,
        credentials: Option<Arc<Credentials>>,
        settings: GatewaySettings,
    ) -> Self {
        let markers: Vec<Finder<'static>> = settings
            .captcha_markers
            .iter()
            .map(|m| Finder::new(m.as_bytes()).into_owned())
            .collect();
        Self {
            pool,
            sessions,
            credentials,
            settings,
            markers: markers.into(),
            upstreams: RwLock::default(),
        }
    }

    /// The upstream behind a leased address.
    fn upstream(&self, address: &ProxyAddress) -> Result<Arc<Upstream>, DialError> {
        if let Some(u) = read(&self.upstreams).get(address.as_str()) {
            return Ok(u.clone());
        }
        let parsed = Arc::new(Upstream::parse(address)?);
        let mut cache = write(&self.upstreams);
        // Removed addresses leave stale entries behind; start over rather than grow forever.
        if cache.len() >= UPSTREAM_CACHE_MAX {
            cache.clear();
        }
        cache.insert(address.as_str().into(), parsed.clone());
        Ok(parsed)
    }
}

/// More upstreams than any pool this server is meant for.
const UPSTREAM_CACHE_MAX: usize = 100_000;

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where a request goes.
#[derive(Debug)]
struct Target {
    host: String,
    port: u16,
}

fn count(kind: &'static str, result: &'static str) {
    metrics::counter!("proxypool_gateway_requests_total", "kind" => kind, "result" => result)
        .increment(1);
}

async fn handle(gw: Arc<Gateway>, request: Request<Incoming>) -> Response<GatewayBody> {
    let connect = request.method() == Method::CONNECT;
    let kind = if connect { "connect" } else { "http" };
    let basic = request
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .and_then(|v| parse_basic(v.as_bytes()));
    let identity = basic.as_ref().map(|(user, _)| parse_username(user));
    if let Some(creds) = &gw.credentials {
        let ok = match (&identity, &basic) {
            (Some(id), Some((_, password))) => creds.check(id.user, password),
            _ => false,
        };
        if !ok {
            count(kind, "auth_required");
            return reply::proxy_auth_required();
        }
    }
    let target = match target_of(&request, connect) {
        Ok(t) => t,
        Err(why) => {
            count(kind, "bad_request");
            return reply::error(StatusCode::BAD_REQUEST, "bad-request", why);
        }
    };
    // Known too large before any upstream is bothered; a body of unknown length is cut off
    // on the way (`forward`).
    if declared_length(&request).is_some_and(|n| n > gw.settings.client_limits.max_body_bytes) {
        count(kind, "body_too_large");
        return reply::body_too_large();
    }
    let session = identity.and_then(|id| id.session);
    let mut ticket = Ticket::new().site(site_of(&target.host));
    if let Some(s) = &session {
        ticket = ticket.key(gw.sessions.pool_key(s));
    }
    let lease = match gw.pool.acquire(ticket).await {
        Ok(lease) => lease,
        Err(e) => {
            let (response, label) = reply::no_lease(&e);
            count(kind, label);
            return response;
        }
    };
    let started = Instant::now();
    let (response, label) = if connect {
        connect::tunnel(&gw, request, &target, lease, started).await
    } else {
        forward::forward(&gw, request, &target, lease, started).await
    };
    count(kind, label);
    response
}

/// `Content-Length`, when the request states one that parses.
fn declared_length(request: &Request<Incoming>) -> Option<usize> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn target_of(request: &Request<Incoming>, connect: bool) -> Result<Target, &'static str> {
    let uri = request.uri();
    let Some(authority) = uri.authority() else {
        return Err(
            "this is a forward proxy: send CONNECT host:port or an absolute-form request (GET http://host/path)",
        );
    };
    let default_port = if connect {
        443
    } else {
        match uri.scheme_str() {
            Some("http") => 80,
            _ => {
                return Err(
                    "only http:// URLs are forwarded in absolute form; use CONNECT for https",
                );
            }
        }
    };
    Ok(Target {
        host: authority.host().to_owned(),
        port: authority.port_u16().unwrap_or(default_port),
    })
}

/// [`handle`] within the request timeout (a plain request's body must have reached the
/// upstream and its answer's head come back; a tunnel's setup done), marking the
/// connection's last plain request.
async fn limited(
    gw: Arc<Gateway>,
    request: Request<Incoming>,
    budget: &service_edge::RequestBudget,
) -> Response<GatewayBody> {
    let connect = request.method() == Method::CONNECT;
    let last = budget.take_is_last();
    let timeout = gw.settings.client_limits.request_timeout;
    let mut response = match tokio::time::timeout(timeout, handle(gw, request)).await {
        Ok(response) => response,
        Err(_) => {
            count(if connect { "connect" } else { "http" }, "request_timeout");
            let mut response = reply::error(
                StatusCode::REQUEST_TIMEOUT,
                "request-timeout",
                "the request took longer than --request-timeout",
            );
            service_edge::close_after(&mut response);
            response
        }
    };
    // A CONNECT's connection becomes the tunnel: it carries no further requests.
    if last && !connect {
        service_edge::close_after(&mut response);
    }
    response
}

/// Serves until `stop` turns true, then stops accepting, asks open connections to finish
/// their current request, and gives them (and open tunnels) up to [`DRAIN_TIMEOUT`].
pub(crate) async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    mut stop: watch::Receiver<bool>,
) {
    let limits = gateway.settings.client_limits;
    let http = limits.http1();
    let gate = limits.gate();
    // Every connection task holds a clone; `recv` returns `None` once all have ended.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = async { let _ = stop.wait_for(|s| *s).await; } => break,
        };
        let Some(permit) = gate.admit() else {
            tracing::debug!(%peer, "at --max-connections: gateway connection closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let gw = gateway.clone();
        let budget = limits.requests();
        let service = service_fn(move |request: Request<Incoming>| {
            let (gw, budget) = (gw.clone(), budget.clone());
            async move { Ok::<_, Infallible>(limited(gw, request, &budget).await) }
        });
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let (open, mut stop) = (open.clone(), stop.clone());
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = async { let _ = stop.wait_for(|s| *s).await; } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "gateway connection ended with an error");
            }
            drop((open, permit));
        });
    }
    drop(listener);
    drop(open);
    if tokio::time::timeout(DRAIN_TIMEOUT, all_closed.recv())
        .await
        .is_err()
    {
        tracing::warn!("gateway requests still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}
