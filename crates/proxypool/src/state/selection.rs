//! Selection: acquire (bindings, the ring, keyless strategies), the view strategies see,
//! and the end of sessions.

use std::cell::Cell;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::config::PoolConfig;
use crate::error::AcquireError;
use crate::health::{HealthState, signals, weight};
use crate::hint;
use crate::lease::Choice;
use crate::store::Grant;
use crate::strategy::consistent_hash::{Capacity, key_hash};
use crate::strategy::{Candidates, Slot};
use crate::ticket::Ticket;

use super::NO_SLOT;
use super::record::{AddressRecord, Hot, Records};
use super::sessions::Binding;
use super::sites::{NO_SITE, Sites};
use super::sub_pool::SubPool;

use super::PoolState;

/// What strategies see of the pool for one ticket.
pub(super) struct Ctx<'a> {
    records: &'a Records,
    hot: &'a [Hot],
    sites: &'a Sites,
    cfg: &'a PoolConfig,
    /// The ticket's site.
    site: u32,
    now: Timestamp,
    /// The last two slots the pick hinted as likely next picks (`NO_SLOT` where none): the
    /// lines their records point to are hinted once their records' lines are in
    /// (`PoolState::hint_upcoming`).
    next: Cell<[Slot; 2]>,
}

impl Ctx<'_> {
    fn record(&self, slot: Slot) -> Option<&AddressRecord> {
        self.records.get(slot)
    }

    /// The quality level for the ticket's site (P1, P9, see `health::weight`): none when the
    /// address × site pair alone looks bad (the address is avoided there, at the lowest
    /// weight), the pair's window's when it has enough samples, else the address's own, as of
    /// its last outcome that could move it (`PoolState::reweigh`, as the Redis store keeps it).
    /// Weights read every outcome, excused ones included: a site-wide spike lowers every
    /// address alike, while an address that fails for its own reasons during one must still
    /// lose traffic.
    fn level(&self, slot: Slot, h: &Hot) -> Option<i8> {
        let health = &self.cfg.health;
        let pair = (self.site != NO_SITE)
            .then(|| self.sites.get(slot, self.site))
            .flatten();
        if let Some(window) = pair.map(|c| &c.window) {
            if signals::fall(window, health, self.now, &[]).is_some() {
                return None;
            }
            let t = window.tallies(self.now).0;
            if t.n as usize >= health.min_samples {
                let reference = self
                    .sites
                    .list
                    .get(self.site as usize)
                    .and_then(|s| s.reference_ms);
                return Some(weight::level(
                    weight::latency_level(t.mean_latency_ms(), reference),
                    &t,
                ));
            }
        }
        Some(h.level)
    }

    /// The weight for the ticket's site (for snapshots; picks use its step).
    pub(super) fn weight(&self, slot: Slot) -> f64 {
        let (Some(r), Some(h)) = (self.record(slot), self.hot.get(slot as usize)) else {
            return 0.0;
        };
        // No burst of its own: what gets weighed was hinted a pair ahead as the likely pick,
        // and the grant's burst follows.
        match self.level(slot, h) {
            Some(level) => weight::weight(level, &r.health, &self.cfg.health, self.now),
            None if r.health.state.is_offered() => weight::MIN_WEIGHT,
            None => 0.0,
        }
    }
}

