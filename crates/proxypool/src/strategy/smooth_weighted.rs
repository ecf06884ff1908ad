//! Smooth weighted selection by stride scheduling, one schedule per target site.
//!
//! Each address in a schedule carries a virtual "pass"; the lowest pass is picked and advances
//! by its step, the whole-number inverse of its weight (`health::weight::step`). Over any
//! stretch an address's share is proportional to its weight and it is never picked twice in a
//! row while another address is due (smooth, like nginx's SWRR), but a pick costs one sift of
//! a 4-ary heap, O(log n), instead of SWRR's O(n) scan. Weights are read at pick time, so they
//! may change between picks at no cost.
//!
//! A schedule holds the addresses offered and below their lease cap (the caller says when one
//! joins or leaves); one joins at the lowest pass, so it gets no burst of catch-up picks. One
//! that cannot take the ticket at hand (cooling for its site) is passed over and brought up to
//! the pick's pass: it does not bank the turns it missed. Equal passes go in the order of
//! [`tie`]. The Redis library's `keyless` follows the same rules over its `pass` sorted set,
//! so both stores pick alike.
//!
//! Weights depend on the ticket's site (an address bad on one site is avoided there only), so
//! each site has its own schedule: with one shared schedule an address's turns would be spread
//! over the sites in proportion to their traffic, whatever its weight on each.

use rustc_hash::FxHashMap;

use super::{Candidates, Slot};

/// The pass of an address that is not in the schedule.
const ABSENT: u64 = u64::MAX;
/// Schedules kept per sub-pool. Past this the least recently used one is dropped (and rebuilt,
/// its history forgotten, when its site comes back), so memory stays bounded however many
/// sites callers name.
const MAX_SCHEDULES: usize = 64;

/// Ties (a batch of addresses joining at once) go in a scrambled but fixed order, an
/// invertible multiplication of the address's number (its slot + 1: the Redis store's id): a
/// list sorted by provider or subnet would otherwise put its first block in front of all the
/// early traffic.
const SCRAMBLE: u32 = 0x9E37_79B1;
const UNSCRAMBLE: u32 = inverse(SCRAMBLE);

/// The tie-break rank of `slot` among equal passes, lowest first. The library writes it as
/// the 8 hex digits its `pass` members begin with (`member` in `library.lua`), so the sorted
/// set orders equal passes alike.
pub(crate) fn tie(slot: Slot) -> u32 {
    slot.wrapping_add(1).wrapping_mul(SCRAMBLE)
}

fn untie(rank: u32) -> Slot {
    rank.wrapping_mul(UNSCRAMBLE).wrapping_sub(1)
}

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

/// A 4-ary min-heap of `(pass, slot)`, each packed into one `u64`: the pass relative to a
/// base in the high half, the scrambled slot in the low half, so that a sift compares plain
/// machine words. Passes of live entries lie within one longest stride of each other, far
/// below 2^32; when one would not fit, the base moves up to the minimum (`rebase`, O(n),
/// about once per 2^32 ÷ stride picks of an address). The four children of a node are one
/// aligned block (node `i` lives at lane `(i + 3) % 4` of block `(i + 3) / 4`, so the
/// children of node `i` fill block `i + 1`): a sift reads one block per level and has half the
/// levels of a binary heap. A pick replaces the minimum with its next pass, which usually
/// belongs near the bottom, so the sift goes bottom-up (Floyd): down along the smallest
/// children to a leaf, then up the few steps to the new key's place. This is the whole cost
/// of a weighted pick, so it is kept this lean.
#[derive(Debug, Default)]
struct Heap {
    blocks: Vec<Block>,
    len: usize,
    base: u64,
}

#[derive(Debug, Clone, Copy, Default)]
#[repr(align(32))]
struct Block([u64; 4]);

impl Heap {
    fn len(&self) -> usize {
        self.len
    }

    /// (block, lane) of node `i`.
    fn at(i: usize) -> (usize, usize) {
        let p = i + 3;
        (p >> 2, p & 3)
    }

    fn get(&self, i: usize) -> u64 {
        let (b, l) = Self::at(i);
        self.blocks[b].0[l]
    }

    fn set(&mut self, i: usize, k: u64) {
        let (b, l) = Self::at(i);
        self.blocks[b].0[l] = k;
    }

    fn unkey(&self, k: u64) -> (u64, Slot) {
        (self.base + (k >> 32), untie(k as u32))
    }

