//! The pool's engine: every acquire, release and transition as synchronous code on plain data.
//! It knows nothing of async, locks, HTTP or where it is stored; a store wraps it (the memory
//! store puts it behind a mutex) and passes in the time.

mod leases;
mod record;
mod sessions;
pub(crate) mod sites;
mod sub_pool;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use rand::rngs::StdRng;

use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::config::{PoolConfig, Strategy};
use crate::decision::{Decision, DecisionLog, Subject};
use crate::error::{AcquireError, PoolError};
use crate::health::quarantine::{self, Gate};
use crate::health::signals::Signal;
use crate::health::window::{Class, Entry, Window};
use crate::health::{HealthState, backoff, ramp, signals, weight};
use crate::lease::{Choice, Outcome};
use crate::snapshot::{AddressSnapshot, CellSnapshot, PoolSnapshot, Snapshot, Totals};
#[cfg(feature = "probe")]
use crate::store::ProbeTarget;
use crate::store::{Grant, Release};
use crate::strategy::consistent_hash::{Capacity, fingerprint, key_hash};
use crate::strategy::{Candidates, Slot};
use crate::telemetry::PoolMetrics;
use crate::ticket::Ticket;

pub(crate) use leases::LeaseRef;
use leases::Leases;
use record::{AddressRecord, Hot};
use sessions::{Binding, Sessions};
use sites::{NO_SITE, Sites};
use sub_pool::SubPool;

/// Smoothing of the pool's reference latency (the denominator of normalised latency).
pub(crate) const REFERENCE_LATENCY_ALPHA: f64 = 0.02;

#[derive(Debug, Default)]
struct Counters {
    acquired: u64,
    released: u64,
    abandoned: u64,
    expired: u64,
    unavailable: u64,
    sessions_broken: u64,
    quarantine_entries: u64,
}

#[derive(Debug)]
pub(crate) struct PoolState {
    cfg: PoolConfig,
    rng: StdRng,
    /// Indexed by slot; a removed address leaves `None` so slots are never reused.
    records: Vec<Option<AddressRecord>>,
    /// Indexed by slot, like `records`.
    hot: Vec<Hot>,
    by_address: HashMap<ProxyAddress, Slot>,
    sub_pools: Vec<SubPool>,
    sub_pool_index: HashMap<Arc<str>, u32>,
    sessions: Sessions,
    leases: Leases,
    sites: Sites,
    quarantine_ends: BinaryHeap<Reverse<(Timestamp, Slot)>>,
    /// Avoided address × site pairs, by when their oldest outcome ages out: each is judged
    /// again then, so a pair is forgiven when its evidence is gone, not at its next outcome.
    pair_checks: BinaryHeap<Reverse<(Timestamp, Slot, u32)>>,
    by_state: [usize; 5],
    frozen: bool,
    reference_latency_ms: Option<f64>,
    counters: Counters,
    log: DecisionLog,
    metrics: PoolMetrics,
    /// Reused by the fall judgement, so releases do not allocate.
    scratch_sites: Vec<u32>,
}

/// What strategies see of the pool for one ticket.
struct Ctx<'a> {
    records: &'a [Option<AddressRecord>],
    hot: &'a [Hot],
    sites: &'a Sites,
    cfg: &'a PoolConfig,
    /// The ticket's site.
    site: u32,
    reference_ms: Option<f64>,
    now: Timestamp,
}

impl Ctx<'_> {
    fn record(&self, slot: Slot) -> Option<&AddressRecord> {
        self.records.get(slot as usize).and_then(Option::as_ref)
    }

    /// Success rate ÷ normalised latency for the ticket's site (P1, P9): nothing when the
    /// address × site pair alone looks bad (the address is avoided there), the pair's window
    /// when it has enough samples, else the address's own window. Weights read every outcome,
    /// excused ones included: a site-wide spike lowers every address alike, while an address
    /// that fails for its own reasons during one must still lose traffic.
    fn quality(&self, slot: Slot, r: &AddressRecord) -> f64 {
        let health = &self.cfg.health;
        let pair = (self.site != NO_SITE)
            .then(|| self.sites.get(slot, self.site))
            .flatten();
        if let Some(window) = pair.map(|c| &c.window) {
            if signals::fall(window, health, self.now, &[]).is_some() {
                return 0.0;
            }
            let t = window.tallies(self.now).0;
            if t.n as usize >= health.min_samples {
                let reference = self
                    .sites
                    .list
                    .get(self.site as usize)
                    .and_then(|s| s.reference_ms);
                return weight::quality(&t, reference);
            }
        }
        weight::quality(&r.window.tallies(self.now).0, self.reference_ms)
    }
}

impl Candidates for Ctx<'_> {
    fn eligible(&self, slot: Slot) -> bool {
        self.hot.get(slot as usize).is_some_and(|h| {
            h.offered()
                && h.active_leases < self.cfg.max_leases_per_address
                && cooling(h, self.records, self.sites, slot, self.site, self.now).is_none()
        })
    }

    fn weight(&self, slot: Slot) -> f64 {
        self.record(slot).map_or(0.0, |r| {
            // Its other lines load while the weight is computed (what is weighed is what
            // gets picked, or one of two candidates).
            std::hint::black_box(r.prefetch());
            weight::weight(self.quality(slot, r), &r.health, &self.cfg.health, self.now)
        })
    }

    fn load(&self, slot: Slot) -> (u32, u8) {
        self.hot
            .get(slot as usize)
            .map_or((u32::MAX, u8::MAX), |h| {
                let unwell = match h.state {
                    Some(HealthState::Healthy) => 0,
                    Some(HealthState::Degraded) => 1,
                    _ => 2,
                };
                (h.active_leases, unwell)
            })
    }
}

