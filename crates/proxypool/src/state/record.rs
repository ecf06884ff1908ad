//! Everything the pool keeps about one address.

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::health::Health;
use crate::health::window::Window;
use crate::snapshot::Totals;
use crate::telemetry::AddressMetrics;

#[derive(Debug)]
pub(crate) struct AddressRecord {
    pub(crate) address: ProxyAddress,
    pub(crate) metrics: AddressMetrics,
    pub(crate) fingerprint: u64,
    /// Indices of the sub-pools it belongs to; always includes 0, the whole pool.
    pub(crate) sub_pools: Vec<u32>,
    pub(crate) health: Health,
    pub(crate) window: Window,
    pub(crate) active_leases: u32,
    pub(crate) bound_keys: u64,
    /// `bound_keys` by the sub-pool that bound them (aligned with `sub_pools`), so a removal
    /// takes exactly its keys out of each sub-pool's mean.
    pub(crate) bound_in: Vec<u64>,
    /// The latest end of a rate-limit cooling on any site: before it, eligibility must look
    /// at the address × site cell; after it, nothing cools and the lookup is skipped.
    pub(crate) cooling_until: Timestamp,
    pub(crate) totals: Totals,
}

impl AddressRecord {
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
            active_leases: 0,
            bound_keys: 0,
            cooling_until: Timestamp::default(),
            totals: Totals::default(),
        }
    }
}
