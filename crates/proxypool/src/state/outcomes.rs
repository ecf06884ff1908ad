//! Outcomes: releases, abandons and probe reports, pushed into the windows and handed to the
//! judgement.

use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::error::PoolError;
use crate::health::window::{Class, Entry};
use crate::health::{HealthState, signals, weight};
use crate::lease::Outcome;
use crate::snapshot::Totals;
use crate::store::Release;
use crate::strategy::Slot;

use super::LeaseRef;
use super::record::LatencySeen;
use super::sites::NO_SITE;

use super::PoolState;

impl PoolState {
    pub(crate) fn release(&mut self, release: &Release, now: Timestamp) {
        self.sweep(now);
        let slot = release.slot;
        if let Some(closed) = self.leases.close(release.lease) {
            self.lease_ended(closed);
        }
        // A lease that expired (P14) already freed its slot, but its outcome is still real
        // news; an address removed meanwhile has nothing left to update.
        if self.record(slot).is_none() {
            return;
        }
        self.counters.released += 1;
        self.record_outcome(slot, release.site, &release.outcome, now);
        self.hint_upcoming();
    }

    /// An outcome of `slot` at `site`: windows, site judgement, the address's evaluation.
    fn record_outcome(&mut self, slot: Slot, site: u32, outcome: &Outcome, now: Timestamp) {
        let (class, latency) = match *outcome {
            Outcome::Success { latency } => (Class::Success, Some(latency)),
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => (Class::Failure, None),
            Outcome::Captcha => (Class::Captcha, None),
            Outcome::RateLimited { retry_after } => {
                // Not health, but an outcome all the same: the weight follows the window's age.
                let had_bad = self.hot.get(slot as usize).is_some_and(|h| h.bad_in_window);
                self.reweigh(slot, true, had_bad, now);
                self.cool(slot, site, now.after(retry_after), outcome);
                return;
            }
        };
        let latency_ms = latency.map_or(0, |l| u16::try_from(millis(l)).unwrap_or(u16::MAX));
        let entry = Entry {
            at: now,
            class,
            site,
            latency_ms,
            excused: self.sites.is_degraded(site),
        };
        let (Some(rec), Some(hot)) = (self.records.get_mut(slot), self.hot.get_mut(slot as usize))
        else {
            return;
        };
        let had_bad = hot.bad_in_window;
        // Asked before the push, from the window as the outcome found it.
        let slower = latency.is_some()
            && signals::may_grow_tail(
                latency_ms,
                rec.window.tallies(now).0.mean_latency_ms(),
                &self.cfg.health,
            );
        if site != NO_SITE {
            let cell = self
                .sites
                .cell(slot, site, rec.address.redacted(), &self.cfg.health);
            cell.window.push(entry);
            cell.metrics.outcome(outcome);
            count(&mut cell.totals, class);
        }
        rec.window.push(entry);
        rec.count(class);
        rec.metrics.outcome(outcome);
        if latency.is_some() {
            let ms = f64::from(latency_ms);
            weight::follow_reference(&mut self.reference_latency_ms, ms);
            if let Some(s) = self.sites.list.get_mut(site as usize) {
                weight::follow_reference(&mut s.reference_ms, ms);
            }
        }
        // Weighed before the site is judged, as the Redis library weighs before the judge's
        // verdict comes back: a site convicted by this outcome excuses it afterwards (which
        // leaves the level alone, counted over every outcome) and the flag clears at the next.
        if class != Class::Success && !entry.excused {
            hot.bad_in_window = true;
        }
        self.reweigh(slot, class != Class::Success, had_bad, now);
        self.judge_site(site, slot, class, now);
        if site != NO_SITE {
            self.judge_cell(slot, site, now);
        }
        self.evaluate(slot, site, class, slower, now);
    }

