//! The gateway's own answers: plain text, with the reason's code in `X-Proxypool-Error` so
//! clients can tell a broken session from an upstream failure without parsing prose.

use super::GatewayBody;
use http_body_util::{Either, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use proxypool::AcquireError;
use std::time::Duration;

pub(super) const ERROR_HEADER: &str = "x-proxypool-error";

pub(super) fn error(
    status: StatusCode,
    code: &'static str,
    message: &str,
) -> Response<GatewayBody> {
    let mut response = Response::new(Either::Left(Full::from(format!("{message}\n"))));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(ERROR_HEADER, HeaderValue::from_static(code));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// 413 for a request body past `--max-body-bytes`; the rest of it is not read, so the
/// connection closes.
pub(super) fn body_too_large() -> Response<GatewayBody> {
    let mut response = error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "the request body is larger than --max-body-bytes",
    );
    service_edge::close_after(&mut response);
    response
}

pub(super) fn proxy_auth_required() -> Response<GatewayBody> {
    let mut response = error(
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        "auth-required",
        "proxy credentials required (Proxy-Authorization: Basic)",
    );
    response.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"proxypool\""),
    );
    response
}

fn with_retry_after(mut response: Response<GatewayBody>, wait: Duration) -> Response<GatewayBody> {
    let secs = wait.as_secs().max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

/// What a client gets when the pool has no lease for its request. The counter label is the
/// second element.
pub(super) fn no_lease(e: &AcquireError) -> (Response<GatewayBody>, &'static str) {
    match e {
        AcquireError::SessionBroken { key, address } => (
            error(
                StatusCode::BAD_GATEWAY,
                "session-broken",
                &format!(
                    "session {key} is broken: its upstream {address} is out of service (quarantined, dead or removed); end this session and start a new one"
                ),
            ),
            "session_broken",
        ),
        AcquireError::BoundAddressBusy { key, .. } => (
            with_retry_after(
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "session-busy",
                    &format!("session {key}: its upstream is at its lease cap; retry shortly"),
                ),
                Duration::from_secs(1),
            ),
            "session_busy",
        ),
        AcquireError::BoundAddressCooling { key, retry_in, .. } => (
            with_retry_after(
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "session-cooling",
                    &format!(
                        "session {key}: the site rate-limited its upstream; retry in {} s",
                        retry_in.as_secs().max(1)
                    ),
                ),
                *retry_in,
            ),
            "session_cooling",
        ),
        AcquireError::StoreUnavailable(reason) => (
            with_retry_after(
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    &format!("the pool's store (Redis) is unavailable: {reason}; retry shortly"),
                ),
                Duration::from_secs(1),
            ),
            "store_unavailable",
        ),
        _ => (
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no-upstream",
                &format!("no upstream available: {e}"),
            ),
            "no_upstream",
        ),
    }
}
