//! Smooth weighted selection by stride scheduling, one schedule per target site.
//!
//! Each offered address carries a virtual "pass"; the lowest pass is picked and advances by
//! `SCALE / weight`. Over any stretch an address's share is proportional to its weight and it
//! is never picked twice in a row while another address is due (smooth, like nginx's SWRR),
//! but a pick costs one sift of a 4-ary heap, O(log n), instead of SWRR's O(n) scan.
//! Weights are read at pick time, so they may change between picks at no cost.
//!
//! Weights depend on the ticket's site (an address bad on one site is avoided there only), so
//! each site has its own schedule: with one shared schedule an address's turns would be spread
//! over the sites in proportion to their traffic, whatever its weight on each.

use rustc_hash::FxHashMap;

use super::{Candidates, Slot};

const SCALE: f64 = 1_000_000.0;
/// The pass of an address that is not offered.
const ABSENT: u64 = u64::MAX;
/// Schedules kept per sub-pool. Past this the least recently used one is dropped (and rebuilt,
/// its history forgotten, when its site comes back), so memory stays bounded however many
/// sites callers name.
const MAX_SCHEDULES: usize = 64;

/// A binary min-heap of `(pass, slot)` packed into one `u128` (pass high, slot low: ties go
/// to the lower slot), so that a sift compares plain integers. A pick replaces the minimum
/// with its next pass, which usually belongs near the bottom, so the sift goes bottom-up
/// (Floyd): down along the smaller children to a leaf with one comparison per level, then up
/// the few steps to the new key's place — about half the comparisons of a classic sift-down.
/// This is the whole cost of a weighted pick, so it is kept this lean.
#[derive(Debug, Default)]
struct Heap(Vec<u128>);

/// Ties (a batch of addresses joining at once) go in a scrambled but fixed order of slots, an
/// invertible multiplication: a list sorted by provider or subnet would otherwise put its
/// first block in front of all the early traffic.
const SCRAMBLE: u32 = 0x9E37_79B1;
const UNSCRAMBLE: u32 = inverse(SCRAMBLE);

/// The multiplicative inverse of an odd number modulo 2^32 (Newton's iteration).
const fn inverse(m: u32) -> u32 {
    let mut x = m;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(m.wrapping_mul(x)));
        i += 1;
    }
    x
}

fn key(pass: u64, slot: Slot) -> u128 {
    (u128::from(pass) << 32) | u128::from(slot.wrapping_mul(SCRAMBLE))
}

fn unkey(k: u128) -> (u64, Slot) {
    ((k >> 32) as u64, (k as u32).wrapping_mul(UNSCRAMBLE))
}

impl Heap {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn peek(&self) -> Option<(u64, Slot)> {
        self.0.first().copied().map(unkey)
    }

    fn push(&mut self, pass: u64, slot: Slot) {
        self.0.push(key(pass, slot));
        let last = self.0.len() - 1;
        self.sift_up(last, key(pass, slot));
    }

    /// Moves `k` up from the hole at `i` to its place.
    fn sift_up(&mut self, mut i: usize, k: u128) {
        let h = &mut self.0[..];
        while i > 0 {
            let parent = (i - 1) / 2;
            if h[parent] <= k {
                break;
            }
            h[i] = h[parent];
            i = parent;
        }
        if let Some(at) = h.get_mut(i) {
            *at = k;
        }
    }

    /// Replaces the minimum and restores the order.
    fn replace_top(&mut self, pass: u64, slot: Slot) {
        let h = &mut self.0[..];
        let n = h.len();
        let mut i = 0;
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && h[right] < h[left] {
                right
            } else {
                left
            };
            h[i] = h[child];
            i = child;
        }
        self.sift_up(i, key(pass, slot));
    }

    fn pop(&mut self) {
        if let Some(last) = self.0.pop()
            && !self.0.is_empty()
        {
            let (pass, slot) = unkey(last);
            self.replace_top(pass, slot);
        }
    }

    fn rebuild(&mut self, entries: impl Iterator<Item = (u64, Slot)>) {
        self.0.clear();
        for (pass, slot) in entries {
            self.push(pass, slot);
        }
    }
}

