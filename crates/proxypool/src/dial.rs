//! Reaching a target through an upstream proxy — `CONNECT` through an HTTP proxy, or SOCKS5
//! (`socks5://` resolving names here, `socks5h://` letting the proxy resolve them), with or
//! without credentials. The prober's checks and the gateway both dial through this module, so
//! an upstream is spoken to one way. Compiled with the `probe` feature.
//!
//! ```
//! use proxypool::ProxyAddress;
//! use proxypool::dial::Upstream;
//!
//! let address = ProxyAddress::parse("socks5h://bob:p%40ss@127.0.0.1").unwrap();
//! let Upstream::Socks5 { addr, credentials, remote_dns } = Upstream::parse(&address).unwrap()
//! else { unreachable!() };
//! assert_eq!(addr, "127.0.0.1:1080");
//! assert_eq!(credentials, Some(("bob".into(), "p@ss".into())));
//! assert!(remote_dns);
//! ```

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_socks::TargetAddr;
use tokio_socks::tcp::Socks5Stream;

use crate::address::ProxyAddress;
use crate::lease::Outcome;

/// Largest CONNECT answer head accepted from an upstream.
const MAX_HEAD: usize = 16 * 1024;

/// Why an upstream could not be used. Every variant is the upstream's failure as far as the
/// pool is concerned (see [`DialError::outcome`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DialError {
    /// The TCP connection to the upstream failed, or broke during the handshake.
    #[error("cannot reach the upstream: {0}")]
    Connect(std::io::Error),
    /// No answer in time.
    #[error("the upstream did not answer in time")]
    Timeout,
    /// The upstream answered 407: it does not take our credentials.
    #[error("the upstream refused our credentials (407)")]
    ProxyAuth,
    /// The upstream answered CONNECT with another non-2xx status.
    #[error("the upstream refused the tunnel with status {0}")]
    Refused(u16),
    /// The upstream's answer is not HTTP.
    #[error("the upstream answered something that is not HTTP: {0}")]
    Protocol(&'static str),
    /// The SOCKS5 handshake failed (or the proxy refused the target or our credentials).
    #[error("SOCKS5 upstream: {0}")]
    Socks(#[from] tokio_socks::Error),
    /// An HTTP exchange through the upstream broke off.
    #[error("the upstream broke off: {0}")]
    Broken(hyper::Error),
    /// A `socks5://` target name that does not resolve here.
    #[error("cannot resolve the target {0}")]
    Resolve(String),
    /// An address this module cannot dial (`https://` proxies, no host).
    #[error("cannot dial upstream {0}")]
    Unsupported(String),
}

impl DialError {
    /// What the pool hears about it.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Timeout => Outcome::Timeout,
            _ => Outcome::ConnectError,
        }
    }
}

/// An upstream, ready to dial: parse it once per address and keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// An `http://` proxy.
    Http {
        /// `host:port` of the proxy.
        addr: String,
        /// `Proxy-Authorization` value, when the URL has credentials.
        auth: Option<String>,
    },
    /// A `socks5://` or `socks5h://` proxy.
    Socks5 {
        /// `host:port` of the proxy.
        addr: String,
        /// User and password (percent-decoded), when the URL has them.
        credentials: Option<(String, String)>,
        /// `socks5h`: the proxy resolves target names.
        remote_dns: bool,
    },
}

impl Upstream {
    /// The upstream behind `address`; `https://` proxies are not dialed.
    pub fn parse(address: &ProxyAddress) -> Result<Self, DialError> {
        let unsupported = || DialError::Unsupported(address.to_string());
        let url = url::Url::parse(address.as_str()).map_err(|_| unsupported())?;
        let host = url.host_str().ok_or_else(unsupported)?;
        let port = url.port_or_known_default().unwrap_or(match url.scheme() {
            "http" => 80,
            _ => 1080,
        });
        let addr = format!("{host}:{port}");
        let credentials = (!url.username().is_empty())
            .then(|| (decode(url.username()), decode(url.password().unwrap_or(""))));
        match url.scheme() {
            "http" => Ok(Self::Http {
                addr,
                auth: credentials.map(|(u, p)| basic_value(&u, &p)),
            }),
            "socks5" | "socks5h" => Ok(Self::Socks5 {
                addr,
                credentials,
                remote_dns: url.scheme() == "socks5h",
            }),
            _ => Err(unsupported()),
        }
    }
}

