//! What one probe of one address does: pluggable checks (P12). These are the crate's only
//! network code — compiled with the `probe` feature.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{CONNECTION, HOST, PROXY_AUTHORIZATION};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use url::Url;

use crate::address::ProxyAddress;
use crate::dial::{self, DialError, Upstream};

/// A boxed probe future: probes run seconds apart, so the allocation is irrelevant, and boxing
/// keeps [`Check`] object-safe (a prober holds any mix of checks).
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<(), CheckError>> + Send + 'a>>;

/// One way of asking whether a proxy works.
pub trait Check: Send + Sync + Debug {
    /// Probes `proxy`; `Ok` when it passed.
    fn check<'a>(&'a self, proxy: &'a ProxyAddress) -> CheckFuture<'a>;
}

/// Why a probe failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The proxy URL has no usable host and port.
    #[error("proxy URL has no host or port")]
    BadProxyUrl,
    /// The check cannot speak to this kind of proxy (e.g. an HTTP GET through SOCKS5).
    #[error("unsupported proxy scheme {0:?} for this check")]
    Unsupported(String),
    /// No answer within the check's timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The TCP connection to the proxy failed.
    #[error("connect: {0}")]
    Connect(#[from] std::io::Error),
    /// The HTTP exchange failed.
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    /// The request could not be built.
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
    /// The proxy refused to open a tunnel (CONNECT) to an `https://` control URL.
    #[error("CONNECT answered {0}")]
    Tunnel(u16),
    /// The TLS session with an `https://` control URL failed (handshake, certificate).
    #[error("tls: {0}")]
    Tls(String),
    /// The upstream failed otherwise (timed out within the exchange, answered garbage).
    #[error("upstream: {0}")]
    Upstream(DialError),
    /// The SOCKS5 proxy refused the connection to the control host (or its credentials).
    #[error("socks5: {0}")]
    Socks(String),
    /// The response body could not be read (or was too long).
    #[error("body: {0}")]
    Body(String),
    /// The control URL answered with another status.
    #[error("status {got}, expected {expected}")]
    Status {
        /// What came back.
        got: u16,
        /// What the check wanted.
        expected: u16,
    },
    /// The body lacks the marker (a captive portal or an error page answered instead).
    #[error("body marker {0:?} missing")]
    MarkerMissing(String),
    /// Too few control endpoints passed (see [`Majority`]).
    #[error("{passed} of {total} control endpoints passed: {first}")]
    Minority {
        /// Checks that passed.
        passed: usize,
        /// Checks run.
        total: usize,
        /// The first failure, as an example.
        first: String,
    },
}

fn host_port(proxy: &ProxyAddress) -> Result<(Url, String, u16), CheckError> {
    let url = Url::parse(proxy.as_str()).map_err(|_| CheckError::BadProxyUrl)?;
    let host = url.host_str().ok_or(CheckError::BadProxyUrl)?.to_owned();
    let port = match url.port_or_known_default() {
        Some(p) => p,
        None if url.scheme().starts_with("socks5") => 1080,
        None => return Err(CheckError::BadProxyUrl),
    };
    Ok((url, host, port))
}

async fn within<T>(
    limit: Duration,
    f: impl Future<Output = Result<T, CheckError>>,
) -> Result<T, CheckError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| CheckError::Timeout(limit))?
}

/// Passes when a TCP connection to the proxy opens: cheap, and works for every scheme.
#[derive(Debug, Clone)]
pub struct TcpConnect {
    timeout: Duration,
}

impl TcpConnect {
    /// A connect check giving up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl Check for TcpConnect {
    fn check<'a>(&'a self, proxy: &'a ProxyAddress) -> CheckFuture<'a> {
        Box::pin(within(self.timeout, async move {
            let (_, host, port) = host_port(proxy)?;
            TcpStream::connect((host.as_str(), port)).await?;
            Ok(())
        }))
    }
}