#[derive(Debug, Default)]
struct Schedule {
    heap: Heap,
    /// The pass of every address by slot; heap entries that disagree are stale and dropped
    /// when they surface, so leaving costs O(1).
    pass: Vec<u64>,
    live: usize,
    /// Pass of the last pick: newcomers join here, so they get no burst of catch-up picks.
    vtime: u64,
    last_used: u64,
}

impl Schedule {
    fn join(&mut self, slot: Slot) {
        let i = slot as usize;
        if self.pass.len() <= i {
            self.pass.resize(i + 1, ABSENT);
        }
        if self.pass[i] == ABSENT {
            self.pass[i] = self.vtime;
            self.heap.push(self.vtime, slot);
            self.live += 1;
        }
    }

    fn leave(&mut self, slot: Slot) {
        if let Some(p) = self.pass.get_mut(slot as usize)
            && *p != ABSENT
        {
            *p = ABSENT;
            self.live -= 1;
        }
        // Keep stale entries from outnumbering live ones.
        if self.heap.len() > 2 * self.live + 64 {
            let live = self.pass.iter().enumerate().filter(|(_, p)| **p != ABSENT);
            self.heap.rebuild(live.map(|(s, p)| (*p, s as Slot)));
        }
    }

    /// Brings an offered address's turn forward to now (never back).
    fn forgive(&mut self, slot: Slot) {
        if let Some(p) = self.pass.get_mut(slot as usize)
            && *p != ABSENT
            && *p > self.vtime
        {
            *p = self.vtime;
            self.heap.push(self.vtime, slot);
        }
    }

    fn pick(&mut self, c: &impl Candidates) -> Option<Slot> {
        let mut tries = self.live;
        while tries > 0 {
            let (pass, slot) = self.heap.peek()?;
            if self.pass.get(slot as usize) != Some(&pass) {
                self.heap.pop();
                continue;
            }
            tries -= 1;
            let stride = (SCALE / c.weight(slot).max(f64::MIN_POSITIVE)).min(1e15) as u64;
            let next = pass.saturating_add(stride.max(1));
            self.pass[slot as usize] = next;
            self.heap.replace_top(next, slot);
            // An address that cannot take the ticket (at its lease cap, cooling for the site)
            // loses its turn rather than banking it: no burst of picks when it is back.
            if c.eligible(slot) {
                self.vtime = pass;
                return Some(slot);
            }
        }
        None
    }
}

#[derive(Debug, Default)]
pub(crate) struct SmoothWeighted {
    schedules: FxHashMap<u32, Schedule>,
    /// Offered members by slot: the seed of a new site's schedule.
    offered: Vec<bool>,
    picks: u64,
}

impl SmoothWeighted {
    pub(crate) fn join(&mut self, slot: Slot) {
        let i = slot as usize;
        if self.offered.len() <= i {
            self.offered.resize(i + 1, false);
        }
        self.offered[i] = true;
        self.schedules.values_mut().for_each(|s| s.join(slot));
    }

    pub(crate) fn leave(&mut self, slot: Slot) {
        if let Some(o) = self.offered.get_mut(slot as usize) {
            *o = false;
        }
        self.schedules.values_mut().for_each(|s| s.leave(slot));
    }

    /// The address is no longer avoided on `site`: it takes its turn there at once instead of
    /// waiting out the long stride its lowest weight gave it.
    pub(crate) fn forgive(&mut self, slot: Slot, site: u32) {
        if let Some(s) = self.schedules.get_mut(&site) {
            s.forgive(slot);
        }
    }

    /// Picks for a ticket of `site` (`c` weighs addresses for that site).
    pub(crate) fn pick(&mut self, site: u32, c: &impl Candidates) -> Option<Slot> {
        self.picks += 1;
        if !self.schedules.contains_key(&site) {
            if self.schedules.len() >= MAX_SCHEDULES
                && let Some(lru) = self
                    .schedules
                    .iter()
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(k, _)| *k)
            {
                self.schedules.remove(&lru);
            }
            let mut s = Schedule::default();
            for (slot, _) in self.offered.iter().enumerate().filter(|(_, o)| **o) {
                s.join(slot as Slot);
            }
            self.schedules.insert(site, s);
        }
        let s = self.schedules.get_mut(&site)?;
        s.last_used = self.picks;
        s.pick(c)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Table;
    use super::*;

