//! P13 and P14: the leases out now, each with its deadline.

use std::collections::VecDeque;

use crate::clock::Timestamp;
use crate::lease::LeaseId;
use crate::strategy::Slot;

/// An open lease as the engine finds it again: its id and its entry in the table, so closing
/// it is an index and a comparison, no hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseRef {
    pub(crate) id: LeaseId,
    entry: u32,
}

/// Outstanding leases in a table whose free entries are reused. Every lease gets the same
/// TTL, so deadlines come in opening order and a queue finds the expired ones without a scan
/// or a tree. Closing a lease frees its entry only; its queue entry is skipped when it
/// surfaces, and the queue is compacted when such entries dominate, so both calls are
/// amortised O(1). (A clock stepping back can only delay expiries behind a later deadline,
/// never lose one.)
#[derive(Debug, Default)]
pub(crate) struct Leases {
    next: u64,
    /// By entry: the lease there and its address, `None` when free.
    entries: Vec<Option<(LeaseId, Slot)>>,
    free: Vec<u32>,
    open: usize,
    by_deadline: VecDeque<(Timestamp, LeaseRef)>,
}

impl LeaseRef {
    /// A lease kept by a shared store, which finds it again by id alone.
    #[cfg(feature = "redis")]
    pub(crate) fn shared(id: LeaseId) -> Self {
        Self { id, entry: 0 }
    }
}

impl Leases {
    pub(crate) fn open(&mut self, slot: Slot, deadline: Timestamp) -> LeaseRef {
        self.next += 1;
        let id = LeaseId(self.next);
        let entry = match self.free.pop() {
            Some(entry) => entry,
            None => {
                self.entries.push(None);
                u32::try_from(self.entries.len() - 1).unwrap_or(u32::MAX)
            }
        };
        if let Some(e) = self.entries.get_mut(entry as usize) {
            *e = Some((id, slot));
        }
        self.open += 1;
        let lease = LeaseRef { id, entry };
        self.by_deadline.push_back((deadline, lease));
        lease
    }

    fn is_open(&self, lease: LeaseRef) -> bool {
        matches!(self.entries.get(lease.entry as usize), Some(Some((id, _))) if *id == lease.id)
    }

    /// The slot of an open lease, now closed; `None` if it expired or was never open.
    pub(crate) fn close(&mut self, lease: LeaseRef) -> Option<Slot> {
        if !self.is_open(lease) {
            return None;
        }
        let (_, slot) = self.entries.get_mut(lease.entry as usize)?.take()?;
        self.free.push(lease.entry);
        self.open -= 1;
        // Leases mostly end in the order they began: drop closed ones from the front at once.
        while self
            .by_deadline
            .front()
            .is_some_and(|(_, l)| !self.is_open(*l))
        {
            self.by_deadline.pop_front();
        }
        if self.by_deadline.len() > 2 * self.open + 1024 {
            let mut queue = std::mem::take(&mut self.by_deadline);
            queue.retain(|(_, l)| self.is_open(*l));
            self.by_deadline = queue;
        }
        Some(slot)
    }

    /// Whether a deadline passed by `now`: one comparison, so the common case costs nothing.
    pub(crate) fn due(&self, now: Timestamp) -> bool {
        self.by_deadline.front().is_some_and(|(d, _)| *d <= now)
    }

    /// The earliest deadline still queued (a lease closed since may have had it).
    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.by_deadline.front().map(|(d, _)| *d)
    }

    /// Closes and returns the leases whose deadline passed by `now`.
    pub(crate) fn expire(&mut self, now: Timestamp) -> Vec<Slot> {
        let mut gone = Vec::new();
        while let Some(&(deadline, lease)) = self.by_deadline.front() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_front();
            gone.extend(self.close(lease));
        }
        gone
    }

    pub(crate) fn len(&self) -> usize {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p14_leases_expire_in_deadline_order_and_released_ones_never() {
        let mut l = Leases::default();
        let at = Timestamp::from_millis;
        let a = l.open(1, at(100));
        let b = l.open(2, at(200));
        l.open(3, at(300));
        assert_eq!(l.close(a), Some(1));
        assert_eq!(l.close(a), None);
        // `a`'s entry is reused; its old reference still finds nothing.
        let d = l.open(4, at(400));
        assert_ne!(d.id, a.id);
        assert_eq!(l.close(a), None);
        assert_eq!(l.expire(at(250)), vec![2]);
        assert_eq!(l.close(b), None);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn p14_released_leases_do_not_pile_up() {
        let mut l = Leases::default();
        for _ in 0..100_000 {
            let lease = l.open(0, Timestamp::from_millis(1));
            l.close(lease);
        }
        assert!(l.by_deadline.len() <= 1024, "{}", l.by_deadline.len());
        assert_eq!((l.entries.len(), l.len()), (1, 0));
    }
}