/// Passes when a GET of a control URL through the proxy answers the expected status (and
/// contains the marker, if one is set). Through an `http://` proxy, an `http://` control URL
/// is asked of the proxy directly (credentials in `Proxy-Authorization`) and an `https://`
/// one through a tunnel (CONNECT); through a `socks5://` or `socks5h://` proxy (which
/// resolves the control host itself), both go through a SOCKS5 connection. TLS to the
/// control host is verified against
/// the Mozilla roots (`webpki-roots`), the system's (`SSL_CERT_FILE`, `SSL_CERT_DIR` or the
/// platform store: where a TLS-inspecting egress proxy's CA lives) and any added with
/// [`HttpGet::trust`].
#[derive(Debug, Clone)]
pub struct HttpGet {
    url: Url,
    expected_status: u16,
    marker: Option<String>,
    timeout: Duration,
    extra_roots: Vec<CertificateDer<'static>>,
    /// Built at the first `https://` probe and shared by clones.
    tls: Arc<OnceLock<Result<Arc<rustls::ClientConfig>, String>>>,
}

/// Bodies longer than this fail the check: a control page is small.
const MAX_BODY: usize = 64 * 1024;

impl HttpGet {
    /// A GET of `url` expecting 200, no marker, giving up after 10 s.
    pub fn new(url: Url) -> Self {
        Self {
            url,
            expected_status: 200,
            marker: None,
            timeout: Duration::from_secs(10),
            extra_roots: Vec::new(),
            tls: Arc::default(),
        }
    }

    /// Also trusts this root certificate (DER) for `https://` control URLs: a private CA.
    pub fn trust(mut self, certificate_der: impl Into<Vec<u8>>) -> Self {
        self.extra_roots
            .push(CertificateDer::from(certificate_der.into()));
        self.tls = Arc::default();
        self
    }

    /// The status the control URL answers.
    pub fn expect_status(mut self, status: u16) -> Self {
        self.expected_status = status;
        self
    }

    /// A string the body must contain.
    pub fn body_marker(mut self, marker: impl Into<String>) -> Self {
        self.marker = Some(marker.into());
        self
    }

    /// The time the whole exchange may take.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn get(&self, proxy: &ProxyAddress) -> Result<(), CheckError> {
        let upstream = match Upstream::parse(proxy) {
            Ok(u) => u,
            Err(_) => return Err(CheckError::Unsupported(proxy_scheme(proxy))),
        };
        let authority = self.authority();
        let https = self.url.scheme() == "https";
        let target_host = self.url.host_str().unwrap_or_default();
        let target_port = self.url.port_or_known_default().unwrap_or(443);
        let resp = match (&upstream, https) {
            // Absolute-form request target: that is how a client asks an HTTP proxy.
            (Upstream::Http { addr, auth }, false) => {
                let stream = dial::connect(addr, self.timeout)
                    .await
                    .map_err(dial_failed)?;
                let mut req = Request::get(self.url.as_str()).header(HOST, &authority);
                if let Some(a) = auth {
                    req = req.header(PROXY_AUTHORIZATION, a);
                }
                exchange(stream, req).await?
            }
            _ => {
                let (stream, leftover) =
                    dial::tunnel(&upstream, target_host, target_port, self.timeout)
                        .await
                        .map_err(dial_failed)?;
                // The control host speaks only when asked: bytes before the request mean the
                // upstream is not a clean tunnel.
                if !leftover.is_empty() {
                    return Err(CheckError::Upstream(DialError::Protocol(
                        "bytes before the request",
                    )));
                }
                let req = Request::get(self.origin_form()).header(HOST, &authority);
                if https {
                    exchange(self.tls(stream).await?, req).await?
                } else {
                    exchange(stream, req).await?
                }
            }
        };
        let got = resp.status().as_u16();
        if got != self.expected_status {
            return Err(CheckError::Status {
                got,
                expected: self.expected_status,
            });
        }
        if let Some(marker) = &self.marker {
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| CheckError::Body(e.to_string()))?
                .to_bytes();
            if !String::from_utf8_lossy(&body).contains(marker.as_str()) {
                return Err(CheckError::MarkerMissing(marker.clone()));
            }
        }
        Ok(())
    }

    /// The request target once connected to the control host: path and query.
    fn origin_form(&self) -> String {
        match self.url.query() {
            Some(q) => format!("{}?{q}", self.url.path()),
            None => self.url.path().to_owned(),
        }
    }

    /// `host[:port]` of the control URL, as in `Host`.
    fn authority(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        match self.url.port_or_known_default() {
            Some(p) if Some(p) != default_port(self.url.scheme()) => format!("{host}:{p}"),
            _ => host.to_owned(),
        }
    }

    /// The TLS client configuration, built once per check (parsing the roots takes
    /// milliseconds).
    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, CheckError> {
        let built = self.tls.get_or_init(|| {
            let mut roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            // Certificates of the system store that do not parse are skipped, as curl does.
            roots.add_parsable_certificates(system_roots().iter().cloned());
            for cert in &self.extra_roots {
                roots.add(cert.clone()).map_err(|e| e.to_string())?;
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(config))
        });
        built.clone().map_err(CheckError::Tls)
    }

    /// TLS with the control host over `io`.
    async fn tls<IO>(&self, io: IO) -> Result<tokio_rustls::client::TlsStream<IO>, CheckError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let tls_error = |e: &dyn std::fmt::Display| CheckError::Tls(e.to_string());
        let config = self.tls_config()?;
        let host = match self.url.host() {
            Some(url::Host::Ipv4(ip)) => ServerName::from(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => ServerName::from(std::net::IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                ServerName::try_from(d.to_owned()).map_err(|e| tls_error(&e))?
            }
            None => return Err(CheckError::Tls("control URL has no host".into())),
        };
        TlsConnector::from(config)
            .connect(host, io)
            .await
            .map_err(|e| tls_error(&e))
    }
}

