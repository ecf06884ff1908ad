//! What time alone decides: expired leases and bindings, pairs whose evidence aged out,
//! ended quarantine waits.

use std::cmp::Reverse;

use crate::clock::Timestamp;
use crate::health::HealthState;

use super::PoolState;

impl PoolState {
    /// Applies what time alone decides: expired leases (P14) and bindings (P2), ended
    /// quarantines (P3). Each check is O(1) when nothing is due.
    pub(super) fn sweep(&mut self, now: Timestamp) {
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
    }
}
