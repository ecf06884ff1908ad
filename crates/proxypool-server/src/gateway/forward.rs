//! Absolute-form plain HTTP (`GET http://host/path`): the request goes through the leased
//! upstream — in absolute form to an HTTP proxy, in origin form through a SOCKS5 tunnel — and
//! its answer is judged for the pool: 407 (our upstream credentials) and 5xx are failures,
//! 403 a block, 429 a rate limit (with `Retry-After`), a captcha marker in the body a captcha,
//! anything else a success with the time to the response head.

use super::connect::upstream_failed;
use super::headers::strip_hop_by_hop;
use super::report::{CaptchaScan, Pending, Reported, release_now};
use super::{Gateway, GatewayBody, Target, reply};
use http_body_util::{Either, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::uri::{PathAndQuery, Uri};
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use proxypool::dial::{self, DialError, Upstream};
use proxypool::{Lease, Outcome};
use std::time::{Duration, Instant, SystemTime};

pub(super) async fn forward(
    gw: &Gateway,
    request: Request<Incoming>,
    target: &Target,
    lease: Lease,
    started: Instant,
) -> (Response<GatewayBody>, &'static str) {
    let upstream = match gw.upstream(lease.address()) {
        Ok(u) => u,
        Err(e) => return upstream_failed(lease, &e),
    };
    let (mut parts, body) = request.into_parts();
    let body = Limited::new(body, gw.settings.client_limits.max_body_bytes);
    strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(header::HOST)
        && let Some(authority) = parts.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = Version::HTTP_11;
    let timeout = gw.settings.connect_timeout;
    let stream = match &*upstream {
        Upstream::Http { addr, auth } => {
            if let Some(auth) = auth.as_deref().and_then(|a| HeaderValue::from_str(a).ok()) {
                parts.headers.insert(header::PROXY_AUTHORIZATION, auth);
            }
            dial::connect(addr, timeout).await
        }
        Upstream::Socks5 { .. } => {
            let path = parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            parts.uri = Uri::from(path);
            dial::tunnel(&upstream, &target.host, target.port, timeout)
                .await
                .map(|(stream, _)| stream)
        }
    };
    let stream = match stream {
        Ok(s) => s,
        Err(e) => return upstream_failed(lease, &e),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return upstream_failed(lease, &DialError::Broken(e)),
        };
    // The connection is driven in this task until the answer's head is in, then by the
    // response body (`Reported`): no task and no hand-over between workers per request.
    let mut connection = Box::pin(connection);
    let mut connection_done = false;
    let sent = tokio::time::timeout(gw.settings.response_timeout, async {
        let answer = sender.send_request(Request::from_parts(parts, body));
        tokio::pin!(answer);
        tokio::select! {
            biased;
            answer = &mut answer => answer.map_err(DialError::Broken),
            ended = connection.as_mut() => {
                connection_done = true;
                match ended {
                    // An upstream that closes after answering ends the connection as soon as
                    // the answer is read: the answer is still to be taken.
                    Ok(()) => answer.await.map_err(DialError::Broken),
                    Err(e) => Err(DialError::Broken(e)),
                }
            }
        }
    })
    .await;
    let response = match sent {
        Ok(Ok(response)) => response,
        // The client's fault, not the upstream's: the lease goes back unjudged.
        Ok(Err(DialError::Broken(e))) if past_limit(&e) => {
            drop(lease);
            return (reply::body_too_large(), "body_too_large");
        }
        Ok(Err(e)) => return upstream_failed(lease, &e),
        Err(_) => return upstream_failed(lease, &DialError::Timeout),
    };
    let latency = started.elapsed();
    let (mut head, body) = response.into_parts();
    if head.status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        // The upstream wants credentials we do not have; passing its 407 on would make the
        // client think it should authenticate to us.
        return upstream_failed(lease, &DialError::ProxyAuth);
    }
    strip_hop_by_hop(&mut head.headers);
    let verdict = match head.status.as_u16() {
        500..=599 => Some((Outcome::ConnectError, "upstream_5xx")),
        403 => Some((Outcome::Blocked, "blocked")),
        429 => Some((
            Outcome::RateLimited {
                retry_after: retry_after(&head.headers).unwrap_or(gw.settings.default_retry_after),
            },
            "rate_limited",
        )),
        _ => None,
    };
    let (pending, label) = match verdict {
        Some((outcome, label)) => {
            release_now(lease, outcome);
            (None, label)
        }
        None => (
            Some(Pending {
                lease,
                latency,
                scan: CaptchaScan::new(gw.markers.clone(), gw.settings.captcha_scan_bytes),
            }),
            "ok",
        ),
    };
    (
        Response::from_parts(
            head,
            Either::Right(Reported::new(
                body,
                pending,
                (!connection_done).then_some(connection),
            )),
        ),
        label,
    )
}

/// Whether sending failed because the client's body passed `--max-body-bytes`.
fn past_limit(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<LengthLimitError>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(120)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(600));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&later).unwrap_or(HeaderValue::from_static("x")),
        );
        let got = retry_after(&h).unwrap_or_default();
        assert!(
            got > Duration::from_secs(590) && got <= Duration::from_secs(600),
            "{got:?}"
        );
    }
}