/// A percent-encoded URL user or password, as the proxy expects it.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// `Basic base64(user:password)`.
fn basic_value(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// A TCP connection to `addr` (`host:port`), within `timeout`.
pub async fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, DialError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| DialError::Timeout)?
        .map_err(DialError::Connect)?;
    // Requests and tunnel handshakes are small: send them at once.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A byte stream to `host:port` through the upstream, within `timeout`, plus any bytes the
/// upstream sent after its CONNECT answer (they belong to the target and come first).
pub async fn tunnel(
    upstream: &Upstream,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, Bytes), DialError> {
    tokio::time::timeout(timeout, tunnel_inner(upstream, host, port, timeout))
        .await
        .map_err(|_| DialError::Timeout)?
}

async fn tunnel_inner(
    upstream: &Upstream,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, Bytes), DialError> {
    match upstream {
        Upstream::Http { addr, auth } => {
            let mut stream = connect(addr, timeout).await?;
            // CONNECT names the port even when it is the default (RFC 9112 §3.2.3).
            let mut head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n");
            if let Some(auth) = auth {
                head.push_str("Proxy-Authorization: ");
                head.push_str(auth);
                head.push_str("\r\n");
            }
            head.push_str("\r\n");
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(DialError::Connect)?;
            let leftover = read_connect_answer(&mut stream).await?;
            Ok((stream, leftover))
        }
        Upstream::Socks5 {
            addr,
            credentials,
            remote_dns,
        } => {
            let proxy = connect(addr, timeout).await?;
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let target = match bare.parse::<IpAddr>() {
                Ok(ip) => TargetAddr::Ip(SocketAddr::new(ip, port)),
                Err(_) if *remote_dns => TargetAddr::Domain(bare.to_owned().into(), port),
                Err(_) => TargetAddr::Ip(resolve(bare, port).await?),
            };
            let stream = match credentials {
                None => Socks5Stream::connect_with_socket(proxy, target).await?,
                Some((user, password)) => {
                    Socks5Stream::connect_with_password_and_socket(proxy, target, user, password)
                        .await?
                }
            };
            Ok((stream.into_inner(), Bytes::new()))
        }
    }
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, DialError> {
    tokio::net::lookup_host((host, port))
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| DialError::Resolve(host.to_owned()))
}

/// Reads the upstream's answer head to CONNECT; 2xx opens the tunnel.
async fn read_connect_answer(stream: &mut TcpStream) -> Result<Bytes, DialError> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        if stream
            .read_buf(&mut buf)
            .await
            .map_err(DialError::Connect)?
            == 0
        {
            return Err(DialError::Protocol("connection closed before the answer"));
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut answer = httparse::Response::new(&mut headers);
        match answer.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = answer.code.unwrap_or(0);
                return match code {
                    200..=299 => Ok(buf.split_off(len).freeze()),
                    407 => Err(DialError::ProxyAuth),
                    _ => Err(DialError::Refused(code)),
                };
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(DialError::Protocol("answer head too large"));
            }
            Err(_) => return Err(DialError::Protocol("malformed answer head")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let a = ProxyAddress::parse("http://bob:p%40ss@127.0.0.1:3128").unwrap();
        assert_eq!(
            Upstream::parse(&a).unwrap(),
            Upstream::Http {
                addr: "127.0.0.1:3128".into(),
                // base64("bob:p@ss")
                auth: Some("Basic Ym9iOnBAc3M=".into()),
            }
        );
        let a = ProxyAddress::parse("socks5://127.0.0.1:1081").unwrap();
        assert_eq!(
            Upstream::parse(&a).unwrap(),
            Upstream::Socks5 {
                addr: "127.0.0.1:1081".into(),
                credentials: None,
                remote_dns: false,
            }
        );
        let a = ProxyAddress::parse("https://127.0.0.1:443").unwrap();
        assert!(matches!(
            Upstream::parse(&a),
            Err(DialError::Unsupported(_))
        ));
    }
}
