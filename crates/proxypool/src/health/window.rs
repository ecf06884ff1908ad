//! A sliding window of outcomes: the last `capacity` of them that are also younger than
//! `max_age` (P4, P16). Running sums make rates, weights and latency quantiles O(1), so the
//! acquire and release paths never scan a window.

use std::time::Duration;

use crate::clock::{Timestamp, millis};

/// What an outcome says about health. Rate limits are not health and never enter a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Success,
    /// Connection error, timeout or block.
    Failure,
    Captcha,
}

/// One outcome, in 16 bytes: a window of 50 is 800 bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) at: Timestamp,
    pub(crate) site: u32,
    /// Capped at 65 535 ms: longer successes weigh as that.
    pub(crate) latency_ms: u16,
    pub(crate) class: Class,
    /// Recorded while its site was judged degraded, or in the stretch that convicted it: says
    /// nothing about the address and never counts against it (P9).
    pub(crate) excused: bool,
}

/// Sums over a set of entries. A window holds at most 65 535 entries (validated) of at most
/// 65 535 ms each, so 16- and 32-bit counters suffice; packed to 10 bytes, so that the
/// window's header and both its tallies fit in 56 bytes (see `AddressRecord`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, packed(2))]
pub(crate) struct Tally {
    pub(crate) latency_sum_ms: u32,
    pub(crate) n: u16,
    pub(crate) successes: u16,
    pub(crate) captchas: u16,
}

impl Tally {
    fn add(&mut self, e: &Entry) {
        self.n += 1;
        match e.class {
            Class::Success => {
                self.successes += 1;
                self.latency_sum_ms += u32::from(e.latency_ms);
            }
            Class::Captcha => self.captchas += 1,
            Class::Failure => {}
        }
    }

    fn sub(&mut self, e: &Entry) {
        self.n -= 1;
        match e.class {
            Class::Success => {
                self.successes -= 1;
                self.latency_sum_ms -= u32::from(e.latency_ms);
            }
            Class::Captcha => self.captchas -= 1,
            Class::Failure => {}
        }
    }

    pub(crate) fn rate(&self, x: u16) -> Option<f64> {
        (self.n > 0).then(|| f64::from(x) / f64::from(self.n))
    }

    /// Mean latency of the successes.
    pub(crate) fn mean_latency_ms(&self) -> Option<f64> {
        (self.successes > 0).then(|| f64::from(self.latency_sum_ms) / f64::from(self.successes))
    }
}

/// A fixed-capacity ring of entries, oldest first, allocated on the first push (most
/// address × site pairs see few outcomes). Once full, the slot of the entry leaving is the one
/// the next entry takes: one cache line per push. Positions fit 16 bits (capacity ≤ 65 535).
#[derive(Debug, Clone, Default)]
struct Ring {
    buf: Box<[Entry]>,
    head: u16,
    len: u16,
    capacity: u16,
}

impl Ring {
    fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Buffer index of the `i`-th oldest entry (`i` < capacity).
    fn index(&self, i: usize) -> usize {
        let at = self.head as usize + i;
        if at >= self.buf.len() {
            at - self.buf.len()
        } else {
            at
        }
    }

    fn get(&self, i: usize) -> Option<&Entry> {
        (i < self.len()).then(|| &self.buf[self.index(i)])
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Entry> {
        let at = self.index(i);
        (i < self.len()).then(|| &mut self.buf[at])
    }

    fn front(&self) -> Option<&Entry> {
        self.get(0)
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let e = *self.front()?;
        // Below the capacity, so within 16 bits.
        self.head = self.index(1) as u16;
        self.len -= 1;
        Some(e)
    }

    /// Puts `e` in the oldest entry's place (the ring is full) and returns that entry: `e`
    /// is now the newest.
    fn replace_front(&mut self, e: Entry) -> Entry {
        let at = usize::from(self.head);
        let old = std::mem::replace(&mut self.buf[at], e);
        // Below the capacity, so within 16 bits.
        self.head = self.index(1) as u16;
        old
    }

    /// Appends `e`; the caller keeps the ring below its capacity.
    fn push_back(&mut self, e: Entry) {
        if self.buf.is_empty() {
            self.buf = vec![e; usize::from(self.capacity)].into_boxed_slice();
        }
        let at = self.index(self.len());
        self.buf[at] = e;
        self.len += 1;
    }

    /// Oldest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Entry> {
        (0..self.len()).map(|i| &self.buf[self.index(i)])
    }
}

