//! Reaching a target through an upstream proxy: an HTTP proxy (`CONNECT`, or a plain
//! connection for absolute-form requests) or a SOCKS5 proxy, with or without credentials.

use crate::auth::basic_value;
use bytes::{Bytes, BytesMut};
use proxypool::{Outcome, ProxyAddress};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_socks::TargetAddr;
use tokio_socks::tcp::Socks5Stream;

/// Largest CONNECT answer head accepted from an upstream.
const MAX_HEAD: usize = 16 * 1024;

/// Why an upstream could not be used. Every variant is the upstream's failure as far as the
/// pool is concerned (see [`DialError::outcome`]).
#[derive(Debug, Error)]
pub(crate) enum DialError {
    #[error("cannot reach the upstream: {0}")]
    Connect(std::io::Error),
    #[error("the upstream did not answer in time")]
    Timeout,
    #[error("the upstream refused our credentials (407)")]
    ProxyAuth,
    #[error("the upstream refused the tunnel with status {0}")]
    Refused(u16),
    #[error("the upstream answered something that is not HTTP: {0}")]
    Protocol(&'static str),
    #[error("SOCKS5 upstream: {0}")]
    Socks(#[from] tokio_socks::Error),
    #[error("the upstream broke off: {0}")]
    Broken(hyper::Error),
    #[error("cannot resolve the target {0}")]
    Resolve(String),
    #[error("the gateway cannot use upstream {0}")]
    Unsupported(String),
}

impl DialError {
    /// What the pool hears about it.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Self::Timeout => Outcome::Timeout,
            _ => Outcome::ConnectError,
        }
    }
}

/// An upstream, ready to dial.
#[derive(Debug)]
pub(crate) enum Upstream {
    Http {
        addr: String,
        /// `Proxy-Authorization` value, when the URL has credentials.
        auth: Option<String>,
    },
    Socks5 {
        addr: String,
        credentials: Option<(String, String)>,
        /// `socks5h`: the proxy resolves target names.
        remote_dns: bool,
    },
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Upstream {
    pub(crate) fn parse(address: &ProxyAddress) -> Result<Self, DialError> {
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

/// A TCP connection to `addr`, within `timeout`.
pub(crate) async fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, DialError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| DialError::Timeout)?
        .map_err(DialError::Connect)?;
    // Requests and tunnel handshakes are small: send them at once.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A byte stream to `host:port` through the upstream, plus any bytes the upstream sent after
/// its CONNECT answer (they belong to the target and go to the client first).
pub(crate) async fn tunnel(
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn upstream_urls() {
        let a = ProxyAddress::parse("http://bob:p%40ss@127.0.0.1:3128").unwrap();
        match Upstream::parse(&a).unwrap() {
            Upstream::Http { addr, auth } => {
                assert_eq!(addr, "127.0.0.1:3128");
                assert_eq!(auth.unwrap(), basic_value("bob", "p@ss"));
            }
            other => panic!("{other:?}"),
        }
        let a = ProxyAddress::parse("socks5h://127.0.0.1").unwrap();
        match Upstream::parse(&a).unwrap() {
            Upstream::Socks5 {
                addr,
                credentials,
                remote_dns,
            } => {
                assert_eq!(addr, "127.0.0.1:1080");
                assert!(credentials.is_none() && remote_dns);
            }
            other => panic!("{other:?}"),
        }
        let a = ProxyAddress::parse("https://127.0.0.1:443").unwrap();
        assert!(Upstream::parse(&a).is_err());
    }
}
