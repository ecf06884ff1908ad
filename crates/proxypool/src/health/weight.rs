//! P1: the dynamic weight of an address, success rate ÷ normalised latency.

use crate::clock::Timestamp;
use crate::config::HealthConfig;

use super::window::Tally;
use super::{Health, HealthState, ramp};

/// Weights never go below this, so no offered address starves.
pub(crate) const MIN_WEIGHT: f64 = 0.01;
const MAX_WEIGHT: f64 = 100.0;

/// Latency differences this small (ms) are noise, not quality: both sides of a latency ratio
/// get it added, so 1 ms against 0.2 ms (loopback) weighs about the same while 400 ms against
/// 200 ms still halves the weight.
pub(crate) const LATENCY_NOISE_MS: f64 = 10.0;

/// Success rate ÷ normalised latency of a window's counted outcomes.
///
/// The success rate is smoothed towards 1 with two virtual successes so that one early failure
/// does not crush a new address; latency is the window's mean over `reference_ms`, a running
/// latency of the same traffic (the pool's, or the site's for an address × site window), so
/// weights compare addresses with each other rather than with a constant.
pub(crate) fn quality(t: &Tally, reference_ms: Option<f64>) -> f64 {
    let success = (f64::from(t.successes) + 2.0) / (f64::from(t.n) + 2.0);
    let latency = match (t.mean_latency_ms(), reference_ms) {
        (Some(own), Some(reference)) if reference >= 0.0 => {
            ((own + LATENCY_NOISE_MS) / (reference + LATENCY_NOISE_MS)).max(0.05)
        }
        _ => 1.0,
    };
    success / latency
}

/// The weight of an address of `quality` in weighted selection at `now`: its state and ramp
/// scale it, and it is clamped so that an offered address never starves.
pub(crate) fn weight(quality: f64, h: &Health, cfg: &HealthConfig, now: Timestamp) -> f64 {
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
    (quality * state * ramp).clamp(MIN_WEIGHT, MAX_WEIGHT)
}
