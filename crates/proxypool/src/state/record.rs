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
    /// The latest end of a rate-limit cooling on any site: before it, eligibility must look
    /// at the address × site cell; after it, nothing cools and the lookup is skipped.
    pub(crate) cooling_until: Timestamp,
    pub(crate) totals: Totals,
}

impl AddressRecord {
    pub(crate) fn new(
        address: ProxyAddress,
        fingerprint: u64,
        sub_pools: Vec<u32>,
        window: Window,
        now: Timestamp,
    ) -> Self {
        Self {
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