/// C order, 56 bytes: the header and the two sums that every push and read touches, on one
/// cache line with room for one more word of its owner's (see `AddressRecord`). Latency
/// quantiles are counted from the entries when asked (rarely), not kept up at every push.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Window {
    /// When the oldest entry ages out (ms): before it, reads need not look at the entries.
    horizon_ms: u64,
    entries: Ring,
    /// At most u32::MAX ms (about 49 days, validated).
    max_age_ms: u32,
    /// Entries not excused: what health is judged on.
    counted: Tally,
    /// Every entry: what weights and the snapshot read.
    all: Tally,
}

impl Window {
    pub(crate) fn new(capacity: usize, max_age: Duration) -> Self {
        Self {
            horizon_ms: u64::MAX,
            entries: Ring {
                capacity: u16::try_from(capacity).unwrap_or(u16::MAX),
                ..Ring::default()
            },
            max_age_ms: u32::try_from(millis(max_age)).unwrap_or(u32::MAX),
            counted: Tally::default(),
            all: Tally::default(),
        }
    }

    fn expired(&self, e: &Entry, now: Timestamp) -> bool {
        now.as_millis().saturating_sub(e.at.as_millis()) >= u64::from(self.max_age_ms)
    }

    pub(crate) fn push(&mut self, e: Entry) {
        self.expire(e.at);
        if self.entries.len() >= usize::from(self.entries.capacity) {
            // Full: the oldest entry leaves and `e` takes its place; the next one is oldest.
            let old = self.entries.replace_front(e);
            self.forget(&old);
            self.set_horizon();
        } else {
            // Below the capacity the oldest stays (`e` is it in an empty window), so the
            // horizon is known without reading it: a load of another line than the one
            // written, from a ring reached at random.
            if self.entries.len() == 0 {
                self.horizon_ms = self.horizon_of(&e);
            }
            self.entries.push_back(e);
        }
        self.remember(&e);
        self.debug_check_horizon();
    }

    /// A word from the header (see `AddressRecord::prefetch`); the entries the next push
    /// touches are hinted, not read: a grant has no use for them, its release comes later.
    pub(crate) fn prefetch(&self) -> u64 {
        self.hint_next_push();
        self.horizon_ms
    }

    /// Starts loading the entries the next push touches (once the ring is allocated): the
    /// slot it writes and, in a full ring, the entry it leaves oldest, whose age sets the
    /// horizon (one push in four on the next cache line).
    pub(crate) fn hint_next_push(&self) {
        let ring = &self.entries;
        let full = ring.len() == ring.buf.len();
        let next = if full {
            usize::from(ring.head)
        } else {
            ring.index(ring.len())
        };
        if let Some(e) = ring.buf.get(next) {
            crate::hint::prefetch(e);
        }
        if full && let Some(e) = ring.get(1) {
            crate::hint::prefetch(e);
        }
    }

    /// When the oldest entry ages out, if there is one.
    pub(crate) fn horizon(&self) -> Option<Timestamp> {
        (self.horizon_ms != u64::MAX).then_some(Timestamp::from_millis(self.horizon_ms))
    }

    /// When the oldest entry still young at `now` ages out, if there is one (reads, as of
    /// `now`, what [`Window::horizon`] is after [`Window::expire`]).
    #[cfg(feature = "redis")]
    pub(crate) fn horizon_at(&self, now: Timestamp) -> Option<Timestamp> {
        self.entries
            .iter()
            .find(|e| !self.expired(e, now))
            .map(|e| Timestamp::from_millis(self.horizon_of(e)))
    }

    /// The horizon is when the oldest entry ages out (checked in debug builds, so that the
    /// property suites hold every window to it).
    fn debug_check_horizon(&self) {
        debug_assert_eq!(
            self.horizon_ms,
            self.entries
                .front()
                .map_or(u64::MAX, |e| self.horizon_of(e))
        );
    }

    fn set_horizon(&mut self) {
        self.horizon_ms = self
            .entries
            .front()
            .map_or(u64::MAX, |e| self.horizon_of(e));
    }