    /// The address's quality level (its weight for tickets without a site, P1) follows an
    /// outcome that may have moved it: any but a success (`moved`), a success that moved its
    /// latency's level, or any while its window holds a counted bad outcome (`had_bad`; cleared
    /// once it is clean). Successes of a clean window, the common case, leave it be. The Redis
    /// library weighs at the same outcomes (`reweigh`), so the stores' steps agree.
    fn reweigh(&mut self, slot: Slot, moved: bool, had_bad: bool, now: Timestamp) {
        let (Some(rec), Some(h)) = (self.records.get_mut(slot), self.hot.get_mut(slot as usize))
        else {
            return;
        };
        let (all, counted) = rec.window.tallies(now);
        let mean = all.mean_latency_ms();
        let seen = LatencySeen::of(mean, self.reference_latency_ms);
        let latency = if moved || seen == rec.latency_seen {
            h.latency_level
        } else {
            rec.latency_seen = seen;
            weight::latency_level(mean, self.reference_latency_ms) as i8
        };
        if !(moved || had_bad || latency != h.latency_level) {
            return;
        }
        if had_bad && counted.n == counted.successes {
            h.bad_in_window = false;
        }
        h.latency_level = latency;
        h.level = weight::level(i32::from(latency), &all);
    }

    /// A rate limit: the address cools for that site only; it is not health (no window).
    pub(super) fn cool(&mut self, slot: Slot, site: u32, until: Timestamp, outcome: &Outcome) {
        let Some(rec) = self.records.get_mut(slot) else {
            return;
        };
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.cooling_until = h.cooling_until.max(until);
        }
        rec.rate_limited();
        rec.metrics.outcome(outcome);
        if site == NO_SITE {
            rec.cooling_unsited = until;
            return;
        }
        let cell = self
            .sites
            .cell(slot, site, rec.address.redacted(), &self.cfg.health);
        cell.cooling_until = Some(until);
        cell.totals.rate_limited += 1;
        cell.metrics.outcome(outcome);
    }

    pub(crate) fn abandon(&mut self, lease: LeaseRef, _now: Timestamp) {
        if let Some(slot) = self.leases.close(lease) {
            self.counters.abandoned += 1;
            self.metrics.abandoned();
            self.lease_ended(slot);
            if let Some(r) = self.record_mut(slot) {
                r.abandoned();
            }
        }
    }

    /// A lease on `slot` is over (released, dropped or expired): its slot is free again.
    pub(super) fn lease_ended(&mut self, slot: Slot) {
        let Some(h) = self.hot.get_mut(slot as usize) else {
            return;
        };
        h.active_leases = h.active_leases.saturating_sub(1);
        let back = h.active_leases + 1 == self.cfg.max_leases_per_address && h.offered();
        if let Some(r) = self.records.get(slot) {
            r.metrics.active(h.active_leases);
            if back {
                // Below its cap again: it takes turns from the lowest pass.
                for &sp in &r.sub_pools {
                    if let Some(p) = self.sub_pools.get_mut(sp as usize) {
                        p.keyless.join(slot);
                    }
                }
            }
        }
    }

    /// The result of an active probe: the hook for P12. It drives the half-open gate of a
    /// probing address and is the only way back for a dead one. A failed probe of an address
    /// in service is one failed outcome (no site), so an idle address with a dead proxy falls
    /// like a busy one; a passed one is not news there (its traffic or silence says as much).
    pub(crate) fn report_probe(
        &mut self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.sweep(now);
        let slot = *self
            .by_address
            .get(address)
            .ok_or_else(|| PoolError::UnknownAddress(address.clone()))?;
        let state = self.record(slot).map(|r| r.health.state);
        match (state, passed) {
            (Some(HealthState::Probing | HealthState::Dead), true) => self.probe_success(slot, now),
            (Some(HealthState::Probing), false) => {
                self.try_quarantine(slot, now, "probe failed".into());
            }
            (Some(HealthState::Healthy | HealthState::Degraded), false) => {
                self.record_outcome(slot, NO_SITE, &Outcome::ConnectError, now);
            }
            (Some(HealthState::Dead), false) => {
                if let Some(r) = self.record_mut(slot) {
                    r.health.probe_streak = 0;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn count(t: &mut Totals, class: Class) {
    match class {
        Class::Success => t.successes += 1,
        Class::Failure => t.failures += 1,
        Class::Captcha => t.captchas += 1,
    }
}
