//! Every tunable of the pool, with the defaults of the spec.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BuildError;

/// How keyless work picks an address (P1). Keyed work always uses consistent hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// In turn, blind to quality.
    RoundRobin,
    /// Smooth weighted: weight = success rate ÷ normalised latency over the last outcomes.
    #[default]
    Weighted,
    /// Fewer active leases wins, between two random candidates (power of two choices).
    LeastConnections,
}

/// The whole configuration. Start from [`PoolConfig::default`] and change fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Strategy for keyless tickets of the default sub-pool.
    pub strategy: Strategy,
    /// P2: how long a key stays bound to its address after its last acquire.
    pub sticky_ttl: Duration,
    /// P14: a lease not released within this time expires and frees its slot.
    pub lease_ttl: Duration,
    /// P13: simultaneous leases per address; at the cap the address is skipped.
    pub max_leases_per_address: u32,
    /// P8: addresses always offered (if the pool has that many).
    pub min_in_service: u32,
    /// P7: the largest fraction of the pool quarantined at once (rounded up, at least one).
    pub quarantine_cap: f64,
    /// P1: virtual nodes per address on the consistent-hash ring.
    pub ring_vnodes: u32,
    /// P1: no address takes more than ⌈load_factor × mean⌉ bound keys.
    pub load_factor: f64,
    /// P3–P5, P10, P11: passive health.
    pub health: HealthConfig,
    /// P6: quarantine waits.
    pub backoff: BackoffConfig,
    /// P9: judging sites and our own side.
    pub judgement: JudgementConfig,
    /// How many decisions the snapshot keeps (the tracing log gets them all).
    pub decision_log_len: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            strategy: Strategy::Weighted,
            sticky_ttl: Duration::from_secs(15 * 60),
            lease_ttl: Duration::from_secs(5 * 60),
            max_leases_per_address: 32,
            min_in_service: 2,
            quarantine_cap: 0.30,
            ring_vnodes: 64,
            load_factor: 1.25,
            health: HealthConfig::default(),
            backoff: BackoffConfig::default(),
            judgement: JudgementConfig::default(),
            decision_log_len: 1024,
        }
    }
}

/// Thresholds of the health state machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HealthConfig {
    /// Outcomes kept per address and per address × site (weights and rates are computed over
    /// them)…
    pub window: usize,
    /// …as long as they are younger than this: older outcomes stop counting, so an old bad
    /// spell is forgiven even where little traffic goes (P4, P9).
    pub window_max_age: Duration,
    /// Fall: at least `recent_failures` failures among the last `recent` outcomes quarantine
    /// an address whose window success is below `min_success_rate` too; against a better
    /// record they make it suspect (degraded), and `recent_failures` more while the signal
    /// holds confirm it…
    pub recent: usize,
    /// …see `recent`.
    pub recent_failures: usize,
    /// …or a success rate below `min_success_rate` over at least `min_samples` outcomes.
    pub min_success_rate: f64,
    /// Samples needed before a rate (success, captcha, latency) is judged, and before an
    /// address × site window is trusted for the weight over the address's own.
    pub min_samples: usize,
    /// Captcha rate above this (over `min_samples`) is a fall signal of its own.
    pub max_captcha_rate: f64,
    /// Latency p95 above `latency_factor` × the address's own median degrades it.
    pub latency_factor: f64,
    /// Rise: consecutive probe successes to leave probing.
    pub rise_successes: u32,
    /// Minimum time in a state before leaving it (except a fall into quarantine).
    pub min_dwell: Duration,
    /// Weight multiplier of a degraded address.
    pub degraded_weight: f64,
    /// Weight multiplier of a probing (half-open) address.
    pub probing_weight: f64,
    /// P10: weight shares of the ramp after quarantine, spread evenly over `ramp_duration`.
    pub ramp_steps: Vec<f64>,
    /// P10: see `ramp_steps`.
    pub ramp_duration: Duration,
    /// P11: failed quarantine cycles in a row before an address is dead.
    pub dead_after_cycles: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            window: 50,
            window_max_age: Duration::from_secs(10 * 60),
            recent: 5,
            recent_failures: 3,
            min_success_rate: 0.70,
            min_samples: 10,
            max_captcha_rate: 0.20,
            latency_factor: 3.0,
            rise_successes: 5,
            min_dwell: Duration::from_secs(30),
            degraded_weight: 0.5,
            probing_weight: 0.1,
            ramp_steps: vec![0.10, 0.25, 0.50, 1.0],
            ramp_duration: Duration::from_secs(60),
            dead_after_cycles: 5,
        }
    }
}