    #[test]
    fn p1_weighted_shares_follow_weights_smoothly() {
        let mut t = Table::uniform(3);
        t.weight = vec![5.0, 1.0, 1.0];
        let mut w = SmoothWeighted::default();
        (0..3).for_each(|s| w.join(s));
        let picks: Vec<_> = (0..700).filter_map(|_| w.pick(0, &t)).collect();
        let count = |s| picks.iter().filter(|p| **p == s).count();
        assert_eq!((count(0), count(1), count(2)), (500, 100, 100));
        // Smooth: within every window of 7 picks each light address appears at least once
        // past the start-up, and the heavy one never runs more than 5 in a row.
        let longest_run = picks
            .chunk_by(|a, b| a == b)
            .map(<[u32]>::len)
            .max()
            .unwrap_or(0);
        assert!(longest_run <= 5, "{longest_run}");
        assert!(
            picks[7..]
                .windows(7)
                .all(|win| win.contains(&1) && win.contains(&2))
        );
    }

    #[test]
    fn p1_weighted_newcomer_gets_no_burst() {
        let t = Table::uniform(3);
        let mut w = SmoothWeighted::default();
        w.join(0);
        w.join(1);
        for _ in 0..1000 {
            w.pick(0, &t);
        }
        w.join(2);
        let picks: Vec<_> = (0..30).filter_map(|_| w.pick(0, &t)).collect();
        let newcomer = picks.iter().filter(|p| **p == 2).count();
        assert!((9..=11).contains(&newcomer), "{newcomer}");
    }

    #[test]
    fn p1_weighted_skips_ineligible_and_leavers() {
        let mut t = Table::uniform(3);
        let mut w = SmoothWeighted::default();
        (0..3).for_each(|s| w.join(s));
        w.leave(1);
        t.eligible[2] = false;
        assert!((0..10).all(|_| w.pick(0, &t) == Some(0)));
        t.eligible[0] = false;
        assert_eq!(w.pick(0, &t), None);
        // Back from ineligible: its turn was not banked, so no run of catch-up picks.
        t.eligible = vec![true; 3];
        let picks: Vec<_> = (0..10).filter_map(|_| w.pick(0, &t)).collect();
        let longest_run = picks.chunk_by(|a, b| a == b).map(<[u32]>::len).max();
        assert_eq!(longest_run, Some(1), "{picks:?}");
    }

    #[test]
    fn p1_weighted_each_site_follows_its_own_weights() {
        let (mut a, mut b) = (Table::uniform(2), Table::uniform(2));
        a.weight = vec![9.0, 1.0];
        b.weight = vec![1.0, 9.0];
        let mut w = SmoothWeighted::default();
        (0..2).for_each(|s| w.join(s));
        let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            on_a.extend(w.pick(1, &a));
            on_b.extend(w.pick(2, &b));
        }
        assert_eq!(on_a.iter().filter(|s| **s == 0).count(), 90);
        assert_eq!(on_b.iter().filter(|s| **s == 1).count(), 90);
    }

    #[test]
    fn p1_heap_pops_in_order() {
        let mut h = Heap::default();
        let passes = [50u64, 7, 7, 93, 0, 12, 12, 64, 3, 88, 41, 41, 5];
        for (i, p) in passes.iter().enumerate() {
            h.push(*p, i as Slot);
        }
        let mut out = Vec::new();
        while let Some(top) = h.peek() {
            out.push(top);
            h.pop();
        }
        let mut expected: Vec<_> = passes
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, i as Slot))
            .collect();
        expected.sort_unstable_by_key(|(p, s)| (*p, s.wrapping_mul(SCRAMBLE)));
        assert_eq!(out, expected);
        assert_eq!(SCRAMBLE.wrapping_mul(UNSCRAMBLE), 1);
    }

    #[test]
    fn p1_weighted_schedules_are_bounded_and_stale_entries_compacted() {
        let t = Table::uniform(200);
        let mut w = SmoothWeighted::default();
        (0..200).for_each(|s| w.join(s));
        for site in 0..(MAX_SCHEDULES as u32 + 10) {
            assert!(w.pick(site, &t).is_some());
        }
        assert_eq!(w.schedules.len(), MAX_SCHEDULES);
        for _ in 0..5 {
            (0..200).for_each(|s| w.leave(s));
            (0..200).for_each(|s| w.join(s));
        }
        assert!(
            w.schedules
                .values()
                .all(|s| s.heap.len() <= 2 * s.live + 64)
        );
    }
}
