//! Judgement: sites (P9), address × site pairs, our side, the address's evaluation (P3–P5,
//! P10), quarantine through the gate (P6–P8, P11) and the transitions they decide.

use std::cmp::Reverse;

use crate::clock::Timestamp;
use crate::decision::Subject;
use crate::health::quarantine::{self, Gate};
use crate::health::signals::Signal;
use crate::health::window::Class;
use crate::health::{HealthState, signals};
use crate::strategy::Slot;

use super::record::AddressRecord;
use super::sites::NO_SITE;

use super::PoolState;
use crate::judge::sites::{self, Seen, SiteChange};
use crate::judge::{self, Evidence, Fall, PairChange, Standing, Thresholds, Verdict};

impl PoolState {
    pub(super) fn judge_site(&mut self, site: u32, slot: Slot, class: Class, now: Timestamp) {
        let (h, j) = (&self.cfg.health, &self.cfg.judgement);
        let Some(s) = self.sites.list.get_mut(site as usize) else {
            return;
        };
        s.window.push(
            Seen {
                slot,
                class,
                at: now,
            },
            h,
            j,
        );
        let Some(change) = sites::judge_site(&s.window, s.degraded, s.since, class, now, h, j)
        else {
            return;
        };
        let (from_state, to_state) = change.states();
        (s.degraded, s.since) = (to_state == "degraded", now);
        let subject = Subject::Site {
            site: s.name.to_string(),
        };
        let reason = match change {
            SiteChange::Degrade { reason, from } => {
                self.excuse(site, from);
                reason
            }
            SiteChange::Recover(reason) => reason.to_owned(),
        };
        self.decide(now, subject, from_state, to_state, reason);
        self.judge_our_side(now);
    }

    /// P9: the outcomes at `site` since `from` (the stretch that convicted it) say nothing
    /// about the addresses: excuse them in the address and address × site windows. Every such
    /// outcome is still in the site window, so its addresses are the ones to visit.
    fn excuse(&mut self, site: u32, from: Timestamp) {
        let Some(s) = self.sites.list.get(site as usize) else {
            return;
        };
        for slot in s.window.slots_since(from) {
            if let Some(r) = self.records.get_mut(slot) {
                r.window.excuse(site, from);
            }
            if let Some(c) = self.sites.cells.get_mut(&(slot, site)) {
                c.window.excuse(site, from);
            }
        }
    }

    /// P9 per address × site: the pair's own window says the address is bad for this site.
    /// It is then avoided there (its weight for the site drops to the floor), and if it does
    /// well elsewhere its failures there are not held against it (see `fall_signal`). Judged
    /// on every outcome of the pair; logged when the verdict changes.
    pub(super) fn judge_cell(&mut self, slot: Slot, site: u32, now: Timestamp) {
        if site == NO_SITE {
            return;
        }
        let cfg = &self.cfg.health;
        let Some(cell) = self.sites.cells.get_mut(&(slot, site)) else {
            return;
        };
        cell.window.expire(now);
        let Some(change) = judge::judge_pair(&cell.window, cell.avoided, cfg, now) else {
            return;
        };
        let horizon = cell.window.horizon();
        let (from, to, reason) = match change {
            PairChange::Avoid(reason) => {
                cell.avoided = true;
                if let Some(at) = horizon {
                    self.pair_checks.push(Reverse((at, slot, site)));
                    self.due_by(at);
                }
                ("ok", "avoided", reason)
            }
            PairChange::Forgive(reason) => {
                cell.avoided = false;
                self.forgive(slot, site);
                ("avoided", "ok", reason.to_owned())
            }
        };
        let (Some(rec), Some(s)) = (self.record(slot), self.sites.list.get(site as usize)) else {
            return;
        };
        let subject = Subject::Cell {
            address: rec.address.redacted().into(),
            site: s.name.to_string(),
        };
        self.decide(now, subject, from, to, reason);
    }

    /// An address × site pair is no longer avoided: the address takes its turn on that site
    /// again at once, instead of waiting out the long stride its lowest weight gave it.
    fn forgive(&mut self, slot: Slot, site: u32) {
        let Some(rec) = self.records.get(slot) else {
            return;
        };
        for &sp in &rec.sub_pools {
            if let Some(p) = self.sub_pools.get_mut(sp as usize) {
                p.keyless.forgive(slot, site);
            }
        }
    }