    /// The key of `(pass, slot)`, moving the base up first if `pass` would not fit.
    fn key(&mut self, pass: u64, slot: Slot) -> u64 {
        if pass.saturating_sub(self.base) > u64::from(u32::MAX) {
            let top = self.peek().map_or(pass, |(p, _)| p);
            self.rebase(top.min(pass));
        }
        // Live passes lie within one step (at most 10 000) of the minimum, so this fits after
        // a rebase.
        let relative = pass.saturating_sub(self.base).min(u64::from(u32::MAX));
        (relative << 32) | u64::from(tie(slot))
    }

    fn rebase(&mut self, to: u64) {
        let shift = to.saturating_sub(self.base) << 32;
        let len = self.len;
        for i in 0..len {
            let k = self.get(i);
            // Order is kept: every key moves down by the same amount (stale ones may clip).
            self.set(
                i,
                if k >= shift {
                    k - shift
                } else {
                    k & u64::from(u32::MAX)
                },
            );
        }
        self.base = self.base.max(to);
    }

    fn peek(&self) -> Option<(u64, Slot)> {
        (self.len > 0).then(|| self.unkey(self.get(0)))
    }

    fn push(&mut self, pass: u64, slot: Slot) {
        let k = self.key(pass, slot);
        let i = self.len;
        if Self::at(i).0 >= self.blocks.len() {
            self.blocks.push(Block::default());
        }
        self.len += 1;
        self.sift_up(i, k);
    }

    /// Moves `k` up from the hole at `i` to its place.
    fn sift_up(&mut self, mut i: usize, k: u64) {
        while i > 0 {
            let parent = (i - 1) / 4;
            let p = self.get(parent);
            if p <= k {
                break;
            }
            self.set(i, p);
            i = parent;
        }
        self.set(i, k);
    }

    /// Replaces the minimum and restores the order.
    fn replace_top(&mut self, pass: u64, slot: Slot) {
        let k = self.key(pass, slot);
        self.sift_from_top(k);
    }

    fn sift_from_top(&mut self, k: u64) {
        let n = self.len;
        // The hole as (block, lane): node 0 is lane 3 of block 0, and a child moved up leaves
        // its hole at lane `best` of block `i + 1`, so no index is recomputed per level.
        let (mut i, mut hole) = (0, (0, 3));
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            // The children are the lanes of block i + 1; past the end they are not nodes.
            let Some(Block(lanes)) = self.blocks.get(i + 1) else {
                break;
            };
            let best = if n - first >= 4 {
                // A full block: a tournament, three comparisons.
                let low = usize::from(lanes[1] < lanes[0]);
                let high = 2 + usize::from(lanes[3] < lanes[2]);
                if lanes[high] < lanes[low] { high } else { low }
            } else {
                (1..n - first).fold(0, |best, lane| {
                    if lanes[lane] < lanes[best] {
                        lane
                    } else {
                        best
                    }
                })
            };
            let child = lanes[best];
            if let Some(b) = self.blocks.get_mut(hole.0) {
                b.0[hole.1] = child;
            }
            hole = (i + 1, best);
            i = first + best;
        }
        self.sift_up(i, k);
    }

    fn pop(&mut self) {
        if self.len == 0 {
            return;
        }
        self.len -= 1;
        if self.len > 0 {
            let last = self.get(self.len);
            self.sift_from_top(last);
        }
    }

    fn rebuild(&mut self, entries: impl Iterator<Item = (u64, Slot)>) {
        self.blocks.clear();
        self.len = 0;
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
    /// Passed over by the pick under way (reused, so picks do not allocate).
    passed: Vec<(u64, Slot)>,
    last_used: u64,
}

impl Schedule {
    /// The lowest live pass (stale entries on top are dropped), where an address (re)joins.
    fn head(&mut self) -> Option<(u64, Slot)> {
        while let Some((pass, slot)) = self.heap.peek() {
            if self.pass.get(slot as usize) == Some(&pass) {
                return Some((pass, slot));
            }
            self.heap.pop();
        }
        None
    }

    /// Where an address joins: at the lowest pass (the heap's base when there is none).
    fn now(&mut self) -> u64 {
        self.head().map_or(self.heap.base, |(pass, _)| pass)
    }

