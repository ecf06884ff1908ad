//! Everything the pool keeps about one address.

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::health::window::{Class, Window};
use crate::health::{Health, HealthState};
use crate::hint;
use crate::snapshot::Totals;
use crate::strategy::Slot;
use crate::telemetry::AddressMetrics;

/// Laid out (C order, cache-line aligned, 512 bytes) so that an acquire + release pair of a
/// record it reaches at random touches three of its lines, all loaded in one burst
/// (`prefetch`): line 2 holds the health fields every outcome reads (the end of `Health`), the
/// address and the lease count; line 3 the window's header and sums and the success count;
/// line 4 the latencies the weight was last taken from and the metric handles of every pair
/// (lease gauge, latency, successes). Lines 0 and 1 (membership, the rest of `Health`) and
/// what follows line 4 are read at transitions, failures and snapshots. The layout is
/// checked by a test below.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct AddressRecord {
    pub(crate) fingerprint: u64,
    pub(crate) bound_keys: u64,
    /// Indices of the sub-pools it belongs to; always includes 0, the whole pool.
    pub(crate) sub_pools: Vec<u32>,
    /// `bound_keys` by the sub-pool that bound them (aligned with `sub_pools`), so a removal
    /// takes exactly its keys out of each sub-pool's mean.
    pub(crate) bound_in: Vec<u64>,
    pub(crate) health: Health,
    pub(crate) address: ProxyAddress,
    leases: u64,
    pub(crate) window: Window,
    successes: u64,
    /// The mean and reference latencies its weight's latency level was last taken from (see
    /// `PoolState::reweigh`): most successes change neither, and then no logarithm is taken.
    pub(crate) latency_seen: LatencySeen,
    pub(crate) metrics: AddressMetrics,
    failures: u64,
    captchas: u64,
    rate_limited: u64,
    abandoned: u64,
    expired: u64,
    /// Until when a rate limit keeps it from tickets without a site (they have no cell).
    pub(crate) cooling_unsited: Timestamp,
}

/// A pair of latencies as `PoolState::reweigh` compares them, in 16 bytes instead of 32: the
/// bits of each, `NONE` for unknown (a mean or a running reference is never NaN). Equal bits
/// are equal values; the only equal values with different bits, 0 and -0, merely cost a
/// needless recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LatencySeen([u64; 2]);

impl LatencySeen {
    /// A NaN's bits: no latency has them.
    const NONE: u64 = u64::MAX;

    pub(crate) fn of(mean: Option<f64>, reference: Option<f64>) -> Self {
        let bits = |x: Option<f64>| x.map_or(Self::NONE, f64::to_bits);
        Self([bits(mean), bits(reference)])
    }
}

impl AddressRecord {
    /// Starts loading the record's three lines that a pair touches, by address alone: no
    /// load waits for them.
    fn prefetch_lines(&self) {
        hint::prefetch(&self.health.state);
        hint::prefetch(&self.successes);
        hint::prefetch(&self.latency_seen);
    }

    /// Starts loading what a pair reaches through the record's pointers: the window entries
    /// the next push touches and the address a grant clones. Reads the record's lines 2 and 3
    /// (a wait if they are not in yet).
    fn prefetch_pointed(&self) {
        self.window.hint_next_push();
        self.address.prefetch_shared();
    }

    /// Reads one word from each cache line an acquire + release pair will touch and folds
    /// them together (for `black_box`). At thousands of addresses a pair reaches its record at
    /// random and the lines are far apart in memory: loaded in one burst, their misses
    /// overlap instead of following one another through the pair (unless the lines were
    /// hinted a pair ahead: `Records::prefetch`).
    pub(crate) fn prefetch(&self) -> u64 {
        (self.health.state as u64)
            ^ self.window.prefetch()
            ^ self.successes
            ^ self.latency_seen.0[0]
            ^ self.address.prefetch() as u64
    }

