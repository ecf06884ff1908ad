//! `POST /v1/acquire`, `/v1/release`, `/v1/feedback`: the pool's two calls for workers that
//! do their own network work, and outcome reports for gateway sessions (what a client saw
//! inside an HTTPS tunnel, which the gateway cannot see).

use super::ApiState;
use super::error::{ApiError, ErrorBody};
use super::json::ApiJson;
use crate::sessions::parse_username;
use crate::site::site_of;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use proxypool::{Choice, Lease, Outcome, Ticket};
use serde::{Deserialize, Serialize};
use service_edge::WholeNumber;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use utoipa::ToSchema;

/// Leases handed out through the API, until released or past their TTL.
#[derive(Debug, Default)]
pub(crate) struct LeaseBook {
    held: Mutex<HashMap<u64, Held>>,
}

#[derive(Debug)]
struct Held {
    lease: Lease,
    acquired: Instant,
    expires: Instant,
}

impl LeaseBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        match self.held.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Forgets leases past their TTL: the pool has expired them already (P14); dropping them
    /// here frees nothing twice.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<Held> = {
            let mut held = self.lock();
            let ids: Vec<u64> = held
                .iter()
                .filter(|(_, h)| h.expires < now)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        drop(expired);
    }
}

/// What a worker asks for.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireRequest {
    /// Business-session key (e.g. an account id): the same key keeps its address.
    key: Option<String>,
    /// The target site (a host name is reduced to its registrable domain).
    site: Option<String>,
    /// A sub-pool of the pool. This server declares none, so the document leaves the field
    /// out: naming one answers 400 `unknown_sub_pool`.
    #[schema(ignore)]
    sub_pool: Option<String>,
}

/// A lease on an address.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AcquireResponse {
    lease_id: u64,
    /// The proxy URL to send the work through, credentials included.
    address: String,
    /// When the lease expires unless released (ms since the Unix epoch).
    expires_at: u64,
    /// Why this address: `bound`, `hashed`, `round_robin`, `weighted`, `least_connections`.
    #[schema(value_type = String)]
    choice: Choice,
}

/// How the work went.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum OutcomeName {
    Success,
    ConnectError,
    Timeout,
    Blocked,
    Captcha,
    RateLimited,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReleaseRequest {
    #[schema(value_type = u64)]
    lease_id: WholeNumber,
    outcome: OutcomeName,
    /// Latency of a success; the time since the acquire when absent.
    #[schema(value_type = Option<u64>)]
    latency_ms: Option<WholeNumber>,
    /// How long a rate-limiting site asked to wait [default: 60].
    #[schema(value_type = Option<u64>)]
    retry_after_s: Option<WholeNumber>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct FeedbackRequest {
    /// The session as named in the proxy username: `NAME-session-ID`, a `-ttl-M` suffix
    /// allowed. The pattern is the form the gateway's usernames take; a session the gateway
    /// has not seen answers 404.
    #[schema(
        pattern = r"^[^\s-]\S*-session-[^\s-]+(-ttl-[1-9][0-9]{0,5})?$",
        example = "alice-session-cart42"
    )]
    session: String,
    /// The site the outcome was seen on (a host name is reduced to its registrable domain).
    site: String,
    outcome: OutcomeName,
    /// Latency of a success (required for `success`).
    #[schema(value_type = Option<u64>)]
    latency_ms: Option<WholeNumber>,
    /// How long a rate-limiting site asked to wait [default: 60].
    #[schema(value_type = Option<u64>)]
    retry_after_s: Option<WholeNumber>,
}

const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);

fn outcome(
    name: OutcomeName,
    latency: Option<Duration>,
    retry_after_s: Option<WholeNumber>,
) -> Option<Outcome> {
    Some(match name {
        OutcomeName::Success => Outcome::Success { latency: latency? },
        OutcomeName::ConnectError => Outcome::ConnectError,
        OutcomeName::Timeout => Outcome::Timeout,
        OutcomeName::Blocked => Outcome::Blocked,
        OutcomeName::Captcha => Outcome::Captcha,
        OutcomeName::RateLimited => Outcome::RateLimited {
            retry_after: retry_after_s.map_or(DEFAULT_RETRY_AFTER, |s| Duration::from_secs(s.0)),
        },
    })
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Take a lease.
#[utoipa::path(post, path = "/v1/acquire", request_body = AcquireRequest,
    responses(
        (status = 200, body = AcquireResponse),
        (status = 400, description = "`invalid_body`: not JSON of this shape; `unknown_sub_pool`", body = ErrorBody),
        (status = 409, description = "the key's session is broken: end it", body = ErrorBody),
        (status = 503, description = "`no_address`: no address can take the request now (none left, all busy or cooling; `Retry-After` for a bound key); `store_unavailable`: the store (Redis) does not answer, with `Retry-After`", body = ErrorBody),
    ))]