/// What one evaluation of an address decided.
enum Act {
    Quarantine(String),
    Become(HealthState, String),
    ProbeSuccess,
    /// A short fall signal: suspect (degraded) until confirmed or cleared.
    Suspect(String),
    /// A failure while suspect and the signal still holds; the reason to quarantine once
    /// enough have come.
    Confirm(Option<String>),
    /// The signal no longer holds.
    Clear,
}

impl PoolState {
    pub(crate) fn new(cfg: PoolConfig, sub_pools: &[(String, Strategy)], rng: StdRng) -> Self {
        let mut pools = vec![SubPool::new("".into(), cfg.strategy, cfg.ring_vnodes)];
        let mut index = HashMap::new();
        for (name, strategy) in sub_pools {
            let name: Arc<str> = name.as_str().into();
            index.insert(Arc::clone(&name), pools.len() as u32);
            pools.push(SubPool::new(name, *strategy, cfg.ring_vnodes));
        }
        Self {
            log: DecisionLog::new(cfg.decision_log_len),
            cfg,
            rng,
            records: Vec::new(),
            hot: Vec::new(),
            by_address: HashMap::new(),
            sub_pools: pools,
            sub_pool_index: index,
            sessions: Sessions::default(),
            leases: Leases::default(),
            sites: Sites::new(),
            quarantine_ends: BinaryHeap::new(),
            pair_checks: BinaryHeap::new(),
            by_state: [0; 5],
            frozen: false,
            reference_latency_ms: None,
            counters: Counters::default(),
            metrics: PoolMetrics::new(),
            scratch_sites: Vec::new(),
        }
    }

    fn record(&self, slot: Slot) -> Option<&AddressRecord> {
        self.records.get(slot as usize).and_then(Option::as_ref)
    }

    fn record_mut(&mut self, slot: Slot) -> Option<&mut AddressRecord> {
        self.records.get_mut(slot as usize).and_then(Option::as_mut)
    }

    fn decide(&mut self, at: Timestamp, subject: Subject, from: &str, to: &str, reason: String) {
        self.log.record(Decision {
            at_ms: at.as_millis(),
            subject,
            from: from.into(),
            to: to.into(),
            reason,
        });
    }

    fn quarantined(&self) -> usize {
        self.by_state[HealthState::Quarantined as usize]
            + self.by_state[HealthState::Probing as usize]
    }

    // ---- membership -------------------------------------------------------------------------

    /// Adds a batch of addresses (all or none), each starting healthy on a slow-start ramp.
    pub(crate) fn add(
        &mut self,
        batch: Vec<(ProxyAddress, Vec<String>)>,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let mut seen = HashSet::new();
        let mut resolved = Vec::with_capacity(batch.len());
        for (address, names) in batch {
            if self.by_address.contains_key(&address) || !seen.insert(address.clone()) {
                return Err(PoolError::Duplicate(address));
            }
            let mut pools = vec![0];
            for name in names {
                let id = self
                    .sub_pool_index
                    .get(name.as_str())
                    .ok_or(PoolError::UnknownSubPool(name))?;
                if !pools.contains(id) {
                    pools.push(*id);
                }
            }
            resolved.push((address, pools));
        }
        let first = self.records.len();
        for (address, pools) in resolved {
            let slot = self.records.len() as Slot;
            for &sp in &pools {
                let p = &mut self.sub_pools[sp as usize];
                p.members.push(slot);
                p.offered += 1;
                p.keyless.join(slot);
            }
            let print = fingerprint(address.as_str());
            let h = &self.cfg.health;
            let window = Window::new(h.window, h.window_max_age, true);
            let rec = AddressRecord::new(address.clone(), print, pools, window, now);
            let reason = rec.health.last_reason.clone();
            self.by_address.insert(address.clone(), slot);
            self.records.push(Some(rec));
            self.hot.push(Hot::new());
            self.by_state[HealthState::Healthy as usize] += 1;
            let subject = Subject::Address {
                address: address.redacted().into(),
            };
            self.decide(
                now,
                subject,
                "absent",
                HealthState::Healthy.as_str(),
                reason,
            );
        }
        for (sp, pool) in self.sub_pools.iter_mut().enumerate() {
            let added = self.records[first..]
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
                .filter(|(_, r)| r.sub_pools.contains(&(sp as u32)))
                .map(|(i, r)| ((first + i) as Slot, r.address.as_str()));
            pool.ring.insert_many(added);
        }
        Ok(())
    }

