//! Who is looking at a page: sessions and CSRF tokens, both in cookies signed with the
//! store's web key.
//!
//! A session cookie carries the SHA-256 of the token the person pasted (never the token),
//! an expiry and an HMAC; every request asks the store for that hash as a bearer request
//! would, so a revoked token ends its sessions at once on every instance, and any instance
//! accepts a session another one issued. The hash grants nothing on the API, which hashes
//! what it is given.

use super::super::App;
use super::super::auth::{client_ip, principal_of};
use super::super::error::ApiError;
use crate::ratelimit::Creator;
use axum::http::{HeaderMap, HeaderValue, header};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use shortener_core::day::UnixSeconds;
use shortener_core::token::{Principal, TokenHash};
use std::net::SocketAddr;

const SESSION_COOKIE: &str = "shortener_session";
const CSRF_COOKIE: &str = "shortener_csrf";
/// How long a sign-in lasts.
const SESSION_SECONDS: i64 = 7 * 86_400;
/// The CSRF cookie outlives sessions; a stale form is refused, nothing more.
const CSRF_SECONDS: i64 = 30 * 86_400;

/// The person behind a request to a page.
#[derive(Debug)]
pub(super) struct Visitor {
    /// `None`: not signed in.
    pub who: Option<Principal>,
    /// What the page's forms send back as `csrf`.
    pub csrf: String,
    /// `Set-Cookie` values the response must carry.
    set_cookies: Vec<String>,
    /// Whether cookies get `Secure`.
    secure: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

fn mac(key: &[u8], purpose: &str, value: &str) -> Hmac<Sha256> {
    // HMAC takes keys of any length; the error case does not exist.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(purpose.as_bytes());
    mac.update(b"|");
    mac.update(value.as_bytes());
    mac
}

/// The signature of `value` for `purpose` (`session`, `csrf`, `created`), in hex.
pub(super) fn sign(key: &[u8], purpose: &str, value: &str) -> String {
    hex(&mac(key, purpose, value).finalize().into_bytes())
}

/// Whether `signature` is [`sign`]'s for `value`, compared in constant time.
pub(super) fn verify(key: &[u8], purpose: &str, value: &str, signature: &str) -> bool {
    unhex(signature).is_some_and(|bytes| mac(key, purpose, value).verify_slice(&bytes).is_ok())
}

/// The value of cookie `name`, if the request sent it.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// Cookies get `Secure` when the service is reached over HTTPS: its `--base-url` is
/// `https://…`, or a proxy in front says so with `X-Forwarded-Proto: https`.
fn is_https(app: &App, headers: &HeaderMap) -> bool {
    app.base_url.starts_with("https://")
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value: scoped to the web app's paths (redirects never carry it), out of
/// scripts' reach, never sent with a request another site starts.
fn set_cookie(name: &str, value: &str, max_age: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; Path=/_/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

/// The session cookie's value for the token hashing to `hash`, until `expires`.
fn session_value(key: &[u8], hash: &TokenHash, expires: UnixSeconds) -> String {
    let body = format!("{}.{expires}", hex(&hash.0));
    let signature = sign(key, "session", &body);
    format!("{body}.{signature}")
}

/// The token hash of a well-signed, unexpired session cookie.
fn session_hash(key: &[u8], value: &str, now: UnixSeconds) -> Option<TokenHash> {
    let (body, signature) = value.rsplit_once('.')?;
    if !verify(key, "session", body, signature) {
        return None;
    }
    let (hash, expires) = body.split_once('.')?;
    if expires.parse::<UnixSeconds>().ok()? <= now {
        return None;
    }
    Some(TokenHash(unhex(hash)?.try_into().ok()?))
}

impl Visitor {
    /// Who sent `headers`: the session's principal if its token is still valid (asked of the
    /// store), and the CSRF token of their forms (with a fresh cookie when they had none).
    pub(super) async fn of(app: &App, headers: &HeaderMap) -> Result<Self, ApiError> {
        let secure = is_https(app, headers);
        let mut set_cookies = Vec::new();
        let now = crate::now();
        let who = match cookie(headers, SESSION_COOKIE) {
            None => None,
            Some(value) => {
                let found = match session_hash(&app.web_key, value, now) {
                    Some(hash) => principal_of(app, hash).await?,
                    None => None,
                };
                if found.is_none() {
                    // Expired, forged or revoked: forget it.
                    set_cookies.push(set_cookie(SESSION_COOKIE, "", 0, secure));
                }
                found
            }
        };
        let csrf_cookie = match cookie(headers, CSRF_COOKIE).filter(|c| is_csrf_cookie(c)) {
            Some(value) => value.to_owned(),
            None => {
                let value = hex(&rand::random::<[u8; 16]>());
                set_cookies.push(set_cookie(CSRF_COOKIE, &value, CSRF_SECONDS, secure));
                value
            }
        };
        Ok(Self {
            who,
            csrf: sign(&app.web_key, "csrf", &csrf_cookie),
            set_cookies,
            secure,
        })
    }

    /// Whether a form's `csrf` field is the one this visitor's pages carry. A visitor who
    /// came without the CSRF cookie (a request another site made, a cleared browser) has a
    /// fresh one that no form carries yet.
    pub(super) fn csrf_ok(&self, app: &App, headers: &HeaderMap, sent: Option<&str>) -> bool {
        match (
            cookie(headers, CSRF_COOKIE).filter(|c| is_csrf_cookie(c)),
            sent,
        ) {
            (Some(cookie), Some(sent)) => verify(&app.web_key, "csrf", cookie, sent),
            _ => false,
        }
    }

    /// Signs in: the session cookie for the token hashing to `hash`.
    pub(super) fn start_session(&mut self, app: &App, hash: &TokenHash) {
        let value = session_value(&app.web_key, hash, crate::now() + SESSION_SECONDS);
        self.set_cookies.push(set_cookie(
            SESSION_COOKIE,
            &value,
            SESSION_SECONDS,
            self.secure,
        ));
    }

    /// Signs out: the session cookie is cleared.
    pub(super) fn end_session(&mut self) {
        self.who = None;
        self.set_cookies
            .push(set_cookie(SESSION_COOKIE, "", 0, self.secure));
    }

    /// The `Set-Cookie` headers of the response.
    pub(super) fn cookie_headers(&self) -> impl Iterator<Item = HeaderValue> + '_ {
        self.set_cookies
            .iter()
            .filter_map(|c| HeaderValue::from_str(c).ok())
    }
}

fn is_csrf_cookie(value: &str) -> bool {
    value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Takes one sign-in attempt from the client's hourly budget, or says when to retry.
pub(super) async fn admit_sign_in(
    app: &App,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(), u64> {
    app.limits
        .check(Creator::SignIn(client_ip(app, peer, headers)))
        .await
        .map(|_| ())
        .map_err(|refused| refused.retry_after.as_secs().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_signed_and_expire() {
        let key = [7u8; 32];
        let hash = TokenHash::of("shk_a");
        let value = session_value(&key, &hash, 1_000);
        assert_eq!(session_hash(&key, &value, 999), Some(hash));
        assert_eq!(session_hash(&key, &value, 1_000), None);
        assert_eq!(session_hash(&[8u8; 32], &value, 999), None);
        // Another hash or a later expiry under the old signature.
        let (_, signature) = value.rsplit_once('.').unwrap();
        let other = format!("{}.1000.{signature}", hex(&TokenHash::of("shk_b").0));
        assert_eq!(session_hash(&key, &other, 999), None);
        let later = value.replace(".1000.", ".9999.");
        assert_eq!(session_hash(&key, &later, 999), None);
        for garbage in ["", ".", "a.b.c", "zz.1.zz"] {
            assert_eq!(session_hash(&key, garbage, 0), None);
        }
    }

    #[test]
    fn cookies_are_read_from_every_cookie_header() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; b=2"));
        headers.append(header::COOKIE, HeaderValue::from_static("c=3"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "c"), Some("3"));
        assert_eq!(cookie(&headers, "d"), None);
    }
}