    /// When `e` ages out (ms).
    fn horizon_of(&self, e: &Entry) -> u64 {
        e.at.as_millis().saturating_add(u64::from(self.max_age_ms))
    }

    /// Drops the outcomes older than the maximum age.
    #[inline]
    pub(crate) fn expire(&mut self, now: Timestamp) {
        if now.as_millis() >= self.horizon_ms {
            self.expire_aged(now);
        }
    }

    /// [`Window::expire`] once some entry has aged out: out of line, so the common case
    /// inlines to one comparison.
    #[inline(never)]
    fn expire_aged(&mut self, now: Timestamp) {
        while let Some(front) = self.entries.front().copied() {
            if !self.expired(&front, now) {
                break;
            }
            self.entries.pop_front();
            self.forget(&front);
        }
        self.set_horizon();
        self.debug_check_horizon();
    }

    fn remember(&mut self, e: &Entry) {
        self.all.add(e);
        if !e.excused {
            self.counted.add(e);
        }
    }

    fn forget(&mut self, e: &Entry) {
        self.all.sub(e);
        if !e.excused {
            self.counted.sub(e);
        }
    }

    /// The sums over (all, counted) entries as of `now`: outcomes that aged out since the
    /// window last changed are left out without mutating it (usually none, so O(1)).
    #[inline]
    pub(crate) fn tallies(&self, now: Timestamp) -> (Tally, Tally) {
        if now.as_millis() < self.horizon_ms {
            return (self.all, self.counted);
        }
        self.tallies_aged(now)
    }

    /// [`Window::tallies`] once some entry may have aged out: kept out of line, so the
    /// common case inlines to a comparison and two copies.
    #[inline(never)]
    fn tallies_aged(&self, now: Timestamp) -> (Tally, Tally) {
        let (mut all, mut counted) = (self.all, self.counted);
        for e in self.entries.iter().take_while(|e| self.expired(e, now)) {
            all.sub(e);
            if !e.excused {
                counted.sub(e);
            }
        }
        (all, counted)
    }

    /// The counted sums as of `now` (see [`Window::tallies`]).
    pub(crate) fn counted(&self, now: Timestamp) -> Tally {
        self.tallies(now).1
    }

    /// The sums over the young entries of one site (a scan: for snapshots).
    pub(crate) fn site_tally(&self, site: u32, now: Timestamp) -> Tally {
        let mut t = Tally::default();
        for e in self.newest_first(now).filter(|e| e.site == site) {
            t.add(e);
        }
        t
    }

    /// Entries still young at `now`, newest first.
    pub(crate) fn newest_first(&self, now: Timestamp) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .rev()
            .take_while(move |e| !self.expired(e, now))
    }

    /// Excuses the entries of `site` recorded at or after `from` (P9: the stretch that convicted
    /// the site). Returns whether any changed.
    pub(crate) fn excuse(&mut self, site: u32, from: Timestamp) -> bool {
        let mut changed = false;
        for i in (0..self.entries.len()).rev() {
            let Some(e) = self.entries.get(i).copied() else {
                break;
            };
            if e.at < from {
                break;
            }
            if e.site == site && !e.excused {
                self.counted.sub(&e);
                if let Some(slot) = self.entries.get_mut(i) {
                    slot.excused = true;
                }
                changed = true;
            }
        }
        changed
    }

    /// (median, p95) of the counted successes' latencies from their histogram, to within half
    /// a bucket, if there are at least `min` of them. Call after [`Window::expire`]. The
    /// histogram is counted from the entries now: the tail is read after a success that may
    /// have grown it and while degraded, far less often than outcomes are pushed.
    pub(crate) fn tail_quantiles(&self, min: usize) -> Option<(u32, u32)> {
        // The counted successes are the histogram's entries.
        if usize::from(self.counted.successes) < min.max(1) {
            return None;
        }
        let mut h = Histogram::default();
        for e in self.entries.iter() {
            if !e.excused && e.class == Class::Success {
                h.add(e.latency_ms);
            }
        }
        Some(h.median_and_p95())
    }

    /// Exact (median, p95) of the counted successes' latencies, by sorting them (snapshots).
    pub(crate) fn exact_quantiles(&self, now: Timestamp) -> Option<(u32, u32)> {
        let mut ms: Vec<u32> = self
            .newest_first(now)
            .filter(|e| !e.excused && e.class == Class::Success)
            .map(|e| u32::from(e.latency_ms))
            .collect();
        ms.sort_unstable();
        let last = ms.len().checked_sub(1)?;
        let at = |percent: usize| ms.get(rank(last, percent)).copied();
        Some((at(50)?, at(95)?))
    }
}

