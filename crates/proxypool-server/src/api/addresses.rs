//! `GET/POST /v1/addresses`, `DELETE /v1/addresses/{id}`, `GET /v1/matrix`, `GET /v1/snapshot`:
//! what the pool holds and how each address and address × site pair is doing.

use super::ApiState;
use super::error::{ApiError, ErrorBody};
use super::json::ApiJson;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use proxypool::dial::Upstream;
use proxypool::{AddressSnapshot, HealthState, ProxyAddress, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::ToSchema;

/// One address (password hidden) with its health and figures.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AddressView {
    /// Stable id for `DELETE /v1/addresses/{id}`.
    id: Option<String>,
    address: String,
    /// `healthy`, `degraded`, `quarantined`, `probing` or `dead`.
    #[schema(value_type = String)]
    state: HealthState,
    reason: String,
    state_since_ms: u64,
    weight: f64,
    success_rate: Option<f64>,
    captcha_rate: Option<f64>,
    latency_p50_ms: Option<u32>,
    latency_p95_ms: Option<u32>,
    active_leases: u32,
    bound_keys: u64,
    window_samples: usize,
    quarantined_until_ms: Option<u64>,
    quarantine_entries: u32,
    failed_cycles: u32,
    leases: u64,
    successes: u64,
    failures: u64,
    captchas: u64,
    rate_limited: u64,
}

fn view(a: AddressSnapshot, ids: &HashMap<String, Vec<String>>) -> AddressView {
    // Two addresses that differ only in their password cannot be told apart from a snapshot
    // row; such rows carry no id.
    let id = ids
        .get(&a.address)
        .filter(|v| v.len() == 1)
        .and_then(|v| v.first().cloned());
    AddressView {
        id,
        state: a.state,
        reason: a.reason,
        state_since_ms: a.state_since_ms,
        weight: a.weight,
        success_rate: a.success_rate,
        captcha_rate: a.captcha_rate,
        latency_p50_ms: a.latency_p50_ms,
        latency_p95_ms: a.latency_p95_ms,
        active_leases: a.active_leases,
        bound_keys: a.bound_keys,
        window_samples: a.window_samples,
        quarantined_until_ms: a.quarantined_until_ms,
        quarantine_entries: a.quarantine_entries,
        failed_cycles: a.failed_cycles,
        leases: a.totals.leases,
        successes: a.totals.successes,
        failures: a.totals.failures,
        captchas: a.totals.captchas,
        rate_limited: a.totals.rate_limited,
        address: a.address,
    }
}

/// Every address with its state, weight and figures.
#[utoipa::path(get, path = "/v1/addresses", responses((status = 200, body = [AddressView])))]
pub(super) async fn list(State(api): State<ApiState>) -> axum::Json<Vec<AddressView>> {
    let snapshot = api.pool.snapshot().await;
    let ids = api.registry.ids_by_redacted();
    axum::Json(
        snapshot
            .addresses
            .into_iter()
            .map(|a| view(a, &ids))
            .collect(),
    )
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AddRequest {
    /// `http://[user:password@]host[:port]` or `socks5[h]://…` (no path, query or fragment).
    /// The pattern is the plain form: an IPv4 address or a DNS name, optional unreserved
    /// credentials and port. Other spellings the URL parser takes (IPv6, percent-encoded
    /// credentials) are accepted too.
    #[schema(
        pattern = r"^(http|socks5|socks5h)://([A-Za-z0-9._~-]+(:[A-Za-z0-9._~-]*)?@)?(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])|([A-Za-z0-9]+(-[A-Za-z0-9]+)*\.)*[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*)(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?$",
        example = "http://user:secret@10.0.0.1:3128"
    )]
    address: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Added {
    id: String,
    /// The address with its password hidden.
    address: String,
}

