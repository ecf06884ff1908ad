//! What the click aggregator holds between writes: counts per (code, UTC day), and a batch
//! frozen for the click stream.

use crate::scaleout::clickstream::ClickShipper;
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::people::People;
use shortener_core::store::{ClickBatch, ClickDelta};
use smol_str::SmolStr;
use std::collections::HashMap;

/// What the fold holds for one (code, day). People's facts are boxed and made on a
/// person's first click: a bot's entry stays three words, and the map (which keeps its
/// capacity from one write to the next) a fifth of the size.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) human: u64,
    pub(super) bot: u64,
    pub(super) people: Option<Box<People>>,
}

impl Pending {
    fn absorb(&mut self, other: Pending) {
        self.human += other.human;
        self.bot += other.bot;
        if let Some(theirs) = other.people {
            match &mut self.people {
                Some(mine) => mine.merge(&theirs),
                None => self.people = Some(theirs),
            }
        }
    }
}

/// Keyed by codes of existing links only, so a fast hasher (not SipHash) is safe here.
pub(super) type Counts = HashMap<(SmolStr, Day), Pending, quick_cache::DefaultHashBuilder>;

/// Clicks folded and not yet written.
#[derive(Default)]
pub(super) struct Fold {
    pub(super) counts: Counts,
    /// Clicks folded in.
    pub(super) events: u64,
    /// People's clicks among them: each may grow its entry's people.
    pub(super) visits: u64,
    /// When the oldest of them happened: the lag metric.
    pub(super) oldest: Option<UnixSeconds>,
}

impl Fold {
    /// What it weighs against [`MAX_BACKLOG`].
    pub(super) fn cost(&self) -> u64 {
        self.counts.len() as u64 + self.visits
    }

    /// Counts a click taken from the queue.
    pub(super) fn taken(&mut self, at: UnixSeconds) {
        self.oldest = Some(self.oldest.map_or(at, |o| o.min(at)));
        self.events += 1;
    }

    /// Empties it, keeping the map's capacity.
    pub(super) fn clear(&mut self) {
        self.counts.clear();
        self.events = 0;
        self.visits = 0;
        self.oldest = None;
    }

    /// Adds the clicks of a write that failed; returns its map, emptied (capacity kept).
    pub(super) fn absorb(&mut self, mut failed: Fold) -> Counts {
        for (key, pending) in failed.counts.drain() {
            self.counts.entry(key).or_default().absorb(pending);
        }
        self.events += failed.events;
        self.visits += failed.visits;
        self.oldest = match (self.oldest, failed.oldest) {
            (Some(mine), Some(theirs)) => Some(mine.min(theirs)),
            (mine, theirs) => mine.or(theirs),
        };
        failed.counts
    }

    /// The deltas to write; people are trimmed to their stored size here, in the fold too.
    pub(super) fn deltas(&mut self) -> Vec<ClickDelta> {
        self.counts
            .iter_mut()
            .map(|((code, day), pending)| ClickDelta {
                code: code.clone(),
                day: *day,
                human: pending.human,
                bot: pending.bot,
                people: pending.people.as_deref_mut().map(|people| {
                    people.trim();
                    Box::new(people.clone())
                }),
            })
            .collect()
    }
}

/// A batch for the click stream, frozen when first sent: a failed send is retried as is.
pub(super) struct Frozen {
    pub(super) batch: ClickBatch,
    pub(super) events: u64,
    pub(super) cost: u64,
    pub(super) oldest: Option<UnixSeconds>,
}

impl Frozen {
    /// Freezes what `fold` holds into a batch; returns it and the fold's map, emptied for reuse.
    pub(super) fn of(mut fold: Fold, shipper: &ClickShipper) -> (Frozen, Counts) {
        let frozen = Frozen {
            batch: shipper.batch(fold.deltas()),
            events: fold.events,
            cost: fold.cost(),
            oldest: fold.oldest,
        };
        fold.counts.clear();
        (frozen, fold.counts)
    }
}