/// The 0-based nearest rank of `percent` among `last + 1` values, rounded half up.
fn rank(last: usize, percent: usize) -> usize {
    (last * percent + 50) / 100
}

/// Buckets of the latency histogram: four per doubling from 1 ms, the last one open (past
/// about 65 s).
const BUCKETS: usize = 64;

/// Counts of latencies by bucket: quantiles for the latency-tail signal from a fixed block of
/// counters — no sorting, no allocation. A bucket spans a quarter of a doubling, so a
/// quantile is known to about ±10 %, plenty for "p95 above 3 × the median".
#[derive(Debug, Clone)]
struct Histogram {
    counts: [u16; BUCKETS],
    n: u32,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            n: 0,
        }
    }
}

impl Histogram {
    /// ⌊4 × log2(ms + 1)⌋, in integers.
    fn bucket(ms: u32) -> usize {
        let x = ms.saturating_add(1);
        let octave = x.ilog2();
        // The two bits below the leading one: which quarter of the doubling.
        let quarter = if octave >= 2 {
            (x >> (octave - 2)) & 3
        } else {
            (x << (2 - octave)) & 3
        };
        ((octave * 4 + quarter) as usize).min(BUCKETS - 1)
    }

    /// The middle of a bucket, in ms.
    fn value(bucket: usize) -> u32 {
        let (octave, quarter) = ((bucket / 4) as u32, (bucket % 4) as u32);
        // Bounds of x = ms + 1 in the bucket: (4 + q) · 2^o / 4 up to (5 + q) · 2^o / 4.
        let low = ((4 + quarter) << octave) / 4;
        let high = ((5 + quarter) << octave) / 4;
        ((low + high) / 2).saturating_sub(1)
    }

    fn add(&mut self, ms: u16) {
        let c = &mut self.counts[Self::bucket(u32::from(ms))];
        *c = c.saturating_add(1);
        self.n += 1;
    }