    /// Removes an address. Its open leases are forgotten when they come back; sessions bound
    /// to it are reported broken on their next acquire.
    pub(crate) fn remove(
        &mut self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let slot = self
            .by_address
            .remove(address)
            .ok_or_else(|| PoolError::UnknownAddress(address.clone()))?;
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::take) else {
            return Err(PoolError::UnknownAddress(address.clone()));
        };
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.state = None;
        }
        let state = rec.health.state;
        self.by_state[state as usize] -= 1;
        for (&sp, &bound) in rec.sub_pools.iter().zip(&rec.bound_in) {
            let p = &mut self.sub_pools[sp as usize];
            // Its sessions are broken: they no longer weigh on the mean of bounded loads.
            p.bound_keys = p.bound_keys.saturating_sub(bound);
            p.members.retain(|s| *s != slot);
            p.ring.remove(slot);
            if state.is_offered() {
                p.offered -= 1;
                p.keyless.leave(slot);
            }
        }
        self.sites.forget_address(slot);
        let subject = Subject::Address {
            address: address.redacted().into(),
        };
        self.decide(now, subject, state.as_str(), "absent", "removed".into());
        for &sp in &rec.sub_pools {
            self.keep_minimum(sp, now);
        }
        self.keep_cap(now);
        Ok(())
    }

    /// P7 after a removal: a smaller pool has a smaller cap; the excess returns to service on
    /// a ramp (probing ones first, then those closest to the end of their wait).
    fn keep_cap(&mut self, now: Timestamp) {
        let cap = quarantine::cap(self.by_address.len(), self.cfg.quarantine_cap);
        while self.quarantined() > cap {
            let best = self
                .records
                .iter()
                .enumerate()
                .filter_map(|(slot, r)| r.as_ref().map(|r| (slot as Slot, &r.health)))
                .filter(|(_, h)| h.state.counts_against_cap())
                .min_by_key(|(_, h)| (h.state == HealthState::Quarantined, h.quarantined_until));
            let Some((slot, _)) = best else { return };
            let reason = format!("returned early: the pool shrank and its quarantine cap is {cap}");
            self.transition(slot, HealthState::Healthy, reason, now);
        }
    }

    /// P8 after a removal: bring back out-of-service members early until the sub-pool offers
    /// its minimum again (quarantined ones closest to their return first, the dead last).
    fn keep_minimum(&mut self, sp: u32, now: Timestamp) {
        let min = self.cfg.min_in_service as usize;
        while self.sub_pools[sp as usize].spare(min) < 0 {
            let best = self.sub_pools[sp as usize]
                .members
                .iter()
                .filter_map(|s| self.record(*s).map(|r| (*s, &r.health)))
                .filter(|(_, h)| !h.state.is_offered())
                .min_by_key(|(_, h)| (h.state == HealthState::Dead, h.quarantined_until));
            let Some((slot, _)) = best else { return };
            let reason = format!("brought back early to keep {min} in service");
            self.transition(slot, HealthState::Probing, reason, now);
        }
    }

    // ---- acquire ----------------------------------------------------------------------------

    pub(crate) fn acquire(
        &mut self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        self.sweep(now);
        let sp = match &ticket.sub_pool {
            None => 0,
            Some(name) => *self
                .sub_pool_index
                .get(&**name)
                .ok_or_else(|| AcquireError::UnknownSubPool(name.to_string()))?,
        };
        let site = self.sites.intern(ticket.site.as_ref());
        let picked = match &ticket.key {
            Some(key) => self.pick_keyed(key, sp, site, now),
            None => self.pick_keyless(sp, site, now),
        };
        let result = picked.and_then(|(slot, choice)| self.grant(slot, site, choice, now));
        if let Err(e) = &result {
            // Indices into `telemetry::FAILURES`.
            let reason = match e {
                AcquireError::NoAddressAvailable => {
                    self.counters.unavailable += 1;
                    0
                }
                AcquireError::SessionBroken { .. } => {
                    self.counters.sessions_broken += 1;
                    1
                }
                AcquireError::BoundAddressBusy { .. } => 2,
                AcquireError::BoundAddressCooling { .. } => 3,
                AcquireError::UnknownSubPool(_) => 4,
                // Only a shared store fails this way, never the engine.
                AcquireError::StoreUnavailable(_) => return result,
            };
            self.metrics.acquire_failed(reason);
        }
        result
    }

    fn ctx(&self, site: u32, now: Timestamp) -> Ctx<'_> {
        Ctx {
            records: &self.records,
            hot: &self.hot,
            sites: &self.sites,
            cfg: &self.cfg,
            site,
            reference_ms: self.reference_latency_ms,
            now,
        }
    }

    fn pick_keyed(
        &mut self,
        key: &Arc<str>,
        sp: u32,
        site: u32,
        now: Timestamp,
    ) -> Result<(Slot, Choice), AcquireError> {
        let expires = now.after(self.cfg.sticky_ttl);
        if let Some(b) = self.sessions.get_mut(key) {
            let slot = b.slot;
            let live = self
                .hot
                .get(slot as usize)
                .filter(|h| matches!(h.state, Some(HealthState::Healthy | HealthState::Degraded)));
            let refusal = match live {
                // Never move a session silently (P2): the caller ends it, the next acquire
                // starts a new one.
                None => Err(AcquireError::SessionBroken {
                    key: key.to_string(),
                    address: b.address.clone(),
                }),
                Some(h) if h.active_leases >= self.cfg.max_leases_per_address => {
                    Err(AcquireError::BoundAddressBusy {
                        key: key.to_string(),
                        address: b.address.clone(),
                    })
                }
                Some(h) => match cooling(h, &self.records, &self.sites, slot, site, now) {
                    Some(until) => Err(AcquireError::BoundAddressCooling {
                        key: key.to_string(),
                        address: b.address.clone(),
                        retry_in: until.since(now),
                    }),
                    None => {
                        b.expires = expires;
                        Ok((slot, Choice::Bound))
                    }
                },
            };
            if matches!(refusal, Err(AcquireError::SessionBroken { .. })) {
                self.unbind(key);
            }
            return refusal;
        }
        let pool = &self.sub_pools[sp as usize];
        let capacity = Capacity::new(pool.bound_keys, pool.offered, self.cfg.load_factor);
        let ctx = self.ctx(site, now);
        let hash = key_hash(key);
        let place = |capacity: Capacity| {
            pool.ring.place(hash, |s| {
                ctx.eligible(s)
                    && ctx
                        .record(s)
                        .is_some_and(|r| capacity.admits(r.fingerprint, r.bound_keys))
            })
        };
        let slot = place(capacity)
            .or_else(|| place(capacity.ceiling()))
            .ok_or(AcquireError::NoAddressAvailable)?;
        let rec = self
            .record_mut(slot)
            .ok_or(AcquireError::NoAddressAvailable)?;
        rec.count_binding(sp, true);
        let address = rec.address.clone();
        self.sub_pools[sp as usize].bound_keys += 1;
        self.sessions.bind(key, slot, address, sp, expires);
        Ok((slot, Choice::Hashed))
    }

    fn pick_keyless(
        &mut self,
        sp: u32,
        site: u32,
        now: Timestamp,
    ) -> Result<(Slot, Choice), AcquireError> {
        let ctx = Ctx {
            records: &self.records,
            hot: &self.hot,
            sites: &self.sites,
            cfg: &self.cfg,
            site,
            reference_ms: self.reference_latency_ms,
            now,
        };
        let SubPool {
            keyless, members, ..
        } = &mut self.sub_pools[sp as usize];
        let slot = keyless
            .pick(members, site, &ctx, &mut self.rng)
            .ok_or(AcquireError::NoAddressAvailable)?;
        Ok((slot, keyless.choice()))
    }

    fn grant(
        &mut self,
        slot: Slot,
        site: u32,
        choice: Choice,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        let deadline = now.after(self.cfg.lease_ttl);
        let Some(rec) = self.record(slot) else {
            return Err(AcquireError::NoAddressAvailable);
        };
        // Every line of the record this pair touches starts loading now, together.
        std::hint::black_box(rec.prefetch());
        let lease = self.leases.open(slot, deadline);
        self.counters.acquired += 1;
        self.metrics.acquired(choice);
        let (Some(rec), Some(h)) = (
            self.records.get_mut(slot as usize).and_then(Option::as_mut),
            self.hot.get_mut(slot as usize),
        ) else {
            return Err(AcquireError::NoAddressAvailable);
        };
        h.active_leases += 1;
        rec.totals.leases += 1;
        rec.metrics.active(h.active_leases);
        Ok(Grant {
            lease,
            slot,
            site,
            address: rec.address.clone(),
            choice,
        })
    }

    fn unbind(&mut self, key: &str) {
        if let Some(b) = self.sessions.unbind(key) {
            self.unbound(&b);
        }
    }

    fn unbound(&mut self, b: &Binding) {
        // A removed address took its keys out of the sub-pools' counts already.
        let Some(r) = self.record_mut(b.slot) else {
            return;
        };
        r.count_binding(b.sub_pool, false);
        if let Some(pool) = self.sub_pools.get_mut(b.sub_pool as usize) {
            pool.bound_keys = pool.bound_keys.saturating_sub(1);
        }
    }

    /// Ends a key's session now (P2): its binding is dropped and the next acquire for the key
    /// starts a new one. Whether there was one.
    pub(crate) fn end_session(&mut self, key: &str, now: Timestamp) -> bool {
        self.sweep(now);
        let ended = self.sessions.unbind(key);
        if let Some(b) = &ended {
            self.unbound(b);
        }
        ended.is_some()
    }

    // ---- release ----------------------------------------------------------------------------

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
    }

    /// An outcome of `slot` at `site`: windows, site judgement, the address's evaluation.
    fn record_outcome(&mut self, slot: Slot, site: u32, outcome: &Outcome, now: Timestamp) {
        let (class, latency) = match *outcome {
            Outcome::Success { latency } => (Class::Success, Some(latency)),
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => (Class::Failure, None),
            Outcome::Captcha => (Class::Captcha, None),
            Outcome::RateLimited { retry_after } => {
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
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if site != NO_SITE {
            let cell = self
                .sites
                .cell(slot, site, rec.address.redacted(), &self.cfg.health);
            cell.window.push(entry);
            cell.metrics.outcome(outcome);
            count(&mut cell.totals, class);
        }
        rec.window.push(entry);
        count(&mut rec.totals, class);
        rec.metrics.outcome(outcome);
        if latency.is_some() {
            let ms = f64::from(latency_ms);
            follow(&mut self.reference_latency_ms, ms);
            if let Some(s) = self.sites.list.get_mut(site as usize) {
                follow(&mut s.reference_ms, ms);
            }
        }
        self.judge_site(site, slot, class, now);
        self.judge_cell(slot, site, now);
        self.evaluate(slot, site, class, latency_ms, now);
    }

    /// A rate limit: the address cools for that site only; it is not health (no window).
    fn cool(&mut self, slot: Slot, site: u32, until: Timestamp, outcome: &Outcome) {
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.cooling_until = h.cooling_until.max(until);
        }
        rec.totals.rate_limited += 1;
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
                r.totals.abandoned += 1;
            }
        }
    }

    /// A lease on `slot` is over (released, dropped or expired): its slot is free again.
    fn lease_ended(&mut self, slot: Slot) {
        let Some(h) = self.hot.get_mut(slot as usize) else {
            return;
        };
        h.active_leases = h.active_leases.saturating_sub(1);
        if let Some(r) = self.records.get(slot as usize).and_then(Option::as_ref) {
            r.metrics.active(h.active_leases);
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

    // ---- judgement --------------------------------------------------------------------------

    fn judge_site(&mut self, site: u32, slot: Slot, class: Class, now: Timestamp) {
        let (h, j) = (&self.cfg.health, &self.cfg.judgement);
        let Some(s) = self.sites.list.get_mut(site as usize) else {
            return;
        };
        s.push(slot, class, now, h, j);
        // A success cannot make a site look worse: it is judged on bad outcomes, and on every
        // outcome while degraded (to see it recover).
        if class == Class::Success && !s.degraded {
            return;
        }
        let verdict = s.verdict(h, j);
        let change = match (s.degraded, verdict) {
            (false, Some(v)) => Some((true, v.reason, Some(v.from))),
            (true, None) if now.since(s.since) >= h.min_dwell => Some((
                false,
                "failures no longer spread over most addresses".to_owned(),
                None,
            )),
            _ => None,
        };
        let Some((degraded, reason, from)) = change else {
            return;
        };
        s.degraded = degraded;
        s.since = now;
        let subject = Subject::Site {
            site: s.name.to_string(),
        };
        let (from_state, to_state, reason) = if degraded {
            let reason = format!("{reason}: failures there are not held against addresses");
            ("ok", "degraded", reason)
        } else {
            ("degraded", "ok", reason)
        };
        if let Some(from) = from {
            self.excuse(site, from);
        }
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
        for slot in s.slots_since(from) {
            if let Some(r) = self.records.get_mut(slot as usize).and_then(Option::as_mut) {
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
    fn judge_cell(&mut self, slot: Slot, site: u32, now: Timestamp) {
        if site == NO_SITE {
            return;
        }
        let cfg = &self.cfg.health;
        let Some(cell) = self.sites.cells.get_mut(&(slot, site)) else {
            return;
        };
        let window = &mut cell.window;
        window.expire(now);
        let verdict = signals::fall(window, cfg, now, &[]);
        let horizon = window.horizon();
        if verdict.is_some() == cell.avoided {
            return;
        }
        cell.avoided = verdict.is_some();
        let (from, to, reason) = match verdict {
            Some(signal) => {
                if let Some(at) = horizon {
                    self.pair_checks.push(Reverse((at, slot, site)));
                }
                ("ok", "avoided", format!("{signal} on this site"))
            }
            None => {
                self.forgive(slot, site);
                let reason = if horizon.is_none() {
                    "its outcomes there aged out"
                } else {
                    "signals cleared"
                };
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
        let Some(rec) = self.records.get(slot as usize).and_then(Option::as_ref) else {
            return;
        };
        for &sp in &rec.sub_pools {
            if let Some(p) = self.sub_pools.get_mut(sp as usize) {
                p.keyless.forgive(slot, site);
            }
        }
    }

    /// P9: when every site with traffic is degraded, the common factor is our side (network,
    /// probes): quarantining is frozen until one recovers.
    fn judge_our_side(&mut self, now: Timestamp) {
        let j = &self.cfg.judgement;
        let judged: Vec<_> = self
            .sites
            .list
            .iter()
            .filter(|s| s.has_evidence(j))
            .collect();
        let degraded = judged.iter().filter(|s| s.degraded).count();
        let frozen = judged.len() >= 2 && degraded == judged.len();
        if frozen != self.frozen {
            self.frozen = frozen;
            let reason = format!("{degraded} of {} sites with traffic degraded", judged.len());
            let (from, to) = if frozen {
                ("quarantining", "frozen")
            } else {
                ("frozen", "quarantining")
            };
            self.decide(now, Subject::Pool, from, to, reason);
        }
    }

    /// Reads the address's windows after an outcome and moves it if they say so (P3–P5, P10).
    /// A fall is judged when a bad outcome arrives: a success cannot start one.
    fn evaluate(&mut self, slot: Slot, site: u32, class: Class, latency_ms: u16, now: Timestamp) {
        let cfg = &self.cfg.health;
        // Set at push, or just now by the site's verdict (which excuses retroactively).
        let excused = self.sites.is_degraded(site);
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        rec.health.refresh(now, cfg);
        let (state, returning) = (rec.health.state, rec.health.returning());
        let act = match state {
            HealthState::Quarantined | HealthState::Dead => None,
            HealthState::Probing if excused => None,
            HealthState::Probing if class == Class::Success => Some(Act::ProbeSuccess),
            // A captcha is reputation, judged by its rate, not a failed probe.
            HealthState::Probing if class == Class::Captcha => None,
            HealthState::Probing => Some(Act::Quarantine("failure while probing".into())),
            HealthState::Healthy | HealthState::Degraded => {
                let suspect = rec.health.suspect;
                let bad = class != Class::Success;
                // Judged on bad outcomes; on successes too while suspect, to clear it.
                let signal = (!excused && (bad || suspect.is_some()))
                    .then(|| self.fall_signal(slot, now))
                    .flatten();
                match signal {
                    _ if bad && !excused && returning && class == Class::Failure => {
                        Some(Act::Quarantine("failure during the ramp".to_owned()))
                    }
                    // "3 of the last 5" quarantines at once when the window agrees (its success
                    // rate is below the threshold too). Against a long good record it is met by
                    // chance now and then — at 2 % background failures about once per 20 000
                    // requests of a pool — so there it only makes the address suspect, and as
                    // many failures again while it holds confirm it.
                    Some(s @ Signal::RecentFailures { window_success, .. }) if bad => match suspect
                    {
                        None if window_success < self.cfg.health.min_success_rate => {
                            Some(Act::Quarantine(s.to_string()))
                        }
                        None => Some(Act::Suspect(s.to_string())),
                        Some(n) if class == Class::Failure => {
                            let n = n + 1;
                            let enough = n as usize >= self.cfg.health.recent_failures;
                            Some(Act::Confirm(
                                enough.then(|| format!("{s}, confirmed by {n} more failures")),
                            ))
                        }
                        Some(_) => None,
                    },
                    // The rates are judged over at least `min_samples` outcomes: evidence
                    // enough on its own.
                    Some(s) if bad => Some(Act::Quarantine(s.to_string())),
                    _ if bad => None,
                    None if suspect.is_some() => Some(Act::Clear),
                    _ => self.rise_or_slow(slot, class, latency_ms, state, now),
                }
            }
        };
        match act {
            None => {}
            Some(Act::Quarantine(reason)) => self.try_quarantine(slot, now, reason),
            Some(Act::Become(to, reason)) => self.transition(slot, to, reason, now),
            Some(Act::ProbeSuccess) => self.probe_success(slot, now),
            Some(Act::Suspect(signal)) => {
                if state == HealthState::Healthy {
                    let reason = format!("{signal}; suspect until as many more confirm it");
                    self.transition(slot, HealthState::Degraded, reason, now);
                }
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = Some(0);
                }
            }
            Some(Act::Confirm(reason)) => {
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = r.health.suspect.map(|n| n + 1);
                }
                if let Some(reason) = reason {
                    self.try_quarantine(slot, now, reason);
                }
            }
            Some(Act::Clear) => {
                if let Some(r) = self.record_mut(slot) {
                    r.health.suspect = None;
                }
            }
        }
    }

    /// After a success, or a bad outcome that signals nothing: a latency tail degrades a
    /// healthy address; a degraded one with nothing against it returns after the dwell.
    fn rise_or_slow(
        &self,
        slot: Slot,
        class: Class,
        latency_ms: u16,
        state: HealthState,
        now: Timestamp,
    ) -> Option<Act> {
        let rec = self.record(slot)?;
        let cfg = &self.cfg.health;
        // A tail can only have grown with a success slower than the window's mean: the
        // quantiles are read then (and on every outcome while degraded, to see it clear).
        let slower = class == Class::Success
            && rec
                .window
                .counted(now)
                .mean_latency_ms()
                .is_some_and(|mean| f64::from(latency_ms) > mean);
        let slow = (slower || state == HealthState::Degraded)
            .then(|| signals::slow_tail(&rec.window, cfg))
            .flatten();
        let dwelt = rec.health.dwelt(now, cfg);
        match (state, slow) {
            (HealthState::Healthy, Some(signal)) if dwelt => {
                Some(Act::Become(HealthState::Degraded, signal.to_string()))
            }
            (HealthState::Degraded, None) if dwelt => {
                Some(Act::Become(HealthState::Healthy, "signals cleared".into()))
            }
            _ => None,
        }
    }

    /// The address's fall signal (P4), judged per address × site (P9): the sites where the
    /// pair alone looks bad are left out when the address has at least `recent` counted
    /// outcomes elsewhere to be judged on; it is then avoided on those sites rather than
    /// quarantined everywhere. Without such evidence (one site only, or bad everywhere) every
    /// counted outcome counts.
    fn fall_signal(&mut self, slot: Slot, now: Timestamp) -> Option<Signal> {
        let cfg = &self.cfg.health;
        let rec = self.records.get(slot as usize).and_then(Option::as_ref)?;
        let (sites, bad) = (&self.sites, &mut self.scratch_sites);
        bad.clear();
        for e in rec.window.newest_first(now) {
            if !e.excused && e.site != NO_SITE && !bad.contains(&e.site) {
                bad.push(e.site);
            }
        }
        bad.retain(|s| {
            sites
                .get(slot, *s)
                .is_some_and(|c| c.verdict(cfg, now).is_some())
        });
        let elsewhere = || {
            rec.window
                .newest_first(now)
                .filter(|e| !e.excused && !bad.contains(&e.site))
                .count()
        };
        if !bad.is_empty() && elsewhere() >= cfg.recent {
            return signals::fall(&rec.window, cfg, now, bad);
        }
        signals::fall(&rec.window, cfg, now, &[])
    }

    fn probe_success(&mut self, slot: Slot, now: Timestamp) {
        let cfg = &self.cfg.health;
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        rec.health.probe_streak += 1;
        let streak = rec.health.probe_streak;
        // Rise needs more evidence than fall (P5) and the minimum dwell.
        if streak >= cfg.rise_successes && rec.health.dwelt(now, cfg) {
            let reason = format!("{streak} successes in a row; ramping up");
            self.transition(slot, HealthState::Healthy, reason, now);
        }
    }

    fn gate(&self, rec: &AddressRecord) -> Gate {
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
    /// weight (P7, P8, P9).
    fn try_quarantine(&mut self, slot: Slot, now: Timestamp, reason: String) {
        let Some(rec) = self.record(slot) else { return };
        let state = rec.health.state;
        let failed_cycle = state == HealthState::Probing || rec.health.returning();
        match self.gate(rec).check() {
            Ok(()) => {
                let (backoff_cfg, dead_after) =
                    (&self.cfg.backoff, self.cfg.health.dead_after_cycles);
                let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
                    return;
                };
                let h = &mut rec.health;
                if h.stable_since
                    .is_some_and(|s| now.since(s) >= backoff_cfg.reset_after)
                {
                    h.backoff_level = 0;
                }
                if failed_cycle {
                    h.failed_cycles += 1;
                }
                if h.failed_cycles >= dead_after {
                    let reason = format!(
                        "{reason}; {} failed quarantine cycles in a row",
                        h.failed_cycles
                    );
                    self.transition(slot, HealthState::Dead, reason, now);
                    return;
                }
                let wait = backoff::wait(h.backoff_level, backoff_cfg, &mut self.rng);
                h.backoff_level += 1;
                h.quarantined_until = Some(now.after(wait));
                let reason = format!("{reason}; quarantined for {} s", wait.as_secs());
                self.transition(slot, HealthState::Quarantined, reason, now);
            }
            Err(refusal) => match state {
                HealthState::Healthy => {
                    let reason = format!("{reason}; kept in service at reduced weight: {refusal}");
                    self.transition(slot, HealthState::Degraded, reason, now);
                }
                HealthState::Probing => {
                    if let Some(r) = self.record_mut(slot) {
                        r.health.probe_streak = 0;
                    }
                }
                _ => {}
            },
        }
    }

    fn transition(&mut self, slot: Slot, to: HealthState, reason: String, now: Timestamp) {
        let Some(rec) = self.records.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let from = rec.health.enter(to, now, reason.clone());
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.state = Some(to);
        }
        self.by_state[from as usize] -= 1;
        self.by_state[to as usize] += 1;
        if from.is_offered() != to.is_offered() {
            for &sp in &rec.sub_pools {
                let p = &mut self.sub_pools[sp as usize];
                if to.is_offered() {
                    p.offered += 1;
                    p.keyless.join(slot);
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
            }
        }
        let subject = Subject::Address {
            address: rec.address.redacted().into(),
        };
        self.decide(now, subject, from.as_str(), to.as_str(), reason);
        let cap = quarantine::cap(self.by_address.len(), self.cfg.quarantine_cap);
        self.metrics.states(&self.by_state, self.quarantined(), cap);
    }

    /// Applies what time alone decides: expired leases (P14) and bindings (P2), ended
    /// quarantines (P3). Each check is O(1) when nothing is due.
    fn sweep(&mut self, now: Timestamp) {
        if self.leases.due(now) {
            for slot in self.leases.expire(now) {
                self.counters.expired += 1;
                self.metrics.expired();
                self.lease_ended(slot);
                if let Some(r) = self.record_mut(slot) {
                    r.totals.expired += 1;
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

    // ---- snapshot ---------------------------------------------------------------------------

    #[cfg(feature = "probe")]
    /// What the prober needs of every address (P12): its full URL, state and load.
    pub(crate) fn probe_targets(&mut self, now: Timestamp) -> Vec<ProbeTarget> {
        self.sweep(now);
        self.records
            .iter()
            .zip(&self.hot)
            .filter_map(|(r, h)| r.as_ref().map(|r| (r, h)))
            .map(|(r, h)| ProbeTarget {
                address: r.address.clone(),
                state: r.health.state,
                active_leases: h.active_leases,
            })
            .collect()
    }

    pub(crate) fn snapshot(&mut self, now: Timestamp) -> Snapshot {
        self.sweep(now);
        let cfg = &self.cfg.health;
        for rec in self.records.iter_mut().flatten() {
            rec.health.refresh(now, cfg);
            rec.window.expire(now);
        }
        for c in self.sites.cells.values_mut() {
            c.window.expire(now);
        }
        for site in &mut self.sites.list {
            site.expire(now, cfg.window_max_age, self.cfg.judgement.site_recent);
        }
        let ctx = self.ctx(NO_SITE, now);
        let addresses = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| r.as_ref().map(|r| (slot as Slot, r)))
            .map(|(slot, r)| {
                let all = r.window.tallies(now).0;
                let quantiles = r.window.exact_quantiles(now);
                AddressSnapshot {
                    address: r.address.redacted().into(),
                    fingerprint: format!("{:016x}", r.fingerprint),
                    sub_pools: r.sub_pools[1..]
                        .iter()
                        .map(|sp| self.sub_pools[*sp as usize].name.to_string())
                        .collect(),
                    state: r.health.state,
                    state_since_ms: r.health.since.as_millis(),
                    reason: r.health.last_reason.clone(),
                    weight: if r.health.state.is_offered() {
                        ctx.weight(slot)
                    } else {
                        0.0
                    },
                    ramp_share: r
                        .health
                        .ramp_started
                        .and_then(|s| ramp::share(&cfg.ramp_steps, cfg.ramp_duration, s, now)),
                    active_leases: self.hot.get(slot as usize).map_or(0, |h| h.active_leases),
                    bound_keys: r.bound_keys,
                    window_samples: all.n as usize,
                    success_rate: all.rate(all.successes),
                    captcha_rate: all.rate(all.captchas),
                    latency_p50_ms: quantiles.map(|q| q.0),
                    latency_p95_ms: quantiles.map(|q| q.1),
                    quarantined_until_ms: r.health.quarantined_until.map(Timestamp::as_millis),
                    quarantine_entries: r.health.quarantine_entries,
                    backoff_level: r.health.backoff_level,
                    failed_cycles: r.health.failed_cycles,
                    totals: r.totals.clone(),
                }
            })
            .collect();
        // Named sites from their cells; the site-less column derived from each address: its
        // window's untagged outcomes, its totals less those of its named cells.
        let mut unsited: Vec<Totals> = self
            .records
            .iter()
            .map(|r| r.as_ref().map(|r| r.totals.clone()).unwrap_or_default())
            .collect();
        let mut matrix: Vec<CellSnapshot> = Vec::new();
        for ((slot, site), cell) in &self.sites.cells {
            let (Some(r), Some(s)) = (self.record(*slot), self.sites.list.get(*site as usize))
            else {
                continue;
            };
            if let Some(t) = unsited.get_mut(*slot as usize) {
                t.successes -= cell.totals.successes;
                t.failures -= cell.totals.failures;
                t.captchas -= cell.totals.captchas;
                t.rate_limited -= cell.totals.rate_limited;
            }
            let all = cell.window.tallies(now).0;
            matrix.push(CellSnapshot {
                address: r.address.redacted().into(),
                site: s.name.to_string(),
                window_samples: all.n as usize,
                success_rate: all.rate(all.successes),
                captcha_rate: all.rate(all.captchas),
                avoided: cell.verdict(cfg, now).is_some(),
                cooling_until_ms: cell
                    .cooling_until
                    .filter(|u| *u > now)
                    .map(Timestamp::as_millis),
                totals: cell.totals.clone(),
            });
        }
        for (r, totals) in self.records.iter().zip(unsited) {
            let Some(r) = r else { continue };
            let all = r.window.site_tally(NO_SITE, now);
            let cooling = (r.cooling_unsited > now).then_some(r.cooling_unsited);
            let outcomes = totals.successes + totals.failures + totals.captchas;
            if outcomes + totals.rate_limited == 0 && cooling.is_none() {
                continue;
            }
            matrix.push(CellSnapshot {
                address: r.address.redacted().into(),
                site: "-".into(),
                window_samples: all.n as usize,
                success_rate: all.rate(all.successes),
                captcha_rate: all.rate(all.captchas),
                avoided: false,
                cooling_until_ms: cooling.map(Timestamp::as_millis),
                totals: Totals {
                    successes: totals.successes,
                    failures: totals.failures,
                    captchas: totals.captchas,
                    rate_limited: totals.rate_limited,
                    ..Default::default()
                },
            });
        }
        matrix.sort_by(|a, b| (&a.address, &a.site).cmp(&(&b.address, &b.site)));
        let c = &self.counters;
        let pool = PoolSnapshot {
            addresses: self.by_address.len(),
            by_state: HealthState::ALL
                .iter()
                .map(|s| (*s, self.by_state[*s as usize]))
                .collect(),
            offered: self.sub_pools[0].offered,
            quarantined: self.quarantined(),
            quarantine_cap: quarantine::cap(self.by_address.len(), self.cfg.quarantine_cap),
            quarantine_entries: c.quarantine_entries,
            frozen: self.frozen,
            active_leases: self.leases.len() as u64,
            bindings: self.sessions.len(),
            acquired: c.acquired,
            released: c.released,
            abandoned: c.abandoned,
            expired: c.expired,
            unavailable: c.unavailable,
            sessions_broken: c.sessions_broken,
        };
        Snapshot {
            at_ms: now.as_millis(),
            addresses,
            matrix,
            sites: self.sites.list.iter().map(sites::Site::snapshot).collect(),
            pool,
            decisions: self.log.recent(),
        }
    }
}

/// Until when a rate limit keeps the address from tickets of `site`, if it still does.
fn cooling(
    h: &Hot,
    records: &[Option<AddressRecord>],
    sites: &Sites,
    slot: Slot,
    site: u32,
    now: Timestamp,
) -> Option<Timestamp> {
    // The latest end over all sites: nothing cools once it has passed (the common case).
    if h.cooling_until <= now {
        return None;
    }
    let until = if site == NO_SITE {
        records
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|r| r.cooling_unsited)
    } else {
        sites.get(slot, site).and_then(|c| c.cooling_until)
    };
    until.filter(|u| *u > now)
}

/// Moves a running latency towards a new sample.
fn follow(reference: &mut Option<f64>, ms: f64) {
    *reference = Some(match *reference {
        None => ms,
        Some(r) => r + REFERENCE_LATENCY_ALPHA * (ms - r),
    });
}

fn count(t: &mut Totals, class: Class) {
    match class {
        Class::Success => t.successes += 1,
        Class::Failure => t.failures += 1,
        Class::Captcha => t.captchas += 1,
    }
}
