//! P13 and P14: the leases out now, each with its deadline.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::clock::Timestamp;
use crate::lease::LeaseId;
use crate::strategy::Slot;

/// Outstanding leases. Ordered by deadline so the expired ones are found without a scan;
/// a release removes its entry, so the set holds only what is really out.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    next: u64,
    open: FxHashMap<LeaseId, (Slot, Timestamp)>,
    by_deadline: BTreeSet<(Timestamp, LeaseId)>,
}

impl Leases {
    pub(crate) fn open(&mut self, slot: Slot, deadline: Timestamp) -> LeaseId {
        self.next += 1;
        let id = LeaseId(self.next);
        self.open.insert(id, (slot, deadline));
        self.by_deadline.insert((deadline, id));
        id
    }

    /// The slot of an open lease, now closed; `None` if it expired or was never open.
    pub(crate) fn close(&mut self, id: LeaseId) -> Option<Slot> {
        let (slot, deadline) = self.open.remove(&id)?;
        self.by_deadline.remove(&(deadline, id));
        Some(slot)
    }

    /// Closes and returns the leases whose deadline passed by `now`.
    pub(crate) fn expire(&mut self, now: Timestamp) -> Vec<Slot> {
        let mut gone = Vec::new();
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            if let Some((slot, _)) = self.open.remove(&id) {
                gone.push(slot);
            }
        }
        gone
    }

    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}