    /// Both quantiles in one walk over the counts.
    fn median_and_p95(&self) -> (u32, u32) {
        let last = (self.n as usize).saturating_sub(1);
        let (at_median, at_p95) = (rank(last, 50), rank(last, 95));
        let (mut seen, mut median) = (0, None);
        for (b, c) in self.counts.iter().enumerate() {
            seen += usize::from(*c);
            if median.is_none() && seen > at_median {
                median = Some(Self::value(b));
            }
            if seen > at_p95 {
                return (median.unwrap_or_else(|| Self::value(b)), Self::value(b));
            }
        }
        let top = Self::value(BUCKETS - 1);
        (median.unwrap_or(top), top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGE: Duration = Duration::from_secs(600);

    fn e(at_s: u64, class: Class, latency_ms: u16) -> Entry {
        Entry {
            at: Timestamp::from_millis(at_s * 1000),
            class,
            site: 0,
            latency_ms,
            excused: false,
        }
    }

    #[test]
    fn sums_follow_the_window() {
        let mut w = Window::new(3, AGE);
        w.push(e(0, Class::Success, 100));
        w.push(e(0, Class::Captcha, 0));
        w.push(e(0, Class::Success, 300));
        let t = w.counted(Timestamp::default());
        assert_eq!((t.n, t.successes, t.captchas), (3, 2, 1));
        assert_eq!(t.mean_latency_ms(), Some(200.0));
        w.push(e(0, Class::Failure, 0));
        w.push(e(0, Class::Failure, 0));
        let t = w.counted(Timestamp::default());
        assert_eq!((t.n, t.successes, t.captchas), (3, 1, 0));
        assert_eq!(t.mean_latency_ms(), Some(300.0));
        assert_eq!(w.exact_quantiles(Timestamp::default()), Some((300, 300)));
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order_as_it_wraps() {
        let mut w = Window::new(3, AGE);
        for ms in 1..=7 {
            w.push(e(0, Class::Success, ms));
        }
        let newest: Vec<u16> = w
            .newest_first(Timestamp::default())
            .map(|e| e.latency_ms)
            .collect();
        assert_eq!(newest, [7, 6, 5]);
        assert_eq!({ w.counted(Timestamp::default()).latency_sum_ms }, 18);
    }

    #[test]
    fn quantiles_need_enough_samples_and_the_histogram_is_close() {
        let mut w = Window::new(50, AGE);
        for ms in (1..=20).rev() {
            w.push(e(0, Class::Success, ms * 10));
        }
        assert_eq!(w.tail_quantiles(21), None);
        assert_eq!(w.exact_quantiles(Timestamp::default()), Some((110, 190)));
        let (median, p95) = w.tail_quantiles(10).unwrap();
        assert!((99..=121).contains(&median), "{median}");
        assert!((171..=209).contains(&p95), "{p95}");
    }

    #[test]
    fn histogram_buckets_are_quarter_doublings() {
        for ms in [0, 1, 7, 99, 100, 150, 2_000, 65_000, u32::MAX] {
            let v = Histogram::value(Histogram::bucket(ms));
            let (x, v) = (f64::from(ms) + 1.0, f64::from(v) + 1.0);
            assert!(ms > 70_000 || (v / x - 1.0).abs() < 0.2, "{ms} -> {v}");
        }
        assert!(Histogram::bucket(100) < Histogram::bucket(130));
    }

    #[test]
    fn p4_window_outcomes_age_out_after_the_maximum_age() {
        let mut w = Window::new(50, AGE);
        w.push(e(0, Class::Failure, 0));
        w.push(e(300, Class::Success, 100));
        // Read without mutation: the failure is 600 s old at 600 s and no longer counts.
        let at = |s: u64| Timestamp::from_millis(s * 1000);
        assert_eq!(w.counted(at(599)).n, 2);
        assert_eq!(w.counted(at(600)).n, 1);
        assert_eq!(w.newest_first(at(600)).count(), 1);
        assert_eq!(w.counted(at(900)).n, 0);
        w.expire(at(900));
        assert_eq!(w.tail_quantiles(1), None);
        assert_eq!(w.tallies(at(900)), (Tally::default(), Tally::default()));
    }

    #[test]
    fn the_horizon_is_when_the_oldest_entry_ages_out() {
        let mut w = Window::new(3, AGE);
        let at = |s: u64| Some(Timestamp::from_millis(s * 1000));
        assert_eq!(w.horizon(), None);
        // Below the capacity the first entry stays the oldest.
        for s in [10, 20, 30] {
            w.push(e(s, Class::Success, 100));
            assert_eq!(w.horizon(), at(10 + 600));
        }
        // Full: each push makes the next one the oldest.
        w.push(e(40, Class::Success, 100));
        assert_eq!(w.horizon(), at(20 + 600));
        w.push(e(50, Class::Failure, 0));
        assert_eq!(w.horizon(), at(30 + 600));
        // A push whose own expiry leaves the ring below the capacity, not empty.
        w.push(e(635, Class::Success, 100));
        assert_eq!(w.horizon(), at(40 + 600));
        // Aged out entirely, then a new first entry.
        w.expire(Timestamp::from_millis(1_300_000));
        assert_eq!(w.horizon(), None);
        w.push(e(1400, Class::Success, 100));
        assert_eq!(w.horizon(), at(1400 + 600));
    }

    #[test]
    fn p9_excused_entries_are_shown_but_not_counted() {
        let mut w = Window::new(50, AGE);
        w.push(e(1, Class::Failure, 0));
        w.push(Entry {
            site: 1,
            ..e(2, Class::Failure, 0)
        });
        w.push(Entry {
            site: 1,
            ..e(3, Class::Success, 100)
        });
        assert!(w.excuse(1, Timestamp::from_millis(2000)));
        let (all, counted) = w.tallies(Timestamp::from_millis(3000));
        assert_eq!((all.n, counted.n), (3, 1));
        assert_eq!(w.tail_quantiles(1), None);
        assert!(!w.excuse(1, Timestamp::from_millis(2000)));
    }
}