/// Exponential quarantine waits: `base × 2^n`, capped, with jitter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// First wait.
    pub base: Duration,
    /// Longest wait.
    pub cap: Duration,
    /// Relative jitter: the wait is multiplied by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// `n` resets after this long healthy without a fall.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(60),
            cap: Duration::from_secs(3600),
            jitter: 0.20,
            reset_after: Duration::from_secs(10 * 60),
        }
    }
}

/// Judging a site (all addresses failing towards it) and our side (failing towards all sites).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JudgementConfig {
    /// Last outcomes kept per site, over all addresses (no older than
    /// `HealthConfig::window_max_age`).
    pub site_window: usize,
    /// The site is also judged on its newest outcomes alone (at most 64), to catch sudden
    /// spikes.
    pub site_recent: usize,
    /// Outcomes needed (in the window, or in the newest stretch) before the site is judged.
    pub site_min_samples: usize,
    /// Distinct addresses needed in that window before the site is judged.
    pub site_min_addresses: usize,
    /// A site is degraded when more than this fraction of the addresses seen in its window had
    /// a bad outcome on it and its failure or captcha rate crosses the address thresholds.
    pub site_spread: f64,
}

impl Default for JudgementConfig {
    fn default() -> Self {
        Self {
            site_window: 64,
            site_recent: 16,
            site_min_samples: 10,
            site_min_addresses: 3,
            site_spread: 0.5,
        }
    }
}

impl PoolConfig {
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let h = &self.health;
        let checks: [(bool, &str); 13] = [
            (
                self.quarantine_cap > 0.0 && self.quarantine_cap <= 1.0,
                "quarantine_cap must be in (0, 1]",
            ),
            (
                self.max_leases_per_address > 0,
                "max_leases_per_address must be > 0",
            ),
            (self.ring_vnodes > 0, "ring_vnodes must be > 0"),
            (self.load_factor >= 1.0, "load_factor must be >= 1"),
            (
                h.window > 0 && h.window <= u16::MAX as usize,
                "health.window must be in 1..=65535",
            ),
            (
                h.window_max_age > Duration::ZERO
                    && h.window_max_age <= Duration::from_millis(u64::from(u32::MAX)),
                "health.window_max_age must be in (0, 49 days]",
            ),
            (
                h.recent > 0 && h.recent <= h.window && h.recent_failures <= h.recent,
                "health.recent must be in 1..=window and recent_failures <= recent",
            ),
            (
                (0.0..=1.0).contains(&h.min_success_rate)
                    && (0.0..=1.0).contains(&h.max_captcha_rate),
                "health rates must be in [0, 1]",
            ),
            (
                h.latency_factor >= 1.0,
                "health.latency_factor must be >= 1",
            ),
            (
                !h.ramp_steps.is_empty() && h.ramp_steps.iter().all(|s| *s > 0.0 && *s <= 1.0),
                "health.ramp_steps must be non-empty shares in (0, 1]",
            ),
            (
                h.degraded_weight > 0.0 && h.probing_weight > 0.0,
                "degraded and probing weights must be > 0",
            ),
            (
                self.backoff.base <= self.backoff.cap && (0.0..1.0).contains(&self.backoff.jitter),
                "backoff.base must be <= cap and jitter in [0, 1)",
            ),
            (
                self.judgement.site_window >= self.judgement.site_recent
                    && self.judgement.site_recent <= crate::judge::sites::MAX_RECENT
                    && self.judgement.site_min_samples > 0,
                "judgement: site_recent <= min(site_window, 64) and site_min_samples > 0",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(BuildError::InvalidConfig((*why).into())),
            None => Ok(()),
        }
    }
}
