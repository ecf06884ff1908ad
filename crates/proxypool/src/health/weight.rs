//! P1: the dynamic weight of an address, success rate ÷ normalised latency, and the one rule
//! that turns it into the whole-number step of weighted selection on both stores.
//!
//! Quality is kept in half-octave *levels* (-13 … 13): the latency's level plus, while the
//! window holds outcomes, the success rate's. The weight is state × ramp share × 2^(level / 2)
//! within [0.01, 100] and the step of a pick is `STRIDE ÷ weight`, rounded, at least 1. The
//! Redis library does none of this arithmetic: it looks the steps and rate levels up in
//! tables made from these functions (`super::tables`), so both stores' passes are the same
//! whole numbers.

use std::sync::LazyLock;

use crate::clock::Timestamp;
use crate::config::HealthConfig;

use super::window::Tally;
use super::{Health, HealthState, ramp};

/// Weights never go below this, so no offered address starves.
pub(crate) const MIN_WEIGHT: f64 = 0.01;
const MAX_WEIGHT: f64 = 100.0;

/// The step of a pick at weight 1.
pub(crate) const STRIDE: f64 = 100.0;

/// Quality levels are half octaves, within the weight bounds.
pub(crate) const LEVELS: i32 = 13;

/// Latency differences this small (ms) are noise, not quality: both sides of a latency ratio
/// get it added, so 1 ms against 0.2 ms (loopback) weighs about the same while 400 ms against
/// 200 ms still halves the weight.
pub(crate) const LATENCY_NOISE_MS: f64 = 10.0;

/// `2 ln x ÷ ln 2` rounded half up, as the library computes it (`math.log`, then
/// `math.floor(… + 0.5)`): the same doubles give the same level.
fn half_octaves(x: f64) -> i32 {
    (2.0 * x.ln() / std::f64::consts::LN_2 + 0.5).floor() as i32
}

/// The level of a mean latency `own_ms` against `reference_ms`, a running latency of the same
/// traffic (the pool's, or the site's for an address × site window), so weights compare
/// addresses with each other rather than with a constant; 0 while either is unknown.
pub(crate) fn latency_level(own_ms: Option<f64>, reference_ms: Option<f64>) -> i32 {
    match (own_ms, reference_ms) {
        (Some(own), Some(reference)) if reference >= 0.0 => {
            let ratio = ((own + LATENCY_NOISE_MS) / (reference + LATENCY_NOISE_MS)).max(0.05);
            (-half_octaves(ratio)).clamp(-LEVELS, LEVELS)
        }
        _ => 0,
    }
}

/// The weight of the reference latency a new sample has: a running mean of the pool's (or a
/// site's) successes, slow to move.
const REFERENCE_LATENCY_ALPHA: f64 = 0.02;

/// Moves a running reference latency towards a new success's `ms`.
pub(crate) fn follow_reference(reference: &mut Option<f64>, ms: f64) {
    *reference = Some(match *reference {
        None => ms,
        Some(r) => r + REFERENCE_LATENCY_ALPHA * (ms - r),
    });
}

/// The level of a window's success rate over all its young outcomes (excused ones too: a
/// site-wide spike lowers every address alike), smoothed towards 1 with two virtual successes
/// so that one early failure does not crush a new address.
pub(crate) fn rate_level(t: &Tally) -> i32 {
    rate_level_of(t.successes, t.n)
}

/// [`rate_level`] of `successes` among `n` outcomes.
pub(crate) fn rate_level_of(successes: u16, n: u16) -> i32 {
    half_octaves((f64::from(successes) + 2.0) / (f64::from(n) + 2.0))
}

/// The quality level of a window (`t`, its young outcomes) with latency level `latency`.
pub(crate) fn level(latency: i32, t: &Tally) -> i8 {
    let rate = if t.n > 0 { rate_level(t) } else { 0 };
    (latency + rate).clamp(-LEVELS, LEVELS) as i8
}

/// The weight of an address of quality `level` in weighted selection at `now`: its state and
/// ramp scale it, and it is clamped so that an offered address never starves.
pub(crate) fn weight(level: i8, h: &Health, cfg: &HealthConfig, now: Timestamp) -> f64 {
    let Some(state) = state_weight(h.state, cfg) else {
        return 0.0;
    };
    let ramp = h
        .ramp_started
        .and_then(|s| ramp::share(&cfg.ramp_steps, cfg.ramp_duration, s, now))
        .unwrap_or(1.0);
    scaled(state * ramp, level)
}

/// The factor of `state` in the weight; `None` where it is not offered.
pub(crate) fn state_weight(state: HealthState, cfg: &HealthConfig) -> Option<f64> {
    match state {
        HealthState::Healthy => Some(1.0),
        HealthState::Degraded => Some(cfg.degraded_weight),
        HealthState::Probing => Some(cfg.probing_weight),
        HealthState::Quarantined | HealthState::Dead => None,
    }
}

/// 2^(level / 2) by level + 13, as `powf` (C's `pow`, like the library's `^`) gives it: a
/// table, as a weighted pick reads one.
static OCTAVES: LazyLock<[f64; 2 * LEVELS as usize + 1]> =
    LazyLock::new(|| std::array::from_fn(|i| 2f64.powf((i as f64 - f64::from(LEVELS)) / 2.0)));

/// `by` × 2^(level / 2), within the weight bounds.
pub(crate) fn scaled(by: f64, level: i8) -> f64 {
    let i = (i32::from(level).clamp(-LEVELS, LEVELS) + LEVELS) as usize;
    (by * OCTAVES[i]).clamp(MIN_WEIGHT, MAX_WEIGHT)
}

/// The step of a pick of an address of `weight`: whole, so that passes stay whole numbers
/// (the library writes them cheaply), 1 at the most.
pub(crate) fn step(weight: f64) -> u32 {
    // Positive, so truncation is the floor (`f64::floor` is a library call on x86-64).
    ((STRIDE / weight.clamp(MIN_WEIGHT, MAX_WEIGHT) + 0.5) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p1_steps_are_whole_inverses_of_the_weight() {
        assert_eq!(step(1.0), 100);
        assert_eq!(step(0.01), 10_000);
        assert_eq!(step(0.0), 10_000);
        assert_eq!(step(100.0), 1);
        assert_eq!(step(0.3), 333);
        assert_eq!(step(scaled(1.0, -1)), 141);
        assert_eq!(step(scaled(0.25, 3)), 141);
    }

    #[test]
    fn p1_levels_are_half_octaves_of_rate_and_latency() {
        let t = |n, successes| Tally {
            n,
            successes,
            ..Tally::default()
        };
        assert_eq!(level(0, &t(0, 0)), 0);
        assert_eq!(level(0, &t(10, 10)), 0);
        // 7 ÷ 12 = 2^-0.78: -1.56 half octaves.
        assert_eq!(level(0, &t(10, 5)), -2);
        assert_eq!(level(-12, &t(10, 0)), -13);
        assert_eq!(latency_level(Some(210.0), Some(100.0)), -2);
        assert_eq!(latency_level(Some(100.0), None), 0);
        assert_eq!(latency_level(Some(0.0), Some(10_000.0)), 9);
    }
}