    /// P9: when every site with traffic is degraded, our side is to blame
    /// ([`sites::judge_our_side`]).
    fn judge_our_side(&mut self, now: Timestamp) {
        let (h, j) = (&self.cfg.health, &self.cfg.judgement);
        let judged = self.sites.list.iter();
        let judged = judged.map(|s| (s.window.has_evidence(now, h, j), s.degraded));
        if let Some((frozen, reason)) = sites::judge_our_side(judged, self.frozen) {
            self.frozen = frozen;
            let (from, to) = sites::our_side_states(frozen);
            self.decide(now, Subject::Pool, from, to, reason);
        }
    }

    /// Reads the address's windows after an outcome and moves it if they say so (P3–P5, P10):
    /// the judge decides ([`judge::evaluate`]), this applies.
    pub(super) fn evaluate(
        &mut self,
        slot: Slot,
        site: u32,
        class: Class,
        slower: bool,
        now: Timestamp,
    ) {
        let cfg = &self.cfg.health;
        // Set at push, or just now by the site's verdict (which excuses retroactively).
        let excused = self.sites.is_degraded(site);
        let Some(rec) = self.records.get_mut(slot) else {
            return;
        };
        rec.health.refresh(now, cfg);
        // The common outcome, where the judge would decide nothing: not asked.
        if judge::nothing_to_decide(rec.health.state, rec.health.suspect, class, slower) {
            return;
        }
        let standing = Standing::of(&rec.health, now, cfg);
        let thresholds = Thresholds::of(cfg);
        let mut evidence = Windows {
            pool: self,
            slot,
            slower,
            now,
        };
        let verdict = judge::evaluate(standing, class, excused, thresholds, &mut evidence);
        match verdict {
            None => {}
            Some(Verdict::Quarantine(reason)) => self.try_quarantine(slot, now, reason),
            Some(Verdict::Become(to, reason)) => self.transition(slot, to, reason, now),
            Some(Verdict::ProbeSuccess) => self.probe_success(slot, now),
            Some(Verdict::Suspect(degrade)) => {
                if let Some(reason) = degrade {
                    self.transition(slot, HealthState::Degraded, reason, now);
                }
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = Some(0);
                }
            }
            Some(Verdict::Confirm(reason)) => {
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = r.health.suspect.map(|n| n + 1);
                }
                if let Some(reason) = reason {
                    self.try_quarantine(slot, now, reason);
                }
            }
            Some(Verdict::Clear) => {
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = None;
                }
            }
        }
    }

    /// The address's fall signal (P4), judged per address × site (P9): see
    /// [`judge::address_fall`].
    fn fall_signal(&mut self, slot: Slot, now: Timestamp) -> Option<Signal> {
        let cfg = &self.cfg.health;
        let rec = self.records.get(slot)?;
        let sites = &self.sites;
        let pair_bad = |s: u32| {
            sites
                .get(slot, s)
                .is_some_and(|c| c.verdict(cfg, now).is_some())
        };
        judge::address_fall(&rec.window, cfg, now, pair_bad, &mut self.scratch_sites)
    }

    pub(super) fn probe_success(&mut self, slot: Slot, now: Timestamp) {
        let cfg = &self.cfg.health;
        let Some(rec) = self.records.get_mut(slot) else {
            return;
        };
        let (streak, rise) =
            judge::probe_pass(rec.health.probe_streak, rec.health.dwelt(now, cfg), cfg);
        rec.health.probe_streak = streak;
        if let Some(reason) = rise {
            self.transition(slot, HealthState::Healthy, reason, now);
        }
    }

    pub(super) fn gate(&self, rec: &AddressRecord) -> Gate {
        let min = self.cfg.min_in_service as usize;
        let tightest = rec
            .sub_pools
            .iter()
            .map(|sp| &self.sub_pools[*sp as usize])
            .min_by_key(|p| p.spare(min));
        Gate {
            frozen: self.frozen,
            total: self.by_address.len(),
            fraction: self.cfg.quarantine_cap,
            quarantined: self.quarantined(),
            candidate_counted: rec.health.state.counts_against_cap(),
            offered: tightest.map_or(0, |p| p.offered),
            members: tightest.map_or(0, |p| p.members.len()),
            candidate_offered: rec.health.state.is_offered(),
            min_in_service: min,
        }
    }

    /// A fall: quarantine (P6), or death after too many failed cycles (P11), unless the cap,
    /// the minimum in service or a freeze forbids it, in which case the address only loses
    /// weight (P7, P8, P9). The judge decides ([`judge::fall`]), this applies.
    pub(super) fn try_quarantine(&mut self, slot: Slot, now: Timestamp, reason: String) {
        let Some(rec) = self.record(slot) else { return };
        let gate = self.gate(rec).check();
        let Some(rec) = self.records.get(slot) else {
            return;
        };
        let decided = judge::fall(&rec.health, gate, reason, &self.cfg, now, &mut self.rng);
        let Some(h) = self.record_mut(slot).map(|r| &mut r.health) else {
            return;
        };
        match decided {
            Fall::Dead {
                reason,
                backoff_level,
                failed_cycles,
            } => {
                (h.backoff_level, h.failed_cycles) = (backoff_level, failed_cycles);
                self.transition(slot, HealthState::Dead, reason, now);
            }
            Fall::Quarantine {
                reason,
                until,
                backoff_level,
                failed_cycles,
            } => {
                (h.backoff_level, h.failed_cycles) = (backoff_level, failed_cycles);
                h.quarantined_until = Some(until);
                self.transition(slot, HealthState::Quarantined, reason, now);
            }
            Fall::Degrade(reason) => self.transition(slot, HealthState::Degraded, reason, now),
            Fall::RestartProbes => h.probe_streak = 0,
            Fall::Stay => {}
        }
    }

    pub(super) fn transition(
        &mut self,
        slot: Slot,
        to: HealthState,
        reason: String,
        now: Timestamp,
    ) {
        let Some(rec) = self.records.get_mut(slot) else {
            return;
        };
        let from = rec.health.enter(to, now, reason.clone());
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.state = Some(to);
        }
        self.by_state[from as usize] -= 1;
        self.by_state[to as usize] += 1;
        if from.is_offered() != to.is_offered() {
            let below_cap = self
                .hot
                .get(slot as usize)
                .is_some_and(|h| h.active_leases < self.cfg.max_leases_per_address);
            for &sp in &rec.sub_pools {
                let p = &mut self.sub_pools[sp as usize];
                if to.is_offered() {
                    p.offered += 1;
                    if below_cap {
                        p.keyless.join(slot);
                    }
                } else {
                    p.offered -= 1;
                    p.keyless.leave(slot);
                }
            }
        }
        if to == HealthState::Quarantined {
            self.counters.quarantine_entries += 1;
            rec.metrics.quarantined();
            self.metrics.quarantined();
            if let Some(until) = rec.health.quarantined_until {
                self.quarantine_ends.push(Reverse((until, slot)));
                self.next_due = self.next_due.min(until);
            }
        }
        let subject = Subject::Address {
            address: rec.address.redacted().into(),
        };
        self.decide(now, subject, from.as_str(), to.as_str(), reason);
        let cap = quarantine::cap(self.by_address.len(), self.cfg.quarantine_cap);
        self.metrics.states(&self.by_state, self.quarantined(), cap);
    }
}

/// What the memory engine's windows say of one address, read when the judge asks.
struct Windows<'a> {
    pool: &'a mut PoolState,
    slot: Slot,
    /// A success that may have grown the tail ([`signals::may_grow_tail`]).
    slower: bool,
    now: Timestamp,
}

impl Evidence for Windows<'_> {
    fn fall(&mut self) -> Option<Signal> {
        self.pool.fall_signal(self.slot, self.now)
    }

    fn slow_tail(&mut self, always: bool) -> Option<Signal> {
        let rec = self.pool.record(self.slot)?;
        // Read after a success that may have grown the tail, and on every outcome while
        // degraded, to see it clear.
        (self.slower || always)
            .then(|| signals::slow_tail(&rec.window, &self.pool.cfg.health))
            .flatten()
    }
}
