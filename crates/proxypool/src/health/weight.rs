//! P1: the dynamic weight of an address, success rate ÷ normalised latency.

use crate::clock::Timestamp;
use crate::config::HealthConfig;

use super::window::Window;
use super::{Health, HealthState, ramp};

/// Weights never go below this, so no offered address starves.
const MIN_WEIGHT: f64 = 0.01;
const MAX_WEIGHT: f64 = 100.0;

/// The weight an address gets in weighted selection at `now`.
///
/// The success rate is smoothed towards 1 with two virtual successes so that one early failure
/// does not crush a new address; latency is the window's mean over `reference_ms`, the pool's
/// running latency, so weights compare addresses with each other rather than with a constant.
pub(crate) fn weight(
    w: &Window,
    h: &Health,
    cfg: &HealthConfig,
    reference_ms: Option<f64>,
    now: Timestamp,
) -> f64 {
    let success = (f64::from(w.successes()) + 2.0) / (w.len() as f64 + 2.0);
    let latency = match (w.mean_latency_ms(), reference_ms) {
        (Some(own), Some(reference)) if reference > 0.0 => (own / reference).max(0.05),
        _ => 1.0,
    };
    let state = match h.state {
        HealthState::Healthy => 1.0,
        HealthState::Degraded => cfg.degraded_weight,
        HealthState::Probing => cfg.probing_weight,
        HealthState::Quarantined | HealthState::Dead => return 0.0,
    };
    let ramp = h
        .ramp_started
        .and_then(|s| ramp::share(&cfg.ramp_steps, cfg.ramp_duration, s, now))
        .unwrap_or(1.0);
    (success / latency * state * ramp).clamp(MIN_WEIGHT, MAX_WEIGHT)
}