    fn join(&mut self, slot: Slot) {
        let i = slot as usize;
        if self.pass.len() <= i {
            self.pass.resize(i + 1, ABSENT);
        }
        if self.pass[i] == ABSENT {
            let now = self.now();
            self.pass[i] = now;
            self.heap.push(now, slot);
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

    /// Brings an address's turn forward to now (never back).
    fn forgive(&mut self, slot: Slot) {
        let now = self.now();
        if let Some(p) = self.pass.get_mut(slot as usize)
            && *p != ABSENT
            && *p > now
        {
            *p = now;
            self.heap.push(now, slot);
        }
    }

    fn pick(&mut self, c: &impl Candidates) -> Option<Slot> {
        let mut picked = None;
        while let Some((pass, slot)) = self.head() {
            if !c.eligible(slot) {
                // Passed over for this ticket only: out of the heap until the pick is made.
                self.passed.push((pass, slot));
                self.heap.pop();
                continue;
            }
            let next = pass + u64::from(c.step(slot));
            self.pass[slot as usize] = next;
            self.heap.replace_top(next, slot);
            picked = Some((pass, slot));
            // The new top is most likely the next pick: what picking it reads loads while
            // this pair goes on.
            if let Some((_, upcoming)) = self.heap.peek() {
                if let Some(p) = self.pass.get(upcoming as usize) {
                    crate::hint::prefetch(p);
                }
                c.upcoming(upcoming);
            }
            break;
        }
        // Those passed over come back at the pick's pass (or their own, with none).
        while let Some((own, slot)) = self.passed.pop() {
            let at = picked.map_or(own, |(pass, _)| pass);
            self.pass[slot as usize] = at;
            self.heap.push(at, slot);
        }
        picked.map(|(_, slot)| slot)
    }
}

#[derive(Debug, Default)]
pub(crate) struct SmoothWeighted {
    schedules: FxHashMap<u32, Schedule>,
    /// Members in the schedules by slot: the seed of a new site's schedule.
    present: Vec<bool>,
    picks: u64,
}

impl SmoothWeighted {
    /// The address is offered and below its lease cap: it takes turns.
    pub(crate) fn join(&mut self, slot: Slot) {
        let i = slot as usize;
        if self.present.len() <= i {
            self.present.resize(i + 1, false);
        }
        self.present[i] = true;
        self.schedules.values_mut().for_each(|s| s.join(slot));
    }

    /// The address stopped being offered, reached its lease cap or left the pool.
    pub(crate) fn leave(&mut self, slot: Slot) {
        if let Some(o) = self.present.get_mut(slot as usize) {
            *o = false;
        }
        self.schedules.values_mut().for_each(|s| s.leave(slot));
    }

    /// The address is no longer avoided on `site`: it takes its turn there at once instead of
    /// waiting out the long step its lowest weight gave it.
    pub(crate) fn forgive(&mut self, slot: Slot, site: u32) {
        if let Some(s) = self.schedules.get_mut(&site) {
            s.forgive(slot);
        }
    }

    /// Picks for a ticket of `site` (`c` weighs addresses for that site).
    pub(crate) fn pick(&mut self, site: u32, c: &impl Candidates) -> Option<Slot> {
        self.picks += 1;
        // One lookup when the site has its schedule (the common case).
        if let Some(s) = self.schedules.get_mut(&site) {
            s.last_used = self.picks;
            return s.pick(c);
        }
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
        for (slot, _) in self.present.iter().enumerate().filter(|(_, o)| **o) {
            s.join(slot as Slot);
        }
        s.last_used = self.picks;
        let s = self.schedules.entry(site).or_insert(s);
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
        expected.sort_unstable_by_key(|(p, s)| (*p, tie(*s)));
        assert_eq!(out, expected);
        assert_eq!(SCRAMBLE.wrapping_mul(UNSCRAMBLE), 1);
    }

    #[test]
    fn p1_heap_moves_its_base_when_passes_outgrow_32_bits() {
        let mut h = Heap::default();
        h.push(4_000_000_000, 1);
        h.push(4_100_000_000, 2);
        // The next pass of slot 1 is beyond 2^32 from the base (0): the base moves up to the
        // minimum and the order is kept.
        let next = 4_000_000_000 + (1 << 31);
        h.replace_top(next, 1);
        assert_eq!(h.base, 4_000_000_000);
        h.push(4_200_000_000, 3);
        let mut out = Vec::new();
        while let Some(top) = h.peek() {
            out.push(top);
            h.pop();
        }
        assert_eq!(out, [(4_100_000_000, 2), (4_200_000_000, 3), (next, 1)]);
    }

    #[test]
    fn p1_weighted_shares_hold_over_long_runs() {
        let mut t = Table::uniform(2);
        t.weight = vec![100.0, 0.01];
        let mut w = SmoothWeighted::default();
        (0..2).for_each(|s| w.join(s));
        // 600 000 picks: steps of 1 and 10 000.
        let light = (0..600_000).filter(|_| w.pick(0, &t) == Some(1)).count();
        assert!((55..=65).contains(&light), "{light}");
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
