//! Bearer tokens and client addresses.

use super::App;
use super::error::ApiError;
use axum::http::{HeaderMap, header};
use shortener_core::audit::Origin;
use shortener_core::day::UnixSeconds;
use shortener_core::link::Actor;
use shortener_core::store::FoundToken;
use shortener_core::token::{Principal, TokenHash, last_use_is_stale};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a token found in the store is trusted without asking again: a revoke reaches
/// every instance within this (the lookup itself goes to the primary, never a replica).
pub(crate) const TOKEN_TTL: Duration = Duration::from_millis(500);
/// Past this many cached tokens, expired ones are swept before another is added.
const TOKEN_CACHE_SWEEP_AT: usize = 4096;

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
    match principal_of(app, TokenHash::of(token)).await? {
        Some(found) => Ok(Some(found)),
        None => Err(ApiError::unauthorized(
            "invalid_token",
            "the bearer token is not valid",
        )),
    }
}

/// Whose token hashes to `hash` (`None`: unknown or revoked), asked of the store at most
/// every [`TOKEN_TTL`] so that a revoke counts within it; records the use now and then.
/// Bearer tokens and the web app's sessions both end here.
pub(super) async fn principal_of(
    app: &App,
    hash: TokenHash,
) -> Result<Option<Principal>, ApiError> {
    let checked = Instant::now();
    let found = match app.tokens.get(&hash, checked) {
        Some(found) => Some(found),
        None => {
            let found = app.store.find_token(&hash).await?;
            match &found {
                Some(found) => app.tokens.put(hash, found.clone(), checked),
                None => app.tokens.forget(&hash),
            }
            found
        }
    };
    match found {
        Some(found) => {
            let now = crate::now();
            if app.token_uses.claim(hash, found.last_used_at, now) {
                // "Last used" is approximate: a failed write must not fail the request.
                let store = app.store.clone();
                tokio::spawn(async move {
                    if let Err(e) = store.touch_token(&hash, now).await {
                        tracing::warn!(error = %e, "cannot record a token's last use");
                    }
                });
            }
            Ok(Some(found.principal))
        }
        None => Ok(None),
    }
}

/// Tokens found in the store lately, each with when it was looked up. Unknown tokens are
/// never kept (a flood of made-up ones must not grow it); known ones are bounded by the store.
#[derive(Debug)]
pub(crate) struct TokenCache {
    ttl: Duration,
    found: Mutex<HashMap<TokenHash, (Instant, FoundToken)>>,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new(TOKEN_TTL)
    }
}

impl TokenCache {
    fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            found: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenHash, (Instant, FoundToken)>> {
        self.found.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token as looked up less than the TTL before `now`.
    fn get(&self, hash: &TokenHash, now: Instant) -> Option<FoundToken> {
        match self.lock().get(hash) {
            Some((at, found)) if now.saturating_duration_since(*at) < self.ttl => {
                Some(found.clone())
            }
            _ => None,
        }
    }

    /// Remembers a lookup that started at `at` (not when it answered: the TTL bounds how old
    /// the store's answer may be).
    fn put(&self, hash: TokenHash, found: FoundToken, at: Instant) {
        let mut cached = self.lock();
        if cached.len() >= TOKEN_CACHE_SWEEP_AT {
            let ttl = self.ttl;
            cached.retain(|_, (looked_up, _)| at.saturating_duration_since(*looked_up) < ttl);
        }
        cached.insert(hash, (at, found));
    }

    fn forget(&self, hash: &TokenHash) {
        self.lock().remove(hash);
    }
}

/// Which tokens this process has recorded a use of, and when: requests that arrive while a
/// first write is in flight (all seeing the old stored value) do not write again.
#[derive(Debug, Default)]
pub(crate) struct TokenUses(Mutex<HashMap<TokenHash, UnixSeconds>>);

impl TokenUses {
    /// Whether a request at `now` should write the token's last use, given the stored value.
    fn claim(&self, hash: TokenHash, stored: Option<UnixSeconds>, now: UnixSeconds) -> bool {
        if !last_use_is_stale(stored, now) {
            return false;
        }
        let mut written = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = written.get(&hash).copied();
        if !last_use_is_stale(mine.max(stored), now) {
            return false;
        }
        written.insert(hash, now);
        true
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
        ip: Some(ip_text(client_ip(app, peer, headers))),
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| match ua.len() <= MAX_USER_AGENT {
                // No more bytes than the limit: no more characters either.
                true => ua.to_owned(),
                false => ua.chars().take(MAX_USER_AGENT).collect(),
            }),
    }
}

/// `ip` as `Display` writes it. An IPv4 address is written here digit by digit: through
/// `Display` it cost a create over 1 300 instructions of formatting machinery.
fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(user: &str) -> FoundToken {
        FoundToken {
            principal: Principal {
                user: user.into(),
                admin: false,
            },
            last_used_at: None,
        }
    }

    #[test]
    fn a_token_is_trusted_for_the_ttl_from_its_lookup_then_asked_for_again() {
        let cache = TokenCache::new(Duration::from_millis(500));
        let (a, b) = (TokenHash::of("shk_a"), TokenHash::of("shk_b"));
        let t0 = Instant::now();
        assert_eq!(cache.get(&a, t0), None);
        cache.put(a, found("alice"), t0);
        assert_eq!(
            cache.get(&a, t0 + Duration::from_millis(499)),
            Some(found("alice"))
        );
        assert_eq!(cache.get(&a, t0 + Duration::from_millis(500)), None);
        assert_eq!(cache.get(&b, t0), None);
        // A lookup that found nothing (revoked) drops what was kept.
        cache.put(b, found("bob"), t0);
        cache.forget(&b);
        assert_eq!(cache.get(&b, t0), None);
    }

    #[test]
    fn expired_tokens_are_swept_once_many_are_kept() {
        let cache = TokenCache::new(Duration::from_millis(500));
        let t0 = Instant::now();
        for i in 0..TOKEN_CACHE_SWEEP_AT {
            cache.put(TokenHash::of(&format!("shk_{i}")), found("x"), t0);
        }
        let later = t0 + Duration::from_secs(1);
        cache.put(TokenHash::of("shk_new"), found("y"), later);
        assert_eq!(cache.lock().len(), 1);
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.9.99.100",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    #[test]
    fn a_use_is_written_once_a_minute_per_process() {
        let uses = TokenUses::default();
        let hash = TokenHash::of("shk_a");
        assert!(uses.claim(hash, None, 1_000));
        // Concurrent requests still see the old stored value; this process wrote already.
        assert!(!uses.claim(hash, None, 1_001));
        assert!(!uses.claim(hash, Some(1_000), 1_059));
        assert!(uses.claim(hash, Some(1_000), 1_060));
        // Another token is its own.
        assert!(uses.claim(TokenHash::of("shk_b"), None, 1_001));
    }
}
