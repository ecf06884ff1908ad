//! Latency for the Redis store (P1, P4), judged by each process from the successes it
//! releases: a sample of each address's traffic, which estimates the address's latency as well
//! as the whole would when work is spread over processes. Keeping the figures here rather than
//! in the script costs the shared pool nothing per success; the script gets one small hint
//! per success and acts only when it moves (see `ops` in library.lua).

use std::collections::HashMap;

use crate::config::HealthConfig;
use crate::health::weight::LATENCY_NOISE_MS;
use crate::state::REFERENCE_LATENCY_ALPHA;

/// Running figures of the addresses this process released, by id, and of all of them.
#[derive(Debug, Default)]
pub(super) struct Latencies {
    by_id: HashMap<u32, Running>,
    reference_ms: Option<f64>,
}

/// One address's, over about the window's length.
#[derive(Debug, Clone, Copy)]
struct Running {
    mean_ms: f64,
    /// The share of successes slower than `latency_factor` × the mean: above 5 %, so is the
    /// 95th percentile.
    tail: f64,
    seen: usize,
}

/// Quality levels are half octaves, within the memory store's weight bounds.
const LEVELS: f64 = 13.0;

impl Latencies {
    /// Notes a success of address `id` that took `ms`. Returns the hint the script reads: the
    /// quality level of the address's latency (mean over the pool's, as
    /// `health::weight::quality` normalises it) × 4, + 2 if its tail jumped against its own
    /// mean (P4), + 1 if not, + 0 while fewer than `min_samples` were seen.
    pub(super) fn note(&mut self, id: u32, ms: f64, cfg: &HealthConfig) -> i64 {
        let alpha = 2.0 / (cfg.window as f64 + 1.0);
        let reference = match self.reference_ms {
            Some(r) => r + REFERENCE_LATENCY_ALPHA * (ms - r),
            None => ms,
        };
        self.reference_ms = Some(reference);
        let r = self.by_id.entry(id).or_insert(Running {
            mean_ms: ms,
            tail: 0.0,
            seen: 0,
        });
        let norm = r.mean_ms.max(LATENCY_NOISE_MS);
        let slow = if ms > cfg.latency_factor * norm {
            1.0
        } else {
            0.0
        };
        r.tail += alpha * (slow - r.tail);
        r.mean_ms += alpha * (ms - r.mean_ms);
        r.seen = r.seen.saturating_add(1);
        let latency = ((r.mean_ms + LATENCY_NOISE_MS) / (reference + LATENCY_NOISE_MS)).max(0.05);
        let level = (-2.0 * latency.log2()).round().clamp(-LEVELS, LEVELS) as i64;
        let flag = if r.seen < cfg.min_samples {
            0
        } else if r.tail > 0.05 {
            2
        } else {
            1
        };
        level * 4 + flag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(hint: i64) -> (i64, i64) {
        (hint.div_euclid(4), hint.rem_euclid(4))
    }

    #[test]
    fn a_slow_address_loses_levels_and_a_jump_shows_in_its_tail() {
        let cfg = HealthConfig::default();
        let mut l = Latencies::default();
        let mut last = (0, 0);
        for _ in 0..50 {
            l.note(1, 50.0, &cfg);
            last = split(l.note(2, 500.0, &cfg));
        }
        // The pool's reference is near 250 ms: twice that is -2 half octaves, a fifth of it
        // (with the noise floor, about a quarter) +4.
        assert_eq!(last, (-2, 1));
        assert_eq!(split(l.note(1, 50.0, &cfg)), (4, 1));
        // Too few samples: no verdict on the tail yet.
        assert_eq!(split(l.note(3, 50.0, &cfg)).1, 0);
        // Three successes far above its own mean: the tail jumped.
        let jumped = (0..3).map(|_| split(l.note(1, 400.0, &cfg)).1).last();
        assert_eq!(jumped, Some(2));
    }
}