/// Add an upstream at runtime (kept across reloads of the upstream file).
#[utoipa::path(post, path = "/v1/addresses", request_body = AddRequest,
    responses(
        (status = 201, body = Added),
        (status = 400, description = "`invalid_body`: not JSON of this shape; `invalid_address`: not a proxy URL; `unsupported_address`: a scheme the gateway cannot dial (`https`)", body = ErrorBody),
        (status = 409, description = "already in the pool", body = ErrorBody),
        (status = 503, description = "the store is unreachable", body = ErrorBody),
    ))]
pub(super) async fn add(
    State(api): State<ApiState>,
    ApiJson(req): ApiJson<AddRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let address = ProxyAddress::parse(&req.address).map_err(proxypool::PoolError::from)?;
    Upstream::parse(&address)
        .map_err(|e| ApiError::bad_request("unsupported_address", e.to_string()))?;
    let id = api.registry.add_api(address.clone()).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Added {
            id,
            address: address.redacted().to_owned(),
        }),
    ))
}

/// Remove an upstream; sessions bound to it are told they are broken.
#[utoipa::path(delete, path = "/v1/addresses/{id}",
    params(("id" = String, Path, description = "id from GET /v1/addresses")),
    responses(
        (status = 204, description = "removed"),
        (status = 404, description = "no address with that id", body = ErrorBody),
        (status = 503, description = "the store is unreachable", body = ErrorBody),
    ))]
pub(super) async fn remove(
    State(api): State<ApiState>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    match api.registry.remove(&id).await {
        None => Err(ApiError::not_found(
            "unknown_address",
            format!("no address with id {id}"),
        )),
        Some(result) => {
            result?;
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

/// One address × site pair.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CellView {
    address: String,
    site: String,
    window_samples: usize,
    success_rate: Option<f64>,
    captcha_rate: Option<f64>,
    cooling_until_ms: Option<u64>,
    successes: u64,
    failures: u64,
    captchas: u64,
    rate_limited: u64,
}

/// A site's judgement: degraded means failures there are not held against addresses.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SiteView {
    site: String,
    degraded: bool,
    window_samples: usize,
    failure_rate: Option<f64>,
    captcha_rate: Option<f64>,
    spread: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Matrix {
    sites: Vec<SiteView>,
    cells: Vec<CellView>,
}

/// The address × site success matrix and each site's judgement.
#[utoipa::path(get, path = "/v1/matrix", responses((status = 200, body = Matrix)))]
pub(super) async fn matrix(State(api): State<ApiState>) -> axum::Json<Matrix> {
    let s = api.pool.snapshot().await;
    axum::Json(Matrix {
        sites: s
            .sites
            .into_iter()
            .map(|x| SiteView {
                site: x.site,
                degraded: x.degraded,
                window_samples: x.window_samples,
                failure_rate: x.failure_rate,
                captcha_rate: x.captcha_rate,
                spread: x.spread,
            })
            .collect(),
        cells: s
            .matrix
            .into_iter()
            .map(|c| CellView {
                address: c.address,
                site: c.site,
                window_samples: c.window_samples,
                success_rate: c.success_rate,
                captcha_rate: c.captcha_rate,
                cooling_until_ms: c.cooling_until_ms,
                successes: c.totals.successes,
                failures: c.totals.failures,
                captchas: c.totals.captchas,
                rate_limited: c.totals.rate_limited,
            })
            .collect(),
    })
}

/// Everything the dashboard shows, in one answer.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SnapshotView {
    /// The library's snapshot: addresses, matrix, sites, pool counters, recent decisions.
    #[schema(value_type = Object)]
    snapshot: Snapshot,
    /// Ids of the addresses, by redacted URL.
    ids: HashMap<String, Vec<String>>,
    /// Live gateway sessions.
    sessions: usize,
}

/// The whole pool state (what the dashboard draws).
#[utoipa::path(get, path = "/v1/snapshot", responses((status = 200, body = SnapshotView)))]
pub(super) async fn snapshot(State(api): State<ApiState>) -> axum::Json<SnapshotView> {
    axum::Json(SnapshotView {
        snapshot: api.pool.snapshot().await,
        ids: api.registry.ids_by_redacted(),
        sessions: api.sessions.len(),
    })
}
