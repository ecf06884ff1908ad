//! Latency for the Redis store (P1, P4), judged by each process from the successes it
//! releases: a sample of each address's traffic, which estimates the address's latency as well
//! as the whole would when work is spread over processes. Keeping the figures here rather than
//! in the script costs the shared pool nothing per success; the script gets one small hint
//! per success and acts only when it moves (see `ops` in library.lua).

use std::collections::HashMap;

use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::HealthConfig;
use crate::health::weight::{self, LATENCY_NOISE_MS};
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
    /// The hint last sent, when, and the successes since.
    sent: Option<(i64, Timestamp)>,
    since_sent: u32,
}

/// A hint that did not change is sent again after this many successes, or this long: a
/// latency-degraded address is cleared only on a report that its tail is back (after the
/// dwell).
const RESEND_EVERY: u32 = 16;
const RESEND_AFTER: Duration = Duration::from_secs(1);

impl Latencies {
    /// Notes a success of address `id` that took `ms`, at `now`. Returns the hint the script
    /// reads when it changed (or again after a while): the quality level of the address's
    /// latency (mean over the pool's, as `health::weight::quality` normalises it) × 4, + 2 if
    /// its tail jumped against its own mean (P4), + 1 if not, + 0 while fewer than
    /// `min_samples` were seen.
    pub(super) fn note(
        &mut self,
        id: u32,
        ms: f64,
        cfg: &HealthConfig,
        now: Timestamp,
    ) -> Option<i64> {
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
            sent: None,
            since_sent: 0,
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
        let level = i64::from(weight::latency_level(Some(r.mean_ms), Some(reference)));
        let flag = if r.seen < cfg.min_samples {
            0
        } else if r.tail > 0.05 {
            2
        } else {
            1
        };
        let hint = level * 4 + flag;
        r.since_sent += 1;
        if let Some((sent, at)) = r.sent
            && sent == hint
            && r.since_sent < RESEND_EVERY
            && now.since(at) < RESEND_AFTER
        {
            return None;
        }
        r.sent = Some((hint, now));
        r.since_sent = 0;
        Some(hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hints of `n` successes of `id` in `ms`, split into level and flag.
    fn hints(l: &mut Latencies, id: u32, ms: f64, n: usize) -> Vec<(i64, i64)> {
        let cfg = HealthConfig::default();
        (0..n)
            .filter_map(|_| l.note(id, ms, &cfg, Timestamp::default()))
            .map(|h| (h.div_euclid(4), h.rem_euclid(4)))
            .collect()
    }

    #[test]
    fn a_slow_address_loses_levels_and_a_jump_shows_in_its_tail() {
        let mut l = Latencies::default();
        let mut slow = Vec::new();
        for _ in 0..50 {
            hints(&mut l, 1, 50.0, 1);
            slow.extend(hints(&mut l, 2, 500.0, 1));
        }
        // The pool's reference is near 250 ms: twice that is -2 half octaves, a fifth of it
        // (with the noise floor, about a quarter) +4.
        assert_eq!(slow.last(), Some(&(-2, 1)));
        // Unchanged hints are not sent again for a while; then they are.
        assert!(slow.len() < 20, "{slow:?}");
        assert_eq!(hints(&mut l, 1, 50.0, 16).last(), Some(&(4, 1)));
        // Too few samples: no verdict on the tail yet.
        assert_eq!(hints(&mut l, 3, 50.0, 1)[0].1, 0);
        // Three successes far above its own mean: the tail jumped, and that is sent at once.
        assert_eq!(hints(&mut l, 1, 400.0, 3).last().map(|h| h.1), Some(2));
    }
}