/// The system's trusted certificates, read once per process (a missing store is no error:
/// the Mozilla roots remain).
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(target: "proxypool::probe", error = %e, "system certificate store");
        }
        found.certs
    })
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// The check's reading of a failed dial.
fn dial_failed(e: DialError) -> CheckError {
    match e {
        DialError::Connect(e) => CheckError::Connect(e),
        DialError::ProxyAuth => CheckError::Tunnel(407),
        DialError::Refused(code) => CheckError::Tunnel(code),
        DialError::Broken(e) => CheckError::Http(e),
        DialError::Socks(e) => CheckError::Socks(e.to_string()),
        DialError::Resolve(host) => CheckError::Socks(format!("{host} did not resolve")),
        other => CheckError::Upstream(other),
    }
}

fn proxy_scheme(proxy: &ProxyAddress) -> String {
    let s = proxy.as_str();
    s.split_once("://")
        .map_or(s, |(scheme, _)| scheme)
        .to_owned()
}

/// One HTTP/1.1 request on `io`, one connection per probe (`Connection: close`): pooling would
/// only hide a proxy that stopped accepting.
async fn exchange<IO>(
    io: IO,
    req: hyper::http::request::Builder,
) -> Result<Response<hyper::body::Incoming>, CheckError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // The connection task ends when the exchange does or the sender is dropped on timeout.
    tokio::spawn(conn);
    let req = req
        .header(CONNECTION, "close")
        .body(Empty::<Bytes>::new())?;
    Ok(sender.send_request(req).await?)
}

impl Check for HttpGet {
    fn check<'a>(&'a self, proxy: &'a ProxyAddress) -> CheckFuture<'a> {
        Box::pin(within(self.timeout, self.get(proxy)))
    }
}

/// Several control endpoints, one verdict: passes when more than half of its checks pass, so
/// one broken endpoint cannot condemn the pool (P12). The checks run one after another: they
/// are few, and a probe round runs many addresses concurrently anyway.
#[derive(Debug, Clone)]
pub struct Majority {
    checks: Vec<Arc<dyn Check>>,
}

impl Majority {
    /// The majority of `checks`.
    pub fn new(checks: Vec<Arc<dyn Check>>) -> Self {
        Self { checks }
    }
}

impl Check for Majority {
    fn check<'a>(&'a self, proxy: &'a ProxyAddress) -> CheckFuture<'a> {
        Box::pin(async move {
            let mut passed = 0;
            let mut first = None;
            for c in &self.checks {
                match c.check(proxy).await {
                    Ok(()) => passed += 1,
                    Err(e) => {
                        first.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            let total = self.checks.len();
            if passed * 2 > total {
                Ok(())
            } else {
                Err(CheckError::Minority {
                    passed,
                    total,
                    first: first.unwrap_or_else(|| "no checks".to_owned()),
                })
            }
        })
    }
}