impl Candidates for Ctx<'_> {
    fn upcoming(&self, slot: Slot) {
        if let Some(h) = self.hot.get(slot as usize) {
            hint::prefetch(h);
        }
        self.records.prefetch(slot);
        let [_, last] = self.next.get();
        self.next.set([last, slot]);
    }

    fn eligible(&self, slot: Slot) -> bool {
        self.hot.get(slot as usize).is_some_and(|h| {
            h.offered()
                && h.active_leases < self.cfg.max_leases_per_address
                && cooling(h, self.records, self.sites, slot, self.site, self.now).is_none()
        })
    }

    fn step(&self, slot: Slot) -> u32 {
        weight::step(self.weight(slot))
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

impl PoolState {
    pub(crate) fn acquire(
        &mut self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        self.sweep(now);
        let sp = match &ticket.sub_pool {
            None => Ok(0),
            Some(name) => self
                .sub_pool_index
                .get(&**name)
                .copied()
                .ok_or_else(|| AcquireError::UnknownSubPool(name.to_string())),
        };
        // Every refusal is counted below, an unknown sub-pool's too.
        let result = sp.and_then(|sp| {
            let site = self.sites.intern(ticket.site.as_ref());
            let picked = match &ticket.key {
                Some(key) => self.pick_keyed(key, sp, site, now),
                None => self.pick_keyless(sp, site, now),
            };
            picked.and_then(|(slot, choice)| self.grant(slot, site, choice, now))
        });
        if let Err(e) = &result {
            match e {
                AcquireError::NoAddressAvailable => self.counters.unavailable += 1,
                AcquireError::SessionBroken { .. } => self.counters.sessions_broken += 1,
                _ => {}
            }
            self.metrics.acquire_failed(e);
        }
        result
    }

    pub(super) fn ctx(&self, site: u32, now: Timestamp) -> Ctx<'_> {
        Ctx {
            records: &self.records,
            hot: &self.hot,
            sites: &self.sites,
            cfg: &self.cfg,
            site,
            now,
            next: Cell::new([NO_SLOT; 2]),
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
        // Before the lookup, by key hash alone (see `Sessions::hints`).
        let hinted = self.sessions.hint(key);
        if let Some(slot) = hinted {
            self.records.prefetch(slot);
            if let Some(h) = self.hot.get(slot as usize) {
                hint::prefetch(h);
            }
        }
        if let Some(b) = self.sessions.get(key) {
            let slot = b.slot;
            // The record's lines (unless hinted already) and the address a grant clones (the
            // binding holds it too) load while its `Hot` entry is read and the grant prepared.
            if hinted != Some(slot) {
                self.records.prefetch(slot);
            }
            b.address.prefetch_shared();
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
                        b.expires.set(expires);
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
        // A new session starts only where an existing one may stay (healthy or degraded): one
        // placed on a probing address would break at its next acquire.
        let place = |capacity: Capacity| {
            pool.ring.place(hash, |s| {
                ctx.eligible(s)
                    && ctx.hot.get(s as usize).is_some_and(|h| {
                        matches!(h.state, Some(HealthState::Healthy | HealthState::Degraded))
                    })
                    && ctx
                        .record(s)
                        .is_some_and(|r| capacity.admits(r.fingerprint, r.bound_keys))
            })
        };
        let slot = place(capacity)
            .or_else(|| place(capacity.ceiling()))
            .ok_or_else(no_address)?;
        let rec = self.record_mut(slot).ok_or_else(no_address)?;
        rec.count_binding(sp, true);
        let address = rec.address.clone();
        self.sub_pools[sp as usize].bound_keys += 1;
        self.sessions.bind(key, slot, address, sp, expires);
        self.due_by(expires);
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
            now,
            next: Cell::new([NO_SLOT; 2]),
        };
        let SubPool {
            keyless, members, ..
        } = &mut self.sub_pools[sp as usize];
        let picked = keyless.pick(members, site, &ctx, &mut self.rng);
        let choice = keyless.choice();
        self.upcoming = ctx.next.get();
        let slot = picked.ok_or_else(no_address)?;
        Ok((slot, choice))
    }

    pub(super) fn grant(
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
        self.due_by(deadline);
        self.counters.acquired += 1;
        self.metrics.acquired(choice);
        let (Some(rec), Some(h)) = (self.records.get_mut(slot), self.hot.get_mut(slot as usize))
        else {
            return Err(AcquireError::NoAddressAvailable);
        };
        h.active_leases += 1;
        rec.leased();
        rec.metrics.active(h.active_leases);
        if h.active_leases == self.cfg.max_leases_per_address {
            // At its cap: out of the weighted schedules until a lease ends (as the Redis
            // store takes it out of `pass`).
            for &sp in &rec.sub_pools {
                if let Some(p) = self.sub_pools.get_mut(sp as usize) {
                    p.keyless.leave(slot);
                }
            }
        }
        Ok(Grant {
            lease,
            slot,
            site,
            address: rec.address.clone(),
            choice,
        })
    }

    pub(super) fn unbind(&mut self, key: &str) {
        if let Some(b) = self.sessions.unbind(key) {
            self.unbound(&b);
        }
    }

    pub(super) fn unbound(&mut self, b: &Binding) {
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
}

/// Until when a rate limit keeps the address from tickets of `site`, if it still does.
pub(super) fn cooling(
    h: &Hot,
    records: &Records,
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
        records.get(slot).map(|r| r.cooling_unsited)
    } else {
        sites.get(slot, site).and_then(|c| c.cooling_until)
    };
    until.filter(|u| *u > now)
}

/// The refusal when nothing can be picked, made only then: `ok_or` would build (and drop)
/// the error on every pick that succeeds.
fn no_address() -> AcquireError {
    AcquireError::NoAddressAvailable
}
