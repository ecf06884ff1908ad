//! Latency for the Redis store (P1, P4): the weight's latency level, and whether a success may
//! have grown its address's tail, judged by the releasing process as memory judges them —
//! over a window of the outcomes this process released per address (memory's `Window`, of the
//! pool's length and age) against a reference latency of its own successes. In one process
//! these are memory's window and reference, so both stores weigh and ask the judge at the same
//! releases (the differential test); with several, each process's sample of an address's
//! traffic estimates the whole as well when work is spread over processes. The tail itself is
//! judged over the shared window, which holds every process's latencies (`judging.rs`).
//!
//! Kept here rather than in the script, these figures cost the shared pool nothing per
//! success: the script gets the level when it moves (see `ops` in library.lua).

use std::collections::HashMap;

use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::HealthConfig;
use crate::health::signals;
use crate::health::weight;
use crate::health::window::{Class, Entry, Window};

/// This process's outcomes by address id, and the reference latency of all its successes.
#[derive(Debug, Default)]
pub(super) struct Latencies {
    by_id: HashMap<u32, Running>,
    reference_ms: Option<f64>,
}

#[derive(Debug)]
struct Running {
    window: Window,
    /// The level last sent, when, and the successes since.
    sent: Option<(i64, Timestamp)>,
    since_sent: u32,
}

/// What one outcome tells the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Noted {
    /// For a success, the quality level of the address's latency (its window's mean over the
    /// reference, as memory's weight takes it), when it changed or again after a while.
    pub(super) level: Option<i64>,
    /// A success that may have grown the tail ([`signals::may_grow_tail`]): the judge reads
    /// the shared window.
    pub(super) slow: bool,
}

/// A level that did not change is sent again after this many successes, or this long: other
/// processes write theirs to the same field.
const RESEND_EVERY: u32 = 16;
const RESEND_AFTER: Duration = Duration::from_secs(1);

impl Latencies {
    /// Notes an outcome of address `id` at `now` that enters its window (a success with its
    /// latency in whole ms, capped as windows cap it; failures and captchas with 0), in the
    /// order memory's `record_outcome` takes it: the tail's question on the window as the
    /// outcome found it, the push, the reference, the level.
    pub(super) fn note(
        &mut self,
        id: u32,
        class: Class,
        latency_ms: u16,
        cfg: &HealthConfig,
        now: Timestamp,
    ) -> Noted {
        let r = self.by_id.entry(id).or_insert_with(|| Running {
            window: Window::new(cfg.window, cfg.window_max_age),
            sent: None,
            since_sent: 0,
        });
        let success = class == Class::Success;
        let slow = success
            && signals::may_grow_tail(latency_ms, r.window.tallies(now).0.mean_latency_ms(), cfg);
        r.window.push(Entry {
            at: now,
            site: 0,
            latency_ms,
            class,
            excused: false,
        });
        if !success {
            return Noted { level: None, slow };
        }
        weight::follow_reference(&mut self.reference_ms, f64::from(latency_ms));
        let mean = r.window.tallies(now).0.mean_latency_ms();
        let level = i64::from(weight::latency_level(mean, self.reference_ms));
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

    /// Forgets a removed address (its id may come back with another's outcomes).
    pub(super) fn forget(&mut self, id: u32) {
        self.by_id.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `n` successes of `id` in `ms` tell the script.
    fn notes(l: &mut Latencies, id: u32, ms: u16, n: usize) -> Vec<Noted> {
        let cfg = HealthConfig::default();
        (0..n)
            .map(|_| l.note(id, Class::Success, ms, &cfg, Timestamp::default()))
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
            notes(&mut l, 1, 50, 1);
            slow.extend(notes(&mut l, 2, 500, 1));
        }
        // The pool's reference is near 250 ms: twice that is -2 half octaves, a fifth of it
        // (with the noise floor, about a quarter) +4.
        assert_eq!(levels(&slow).last(), Some(&-2));
        assert!(slow.iter().all(|n| !n.slow));
        // Unchanged levels are not sent again for a while; then they are.
        assert!(levels(&slow).len() < 20, "{slow:?}");
        assert_eq!(levels(&notes(&mut l, 1, 50, 16)).last(), Some(&4));
        // Far above its window's mean: the judge is to read the tail, at once.
        assert!(notes(&mut l, 1, 400, 1)[0].slow);
        // Near it: no news.
        assert!(!notes(&mut l, 1, 60, 1)[0].slow);
    }

    #[test]
    fn failures_take_their_place_in_the_window_and_weigh_no_latency() {
        let cfg = HealthConfig::default();
        let mut l = Latencies::default();
        let at = Timestamp::default();
        let failed = l.note(3, Class::Failure, 0, &cfg, at);
        assert_eq!(
            failed,
            Noted {
                level: None,
                slow: false
            }
        );
        // The window's mean is the successes' alone.
        notes(&mut l, 3, 100, 1);
        let mean = l.by_id[&3].window.tallies(at).0.mean_latency_ms();
        assert_eq!(mean, Some(100.0));
        l.forget(3);
        assert!(l.by_id.is_empty());
    }
}
