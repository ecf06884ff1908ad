//! Grants made for callers that left — an FCALL that timed out and ran later (a paused
//! server runs what queued up when it thaws), a caller gone before its batch answered — hold
//! caps until this process gives them back. A batch Redis ran meanwhile may refuse a live
//! caller for want of what those grants hold: such a refusal says "the store is recovering",
//! not "no address" (which would be false).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Give-backs started and finished, both only ever growing.
#[derive(Default)]
pub(super) struct Stale {
    opened: AtomicU64,
    closed: AtomicU64,
}

/// Where the give-backs stood when a batch left.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    opened: u64,
    closed: u64,
}

/// One give-back under way: finished when dropped (its grants are back, or their reply was
/// lost and only the lease TTL frees them).
pub(super) struct Open(Arc<Stale>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Why a refusal was turned into a store error.
pub(super) const RECOVERING: &str =
    "recovering: grants made for callers that gave up are being given back";

impl Stale {
    /// Taken before a batch's FCALL is sent (`closed` first: it never passes `opened`).
    pub(super) fn mark(&self) -> Mark {
        let closed = self.closed.load(Ordering::SeqCst);
        Mark {
            opened: self.opened.load(Ordering::SeqCst),
            closed,
        }
    }

    /// A give-back starts: opened before any later batch's reply is read.
    pub(super) fn open(self: &Arc<Self>) -> Open {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Open(Arc::clone(self))
    }

    /// Whether the refusals of the batch that left at `mark` may be false: a give-back was
    /// under way when it left (Redis may have run it before the grants went back), or one
    /// started since (its FCALL may have left before this batch's, and Redis runs calls in
    /// the order they came on the connection). A give-back finished before the batch left
    /// was run by Redis before it.
    pub(super) fn suspect(&self, mark: Mark) -> bool {
        mark.closed < mark.opened || self.opened.load(Ordering::SeqCst) > mark.opened
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_suspect_from_a_give_back_until_it_is_done_and_a_batch_leaves_after() {
        let stale = Arc::new(Stale::default());
        let before = stale.mark();
        assert!(!stale.suspect(before));
        let open = stale.open();
        // Left before it started, answered after: the timed-out call may have come first.
        assert!(stale.suspect(before));
        let during = stale.mark();
        assert!(stale.suspect(during));
        drop(open);
        assert!(stale.suspect(during));
        let after = stale.mark();
        assert!(!stale.suspect(after));
    }
}