pub(super) async fn acquire(
    State(api): State<ApiState>,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<axum::Json<AcquireResponse>, ApiError> {
    let mut ticket = Ticket::new();
    if let Some(key) = req.key.filter(|k| !k.is_empty()) {
        ticket = ticket.key(key);
    }
    if let Some(site) = req.site.filter(|s| !s.is_empty()) {
        ticket = ticket.site(site_of(&site));
    }
    if let Some(sub_pool) = req.sub_pool {
        ticket = ticket.sub_pool(sub_pool);
    }
    let lease = api.pool.acquire(ticket).await?;
    let now = Instant::now();
    let response = AcquireResponse {
        lease_id: lease.id().get(),
        address: lease.address().as_str().to_owned(),
        expires_at: unix_ms(SystemTime::now() + api.lease_ttl),
        choice: lease.choice(),
    };
    api.leases.lock().insert(
        response.lease_id,
        Held {
            lease,
            acquired: now,
            expires: now + api.lease_ttl,
        },
    );
    Ok(axum::Json(response))
}

/// Return a lease with the outcome of its work.
#[utoipa::path(post, path = "/v1/release", request_body = ReleaseRequest,
    responses(
        (status = 204, description = "released"),
        (status = 400, description = "`invalid_body`: not JSON of this shape", body = ErrorBody),
        (status = 404, description = "no such open lease (released, or past its TTL)", body = ErrorBody),
        (status = 503, description = "`pool_unavailable`: the store is unreachable", body = ErrorBody),
    ))]
pub(super) async fn release(
    State(api): State<ApiState>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let held = api.leases.lock().remove(&req.lease_id.0).ok_or_else(|| {
        ApiError::not_found(
            "unknown_lease",
            format!(
                "lease {} is not open (released, or past its TTL)",
                req.lease_id.0
            ),
        )
    })?;
    let latency = req
        .latency_ms
        .map_or_else(|| held.acquired.elapsed(), |ms| Duration::from_millis(ms.0));
    let outcome = outcome(req.outcome, Some(latency), req.retry_after_s)
        .ok_or_else(|| ApiError::bad_request("invalid_body", "no outcome"))?;
    held.lease.release(outcome).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "pool_unavailable",
            e.to_string(),
        )
    })?;
    Ok(StatusCode::NO_CONTENT)
}

/// Report what a gateway session saw, e.g. a captcha inside an HTTPS tunnel. It counts for the
/// session's current upstream and the site, as a release would.
#[utoipa::path(post, path = "/v1/feedback", request_body = FeedbackRequest,
    responses(
        (status = 204, description = "recorded"),
        (status = 400, description = "`invalid_body`: not JSON of this shape, or `success` without `latency_ms`; `invalid_session`: no session in the name", body = ErrorBody),
        (status = 404, description = "no live gateway session of that name", body = ErrorBody),
        (status = 409, description = "the session is broken or has expired", body = ErrorBody),
        (status = 503, description = "no address can take the session's report, or the store is unreachable", body = ErrorBody),
    ))]
pub(super) async fn feedback(
    State(api): State<ApiState>,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let Some(session) = parse_username(&req.session).session else {
        return Err(ApiError::bad_request(
            "invalid_session",
            "session must look like NAME-session-ID",
        ));
    };
    let outcome = outcome(
        req.outcome,
        req.latency_ms.map(|ms| Duration::from_millis(ms.0)),
        req.retry_after_s,
    )
    .ok_or_else(|| ApiError::bad_request("invalid_body", "latency_ms is required for success"))?;
    let pool_key = api.sessions.lookup(session.key).ok_or_else(|| {
        ApiError::not_found(
            "unknown_session",
            format!("no live gateway session {}", session.key),
        )
    })?;
    // The public pool API has no outcome without a lease: take the session's lease (its
    // binding), check it is the bound address, and release it with the outcome.
    let lease = api
        .pool
        .acquire(Ticket::new().key(pool_key).site(site_of(&req.site)))
        .await?;
    if lease.choice() != Choice::Bound {
        drop(lease);
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_expired",
            format!("session {} has no upstream binding any more", session.key),
        ));
    }
    lease.release(outcome).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "pool_unavailable",
            e.to_string(),
        )
    })?;
    Ok(StatusCode::NO_CONTENT)
}
