//! Membership: adding and removing addresses, keeping the quarantine cap (P7) and the
//! minimum in service (P8) when the pool shrinks.

use std::collections::HashSet;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::decision::Subject;
use crate::error::PoolError;
use crate::health::HealthState;
use crate::health::quarantine;
use crate::health::window::Window;
use crate::strategy::Slot;
use crate::strategy::consistent_hash::fingerprint;

use super::record::{AddressRecord, Hot};

use super::PoolState;

impl PoolState {
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
            let window = Window::new(h.window, h.window_max_age);
            let rec = AddressRecord::new(address.clone(), print, pools, window, now);
            let reason = rec.health.last_reason.clone();
            self.by_address.insert(address.clone(), slot);
            self.records.push(rec);
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
            let added = self
                .records
                .iter_from(first)
                .enumerate()
                .filter_map(|(i, r)| r.map(|r| (i, r)))
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
        let Some(rec) = self.records.remove(slot) else {
            return Err(PoolError::UnknownAddress(address.clone()));
        };
        let state = rec.health.state;
        // What only a member needs goes with the membership.
        let sub_pools = std::mem::take(&mut rec.sub_pools);
        let bound_in = std::mem::take(&mut rec.bound_in);
        // Its slot is never reused: the window's entries would stay allocated for nothing.
        rec.window = Window::new(0, std::time::Duration::ZERO);
        if let Some(h) = self.hot.get_mut(slot as usize) {
            h.state = None;
        }
        self.by_state[state as usize] -= 1;
        for (&sp, &bound) in sub_pools.iter().zip(&bound_in) {
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
        for sp in sub_pools {
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
                .filter_map(|(slot, r)| r.map(|r| (slot as Slot, &r.health)))
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
}