    /// Counts one more (`add`) or one fewer key bound through sub-pool `sp` on this address.
    pub(crate) fn count_binding(&mut self, sp: u32, add: bool) {
        let at = self.sub_pools.iter().position(|p| *p == sp);
        if let Some(n) = at.and_then(|i| self.bound_in.get_mut(i)) {
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
        }
        self.bound_keys = if add {
            self.bound_keys + 1
        } else {
            self.bound_keys.saturating_sub(1)
        };
    }

    /// One more lease granted.
    pub(crate) fn leased(&mut self) {
        self.leases += 1;
    }

    /// One more outcome of `class`.
    pub(crate) fn count(&mut self, class: Class) {
        match class {
            Class::Success => self.successes += 1,
            Class::Failure => self.failures += 1,
            Class::Captcha => self.captchas += 1,
        }
    }

    pub(crate) fn rate_limited(&mut self) {
        self.rate_limited += 1;
    }

    pub(crate) fn abandoned(&mut self) {
        self.abandoned += 1;
    }

    pub(crate) fn expired(&mut self) {
        self.expired += 1;
    }

    pub(crate) fn totals(&self) -> Totals {
        Totals {
            leases: self.leases,
            successes: self.successes,
            failures: self.failures,
            captchas: self.captchas,
            rate_limited: self.rate_limited,
            abandoned: self.abandoned,
            expired: self.expired,
        }
    }

    pub(crate) fn new(
        address: ProxyAddress,
        fingerprint: u64,
        sub_pools: Vec<u32>,
        window: Window,
        now: Timestamp,
    ) -> Self {
        Self {
            bound_in: vec![0; sub_pools.len()],
            metrics: AddressMetrics::new(address.redacted()),
            address,
            fingerprint,
            sub_pools,
            health: Health::slow_start(now),
            window,
            bound_keys: 0,
            cooling_unsited: Timestamp::default(),
            leases: 0,
            successes: 0,
            failures: 0,
            captchas: 0,
            rate_limited: 0,
            abandoned: 0,
            expired: 0,
            latency_seen: LatencySeen::of(None, None),
        }
    }
}

/// Every address's record, by slot. A removed address's record stays in place, marked (slots
/// are never reused), so that the lines of any slot's record can be hinted by address alone
/// (`prefetch`), before a load says whether it is still there: with `Option` records that
/// load, of its tag, would be a wait of its own.
#[derive(Debug, Default)]
pub(crate) struct Records {
    list: Vec<AddressRecord>,
    removed: Vec<bool>,
}

impl Records {
    pub(crate) fn get(&self, slot: Slot) -> Option<&AddressRecord> {
        let i = slot as usize;
        (!self.removed.get(i)?).then(|| self.list.get(i)).flatten()
    }

    pub(crate) fn get_mut(&mut self, slot: Slot) -> Option<&mut AddressRecord> {
        let i = slot as usize;
        (!self.removed.get(i)?)
            .then(|| self.list.get_mut(i))
            .flatten()
    }

    /// Slots given so far, removed ones included: the next one is this.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    pub(crate) fn push(&mut self, record: AddressRecord) {
        self.list.push(record);
        self.removed.push(false);
    }

    /// Marks the record removed and returns it, for the removal's last changes; `None` if it
    /// was already.
    pub(crate) fn remove(&mut self, slot: Slot) -> Option<&mut AddressRecord> {
        let i = slot as usize;
        let removed = self.removed.get_mut(i)?;
        if *removed {
            return None;
        }
        *removed = true;
        self.list.get_mut(i)
    }

    /// Every slot's record from `first` on, `None` where removed.
    pub(crate) fn iter_from(
        &self,
        first: usize,
    ) -> impl Iterator<Item = Option<&AddressRecord>> + '_ {
        let list = self.list.iter().zip(&self.removed).skip(first);
        list.map(|(r, removed)| (!removed).then_some(r))
    }

    /// Every slot's record, `None` where removed.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<&AddressRecord>> + '_ {
        self.iter_from(0)
    }

    /// The records of the addresses in the pool.
    pub(crate) fn live_mut(&mut self) -> impl Iterator<Item = &mut AddressRecord> + '_ {
        let list = self.list.iter_mut().zip(&self.removed);
        list.filter_map(|(r, removed)| (!removed).then_some(r))
    }

    /// Starts loading the lines of `slot`'s record that a pair touches, and goes on (see
    /// `hint`): for the likely next pick, a pair ahead.
    pub(crate) fn prefetch(&self, slot: Slot) {
        if let Some(r) = self.list.get(slot as usize) {
            r.prefetch_lines();
        }
    }

    /// Starts loading what `slot`'s record points to and a pair touches (see
    /// `AddressRecord::prefetch_pointed`); nothing for a slot never given.
    pub(crate) fn prefetch_pointed(&self, slot: Slot) {
        if let Some(r) = self.list.get(slot as usize) {
            r.prefetch_pointed();
        }
    }
}

