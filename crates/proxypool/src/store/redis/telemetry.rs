//! The pool's metrics (P16, [`crate::telemetry`]'s handles and names) on the Redis store.
//! Counters are this process's: the acquires it made, their refusals, the outcomes it
//! reported, the leases it dropped and the quarantines it decided (each decision is applied by
//! one process, so the sum over processes is the pool's). Gauges describe the shared pool —
//! addresses by state, cap occupancy, open leases per address — and are set from each
//! snapshot read, so every process exports the same values, as of its latest snapshot (the
//! server takes one per scrape). Leases lost by expiry are counted by the process whose
//! snapshot first sees them (the library's sweep does not say whose they were), so the sum
//! over processes is the pool's too, as of their snapshots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{RedisStore, SharedView};
use crate::clock::Timestamp;
use crate::error::{AcquireError, PoolError};
use crate::health::HealthState;
use crate::state::LeaseRef;
use crate::store::{Grant, Release};
use crate::telemetry::{AddressMetrics, CellMetrics, PoolMetrics};
use crate::ticket::Ticket;

pub(super) struct Telemetry {
    pool: PoolMetrics,
    /// Address id → its handles, registered when a grant or a snapshot names the address;
    /// forgotten with the address cache when Redis lost the pool (ids then name others).
    addresses: Mutex<HashMap<u32, Arc<Handles>>>,
}

/// One address's handles, with those of its pairs by this process's site ids.
struct Handles {
    label: String,
    own: AddressMetrics,
    cells: Mutex<HashMap<u32, CellMetrics>>,
}

impl Telemetry {
    /// Registers the pool's handles: with the recorder installed before the store is built.
    pub(super) fn new() -> Self {
        Self {
            pool: PoolMetrics::new(),
            addresses: Mutex::new(HashMap::new()),
        }
    }

    fn handles(&self, id: u32, label: &str) -> Arc<Handles> {
        let mut addresses = self
            .addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(addresses.entry(id).or_insert_with(|| {
            Arc::new(Handles {
                label: label.to_owned(),
                own: AddressMetrics::new(label),
                cells: Mutex::new(HashMap::new()),
            })
        }))
    }

    fn known(&self, id: u32) -> Option<Arc<Handles>> {
        self.addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Redis lost the pool: the same ids will name other addresses.
    pub(super) fn forget(&self) {
        self.addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// A decision this process applied took the address into quarantine.
    pub(super) fn quarantined(&self, id: u32) {
        self.pool.quarantined();
        if let Some(h) = self.known(id) {
            h.own.quarantined();
        }
    }

    /// The shared pool's gauges, from a snapshot read (`view.ids` names its rows).
    pub(super) fn observe(&self, view: &SharedView) {
        let pool = &view.snapshot.pool;
        let mut by_state = [0; 5];
        for (state, n) in &pool.by_state {
            if let Some(i) = HealthState::ALL.iter().position(|s| s == state) {
                by_state[i] = *n;
            }
        }
        self.pool
            .states(&by_state, pool.quarantined, pool.quarantine_cap);
        self.pool.expired(view.expired_untold);
        for (&id, row) in view.ids.iter().zip(&view.snapshot.addresses) {
            self.handles(id, &row.address).own.active(row.active_leases);
        }
    }
}

impl RedisStore {
    /// [`Self::acquire`], counted by choice or by the reason of its refusal.
    pub(crate) async fn acquire_counted(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        let result = self.acquire(ticket, now).await;
        match &result {
            Ok(grant) => {
                self.telemetry.pool.acquired(grant.choice);
                self.telemetry.handles(grant.slot, grant.address.redacted());
            }
            Err(e) => self.telemetry.pool.acquire_failed(e),
        }
        result
    }

    /// [`Self::release`], its outcome counted for the address and its pair with a named site
    /// (as this process saw it, whether or not Redis answered).
    pub(crate) async fn release_counted(
        &self,
        release: Release,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        // Registered by the grant; absent only if Redis lost the pool meanwhile.
        if let Some(h) = self.telemetry.known(release.slot) {
            h.own.outcome(&release.outcome);
            if release.site != 0 {
                let mut cells = h.cells.lock().unwrap_or_else(PoisonError::into_inner);
                cells
                    .entry(release.site)
                    .or_insert_with(|| CellMetrics::new(&h.label, &self.site_name(release.site)))
                    .outcome(&release.outcome);
            }
        }
        self.release(release, now).await
    }

    /// [`Self::abandon_kept`], counted as a lease lost.
    pub(crate) fn abandon_counted(self: &Arc<Self>, lease: LeaseRef, slot: u32, now: Timestamp) {
        self.telemetry.pool.abandoned();
        self.abandon_kept(lease, slot, now);
    }

    /// [`Self::abandon_settled`], counted as a lease lost.
    pub(crate) async fn abandon_settled_counted(
        &self,
        lease: LeaseRef,
        slot: u32,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.telemetry.pool.abandoned();
        self.abandon_settled(lease, slot, now).await
    }
}
