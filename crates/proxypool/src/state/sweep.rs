//! What time alone decides: expired leases and bindings, pairs whose evidence aged out,
//! ended quarantine waits.

use std::cmp::Reverse;

use crate::clock::Timestamp;
use crate::health::HealthState;

use super::{NEVER, PoolState};

impl PoolState {
    /// Applies what time alone decides: expired leases (P14) and bindings (P2), ended
    /// quarantines (P3). One comparison when nothing is due (`next_due`).
    #[inline]
    pub(super) fn sweep(&mut self, now: Timestamp) {
        if now >= self.next_due {
            self.sweep_due(now);
        }
    }

    #[inline(never)]
    fn sweep_due(&mut self, now: Timestamp) {
        if self.leases.due(now) {
            for slot in self.leases.expire(now) {
                self.counters.expired += 1;
                self.metrics.expired(1);
                self.lease_ended(slot);
                if let Some(r) = self.record_mut(slot) {
                    r.expired();
                }
            }
        }
        if self.sessions.due(now) {
            for b in self.sessions.expire(now) {
                self.unbound(&b);
            }
        }
        while let Some(Reverse((due, slot, site))) = self.pair_checks.peek().copied() {
            if due > now {
                break;
            }
            self.pair_checks.pop();
            // Judged again as of when its oldest outcome aged out: forgiven, or checked again
            // when the next one does.
            self.judge_cell(slot, site, due);
            if let Some(c) = self.sites.get(slot, site).filter(|c| c.avoided)
                && let Some(at) = c.window.horizon()
            {
                self.pair_checks.push(Reverse((at, slot, site)));
            }
        }
        while let Some(Reverse((due, slot))) = self.quarantine_ends.peek().copied() {
            if due > now {
                break;
            }
            self.quarantine_ends.pop();
            let still = self.record(slot).is_some_and(|r| {
                r.health.state == HealthState::Quarantined
                    && r.health.quarantined_until == Some(due)
            });
            if still {
                // Dated when the wait ended, not when a call noticed: the dwell counts from there.
                let reason = "quarantine wait over; half-open".to_owned();
                self.transition(slot, HealthState::Probing, reason, due);
            }
        }
        self.next_due = [
            self.leases.next_due(),
            self.sessions.next_due(),
            self.pair_checks.peek().map(|Reverse((at, ..))| *at),
            self.quarantine_ends.peek().map(|Reverse((at, _))| *at),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(NEVER);
    }

    /// Something falls due at `at`: the sweep looks again from then.
    pub(super) fn due_by(&mut self, at: Timestamp) {
        self.next_due = self.next_due.min(at);
    }
}