/// What selection reads of every candidate, kept apart from the records in one dense array:
/// a pick among thousands of addresses touches one small entry per candidate rather than
/// several cache lines of a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hot {
    /// The record's `health.state`, mirrored on every transition; `None` once removed.
    pub(crate) state: Option<HealthState>,
    /// Leases out now (P13).
    pub(crate) active_leases: u32,
    /// The latest end of a rate-limit cooling on any site: before it, eligibility must look
    /// at the site's own cooling; after it, nothing cools and the lookup is skipped.
    pub(crate) cooling_until: Timestamp,
    /// Its quality level for tickets without a site (see `health::weight`), as of its last
    /// outcome that could move it.
    pub(crate) level: i8,
    /// The latency's part of `level` (see `PoolState::reweigh`). Here rather than in the
    /// record: every release reads it with `level`, and the padding had room.
    pub(crate) latency_level: i8,
    /// Its window held a counted bad outcome when last weighed, or got one since: its weight
    /// follows every outcome until the window is clean.
    pub(crate) bad_in_window: bool,
}

impl Hot {
    pub(crate) fn new() -> Self {
        Self {
            state: Some(HealthState::Healthy),
            active_leases: 0,
            cooling_until: Timestamp::default(),
            level: 0,
            latency_level: 0,
            bad_in_window: false,
        }
    }

    pub(crate) fn offered(&self) -> bool {
        self.state.is_some_and(HealthState::is_offered)
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The cache line (of 64 bytes) a field starts on, and whether it ends there too.
    fn line(offset: usize, size: usize) -> Option<usize> {
        (offset / 64 == (offset + size - 1) / 64).then_some(offset / 64)
    }

    #[test]
    fn a_pair_touches_three_lines_of_a_record_and_one_entry_of_hot() {
        let health = offset_of!(AddressRecord, health);
        let h = |field: usize, size: usize| line(health + field, size);
        assert_eq!(h(offset_of!(Health, state), 1), Some(2));
        assert_eq!(h(offset_of!(Health, quarantine_entries), 4), Some(2));
        assert_eq!(h(offset_of!(Health, suspect), 8), Some(2));
        assert_eq!(h(offset_of!(Health, ramp_started), 16), Some(2));
        assert_eq!(h(offset_of!(Health, since), 8), Some(2));
        assert_eq!(line(offset_of!(AddressRecord, address), 8), Some(2));
        assert_eq!(line(offset_of!(AddressRecord, leases), 8), Some(2));
        let window = size_of::<Window>();
        assert_eq!(line(offset_of!(AddressRecord, window), window), Some(3));
        assert_eq!(line(offset_of!(AddressRecord, successes), 8), Some(3));
        assert_eq!(line(offset_of!(AddressRecord, latency_seen), 16), Some(4));
        // The lease gauge, the latency histogram and the success counter lead the handles.
        assert_eq!(line(offset_of!(AddressRecord, metrics), 48), Some(4));
        assert_eq!(size_of::<AddressRecord>(), 512);
        assert_eq!(size_of::<Hot>(), 16);
    }
}
