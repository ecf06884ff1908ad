//! Bearer tokens and client addresses.

use super::App;
use super::error::ApiError;
use axum::http::{HeaderMap, header};
use shortener_core::audit::Origin;
use shortener_core::link::Actor;
use shortener_core::token::{Principal, TokenHash};
use std::net::{IpAddr, SocketAddr};

/// The principal behind the request's bearer token; `None` when there is no
/// `Authorization` header at all. A header that is present but wrong is a 401, never
/// anonymous access.
pub(super) async fn principal(
    app: &App,
    headers: &HeaderMap,
) -> Result<Option<Principal>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| {
            ApiError::unauthorized("invalid_token", "Authorization must be 'Bearer <token>'")
        })?;
    match app.store.find_token(&TokenHash::of(token)).await? {
        Some(p) => Ok(Some(p)),
        None => Err(ApiError::unauthorized(
            "invalid_token",
            "the bearer token is not valid",
        )),
    }
}

/// Like [`principal`], but a token is required.
pub(super) async fn required_principal(
    app: &App,
    headers: &HeaderMap,
) -> Result<Principal, ApiError> {
    principal(app, headers).await?.ok_or_else(|| {
        ApiError::unauthorized("authentication_required", "a bearer token is required")
    })
}

/// The client's address: the TCP peer, or, behind a trusted proxy, the last address that
/// proxy appended to `X-Forwarded-For`.
pub(super) fn client_ip(app: &App, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    if app.trust_forwarded_for {
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|s| s.trim().parse::<IpAddr>().ok())
            .next_back();
        if let Some(ip) = forwarded {
            return ip;
        }
    }
    peer.ip()
}

/// Longest User-Agent kept in the audit trail.
const MAX_USER_AGENT: usize = 512;

/// Who is asking and from where, for the audit trail.
pub(super) fn origin(
    app: &App,
    peer: SocketAddr,
    headers: &HeaderMap,
    who: Option<&Principal>,
) -> Origin {
    Origin {
        actor: who.map_or_else(Actor::anonymous, Actor::of),
        ip: Some(client_ip(app, peer, headers).to_string()),
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| ua.chars().take(MAX_USER_AGENT).collect()),
    }
}
