//! Latency for the Redis store (P1, P4). The tail is judged over the address's shared window,
//! which holds every process's latencies (`judging.rs`, as memory); what this process keeps is
//! what picks the releases worth that read, and the weight's latency level.
//!
//! The level is judged by each process from the successes it releases: a sample of each
//! address's traffic, which estimates the address's latency as well as the whole would when
//! work is spread over processes. Keeping the figures here rather than in the script costs the
//! shared pool nothing per success; the script gets the level when it moves (see `ops` in
//! library.lua).

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
    /// The level last sent, when, and the successes since.
    sent: Option<(i64, Timestamp)>,
    since_sent: u32,
}

/// What one success tells the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Noted {
    /// The quality level of the address's latency (its mean over the pool's, as
    /// `health::weight::quality` normalises it), when it changed or again after a while.
    pub(super) level: Option<i64>,
    /// Slower than `latency_factor` × the address's mean: it may have grown the tail (P4), so
    /// the judge reads the window.
    pub(super) slow: bool,
}

/// A level that did not change is sent again after this many successes, or this long: other
/// processes write theirs to the same field.
const RESEND_EVERY: u32 = 16;
const RESEND_AFTER: Duration = Duration::from_secs(1);

impl Latencies {
    /// Notes a success of address `id` that took `ms`, at `now`.
    pub(super) fn note(&mut self, id: u32, ms: f64, cfg: &HealthConfig, now: Timestamp) -> Noted {
        let alpha = 2.0 / (cfg.window as f64 + 1.0);
        let reference = match self.reference_ms {
            Some(r) => r + REFERENCE_LATENCY_ALPHA * (ms - r),
            None => ms,
        };
        self.reference_ms = Some(reference);
        let r = self.by_id.entry(id).or_insert(Running {
            mean_ms: ms,
            sent: None,
            since_sent: 0,
        });
        let slow = ms > cfg.latency_factor * r.mean_ms.max(LATENCY_NOISE_MS);
        r.mean_ms += alpha * (ms - r.mean_ms);
        let level = i64::from(weight::latency_level(Some(r.mean_ms), Some(reference)));
        r.since_sent += 1;
        if let Some((sent, at)) = r.sent
            && sent == level
            && r.since_sent < RESEND_EVERY
            && now.since(at) < RESEND_AFTER
        {
            return Noted { level: None, slow };
        }
        r.sent = Some((level, now));
        r.since_sent = 0;
        Noted {
            level: Some(level),
            slow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `n` successes of `id` in `ms` tell the script.
    fn notes(l: &mut Latencies, id: u32, ms: f64, n: usize) -> Vec<Noted> {
        let cfg = HealthConfig::default();
        (0..n)
            .map(|_| l.note(id, ms, &cfg, Timestamp::default()))
            .collect()
    }

    fn levels(n: &[Noted]) -> Vec<i64> {
        n.iter().filter_map(|n| n.level).collect()
    }

    #[test]
    fn a_slow_address_loses_levels_and_a_jump_is_marked_slow() {
        let mut l = Latencies::default();
        let mut slow = Vec::new();
        for _ in 0..50 {
            notes(&mut l, 1, 50.0, 1);
            slow.extend(notes(&mut l, 2, 500.0, 1));
        }
        // The pool's reference is near 250 ms: twice that is -2 half octaves, a fifth of it
        // (with the noise floor, about a quarter) +4.
        assert_eq!(levels(&slow).last(), Some(&-2));
        assert!(slow.iter().all(|n| !n.slow));
        // Unchanged levels are not sent again for a while; then they are.
        assert!(levels(&slow).len() < 20, "{slow:?}");
        assert_eq!(levels(&notes(&mut l, 1, 50.0, 16)).last(), Some(&4));
        // Far above its own mean: the judge is to read the tail, at once.
        assert!(notes(&mut l, 1, 400.0, 1)[0].slow);
        // Near it: no news.
        assert!(!notes(&mut l, 1, 60.0, 1)[0].slow);
    }
}
