//! The room of unknown codes: a table of fixed size that a lookup reads without a lock, an
//! allocation or a pointer to follow.
//!
//! An unknown-code flood makes every request a negative lookup. In quick_cache one costs three
//! dependent loads (control bytes, slot index, slab entry, the key behind its pointer on top)
//! and a shared lock's atomic add; here it is one bucket of two cache lines (a second bucket
//! only when the first lacks the code), checked by a sequence number (a seqlock: writers make
//! it odd while they change the bucket, readers retry nothing and take a changing bucket for a
//! miss). Each code has two buckets to choose from: with one, a table sized for its codes
//! overflowed some buckets while others stayed empty (641 of 100 000 codes never fitted). A
//! code takes its second only once its first is nearly full, so that nearly every lookup
//! reads one bucket: the table is larger than a core's cache, and each bucket read is a
//! memory access (BENCHMARKS.md, issue 18).
//! Codes of up to [`PACKED_MAX`] characters — every generated one — are packed into the
//! 64-bit word they are compared by; longer aliases go to a small quick_cache room of their
//! own ([`super::LinkCache`]).
//!
//! Buckets are allocated a segment at a time, on the first code stored in it: a process that
//! never sees an unknown code holds none of it. An entry only says when it was read and until
//! when it may serve; whether a write since has made it stale is the cache's generation check,
//! so a write needs nothing from this table to be correct (it still frees the entry).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

/// Codes longer than this do not fit a 64-bit word at 6 bits a character.
pub(super) const PACKED_MAX: usize = 10;
/// Entries per bucket: more ways, fewer evictions of codes still in use by colliding ones.
const WAYS: usize = 7;
/// Buckets allocated together when the first of them gets an entry (32 KiB).
const SEGMENT: usize = 256;
/// Live ways in a code's first bucket from which it may go to its second, if that is emptier.
/// At the 44 % load of 100 000 codes in the default table, 5 % of codes then live in their
/// second bucket (with the emptier bucket always: 30 %, each a second memory access per
/// lookup); at 80 % load 0.3 % of codes find both buckets full (with the first while it has a
/// free way: 2 %, each a store read).
const SPILL_AT: u64 = 5;

/// 1..=63 per byte of the code alphabet (digits, ASCII letters, `-`), 0 for any other byte.
static SYMBOLS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    let mut next = 1;
    while b < 256 {
        let byte = b as u8;
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            table[b] = next;
            next += 1;
        }
        b += 1;
    }
    table
};

/// `code` as one number, if it has at most [`PACKED_MAX`] characters of the code alphabet:
/// 6 bits each, never 0 (which ends the code), so distinct codes give distinct numbers and
/// no code gives 0 (a free way).
pub(super) fn packed(code: &str) -> Option<u64> {
    if code.is_empty() || code.len() > PACKED_MAX {
        return None;
    }
    let mut n = 0u64;
    for (i, byte) in code.bytes().enumerate() {
        let symbol = SYMBOLS[usize::from(byte)];
        if symbol == 0 {
            return None;
        }
        n |= u64::from(symbol) << (6 * i);
    }
    Some(n)
}

/// What an entry holds besides its code, in one word so that a reader sees both halves of
/// the same write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// The code's write generation when the store said it was unknown.
    pub(super) generation: u32,
    /// Served while now is before this (Unix seconds, saturated to 32 bits: until 2106).
    pub(super) fresh_until: u32,
}

impl Entry {
    fn word(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.fresh_until)
    }

    fn of(word: u64) -> Self {
        Self {
            generation: (word >> 32) as u32,
            fresh_until: word as u32,
        }
    }
}

#[derive(Debug, Default)]
struct Way {
    /// A packed code; 0: a free way.
    code: AtomicU64,
    /// Its [`Entry::word`].
    entry: AtomicU64,
}

#[derive(Debug, Default)]
#[repr(C, align(128))]
struct Bucket {
    /// Even while nobody writes; a writer makes it odd, changes the ways, makes it even again.
    seq: AtomicU64,
    /// Each code beside its entry, taken from the first free way on: a code in one of the
    /// first three ways (three in four at the default table's load) is found on the bucket's
    /// first cache line alone.
    ways: [Way; WAYS],
}

// The first line holds the sequence number, read by every lookup, and three whole ways (see
// `ways`); `repr(C)`, or the compiler may move `seq` to the second line.
const _: () = assert!(
    std::mem::offset_of!(Bucket, seq) == 0
        && std::mem::offset_of!(Bucket, ways) + 3 * size_of::<Way>() <= 64
        && align_of::<Bucket>() == 2 * 64
);

impl Bucket {
    /// The entry of `code`, if the bucket holds it and no writer is changing the bucket.
    fn find(&self, code: u64) -> Option<Entry> {
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let word = self
            .ways
            .iter()
            .find(|way| way.code.load(Ordering::Relaxed) == code)
            .map(|way| way.entry.load(Ordering::Relaxed));
        // Orders the loads above before the check below: if any of them saw a writer's
        // store, the check sees that writer's odd sequence number (or a later one).
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        word.map(Entry::of)
    }

    /// The way `code` should take here and how good it is (lower is better): its own way
    /// (0), else a free or expired one, the fewer live ways beside it the better (so codes
    /// spread over both their buckets), else the way expiring first.
    fn victim(&self, code: u64, now: u32) -> (usize, u64) {
        let (mut open, mut live) = (None, 0u64);
        let mut soonest = (0, u64::MAX);
        for (way, slot) in self.ways.iter().enumerate() {
            let held = slot.code.load(Ordering::Relaxed);
            if held == code {
                return (way, 0);
            }
            let until = Entry::of(slot.entry.load(Ordering::Relaxed)).fresh_until;
            if held == 0 || until <= now {
                open.get_or_insert(way);
            } else {
                live += 1;
                if u64::from(until) < soonest.1 {
                    soonest = (way, u64::from(until));
                }
            }
        }
        match open {
            Some(way) => (way, 1 + live),
            None => (soonest.0, WAYS as u64 + 1 + soonest.1),
        }
    }

    /// Runs `change` with the bucket to itself; `false` without running it if another writer
    /// has the bucket (a cache can drop a write: nobody waits here).
    fn write(&self, change: impl FnOnce(&Self)) -> bool {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || self
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        // Keeps the changes below after the odd number, for readers' fences to pair with.
        fence(Ordering::Release);
        change(self);
        self.seq.store(seq + 2, Ordering::Release);
        true
    }
}

/// Unknown codes of at most [`PACKED_MAX`] characters.
pub(super) struct PackedNegatives {
    segments: Box<[OnceLock<Box<[Bucket]>>]>,
    /// log2 of the buckets per segment: [`SEGMENT`], or all of them in a smaller table (a
    /// shift on every lookup, not a division).
    segment_bits: u32,
    /// Buckets - 1 (a power of two).
    mask: usize,
    /// Ways holding a code.
    held: AtomicUsize,
}

impl std::fmt::Debug for PackedNegatives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedNegatives")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PackedNegatives {
    /// A table of at most `bytes` (at least one bucket).
    pub(super) fn new(bytes: u64) -> Self {
        let fit = usize::try_from(bytes).unwrap_or(usize::MAX) / size_of::<Bucket>();
        // The largest power of two that fits: the bucket index is a mask of the hash.
        let buckets = fit.checked_ilog2().map_or(1, |log| 1usize << log);
        let segment_bits = SEGMENT.min(buckets).ilog2();
        Self {
            segments: (0..buckets >> segment_bits)
                .map(|_| OnceLock::new())
                .collect(),
            segment_bits,
            mask: buckets - 1,
            held: AtomicUsize::new(0),
        }
    }

    /// The two buckets `hash` (of a code) names. The hash's low 16 bits pick the code's write
    /// generation and bits 16–31 its entry's lifetime (`LinkCache`); the first bucket comes
    /// from the high 32, the second from all of them mixed again (odd multiplier: a
    /// bijection, so no fixed point in common).
    fn places(&self, hash: u64) -> [usize; 2] {
        let second = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32);
        [
            (hash >> 32) as usize & self.mask,
            second as usize & self.mask,
        ]
    }

    fn segment_len(&self) -> usize {
        1 << self.segment_bits
    }

    /// The segment of the bucket at `index`, and its offset there.
    fn locate(&self, index: usize) -> (usize, usize) {
        (index >> self.segment_bits, index & (self.segment_len() - 1))
    }

    /// The bucket at `index`, if its segment exists.
    fn bucket(&self, index: usize) -> Option<&Bucket> {
        let (segment, offset) = self.locate(index);
        self.segments[segment].get().map(|buckets| &buckets[offset])
    }

    fn bucket_or_new(&self, index: usize) -> &Bucket {
        let (segment, offset) = self.locate(index);
        let len = self.segment_len();
        &self.segments[segment].get_or_init(|| (0..len).map(|_| Bucket::default()).collect())
            [offset]
    }

    pub(super) fn get(&self, code: u64, hash: u64) -> Option<Entry> {
        self.places(hash)
            .into_iter()
            .find_map(|index| self.bucket(index)?.find(code))
    }

    /// Stores `entry` for `code`, in place of its earlier entry, else of a free or expired
    /// one, else of the one that expires first: in its first bucket while that has fewer
    /// than [`SPILL_AT`] live ways, else in whichever of its two buckets offers the better
    /// way. Dropped if a writer has that bucket.
    pub(super) fn insert(&self, code: u64, hash: u64, entry: Entry, now: u32) {
        let [first, second] = self.places(hash);
        let a = self.bucket_or_new(first);
        // Chosen without the buckets' locks, so a racing writer may make the choice worse
        // (or hold the code twice: readers take the first, the generation check judges it).
        let (way_a, rank_a) = a.victim(code, now);
        // The second bucket's segment is allocated only once a first bucket is full; an
        // existing one is looked at for the code's earlier entry too.
        let b = match self.bucket(second) {
            None if rank_a <= WAYS as u64 => None,
            _ => Some(self.bucket_or_new(second)),
        };
        let spill = |rank_b: u64| rank_b == 0 || (rank_a > SPILL_AT && rank_b < rank_a);
        let (bucket, way) = match b.map(|b| (b, b.victim(code, now))) {
            Some((b, (way_b, rank_b))) if rank_a != 0 && spill(rank_b) => (b, way_b),
            _ => (a, way_a),
        };
        bucket.write(|bucket| {
            let way = &bucket.ways[way];
            if way.code.swap(code, Ordering::Relaxed) == 0 {
                self.held.fetch_add(1, Ordering::Relaxed);
            }
            way.entry.store(entry.word(), Ordering::Relaxed);
        });
    }

    /// Frees the ways of `code`, if its buckets hold it (and no writer has them: then the
    /// entry stays, and the generation check makes it miss).
    pub(super) fn remove(&self, code: u64, hash: u64) {
        for index in self.places(hash) {
            if let Some(bucket) = self.bucket(index) {
                bucket.write(|bucket| self.free(bucket, |held| held == code));
            }
        }
    }

    /// Frees every way (what a writer has at that moment stays: stale by its generation).
    pub(super) fn clear(&self) {
        for bucket in self.segments.iter().filter_map(OnceLock::get).flatten() {
            bucket.write(|bucket| self.free(bucket, |held| held != 0));
        }
    }

    fn free(&self, bucket: &Bucket, which: impl Fn(u64) -> bool) {
        for way in &bucket.ways {
            if which(way.code.load(Ordering::Relaxed)) {
                way.code.store(0, Ordering::Relaxed);
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Codes held and the bytes of the segments allocated.
    pub(super) fn size(&self) -> (u64, u64) {
        let segments = self.segments.iter().filter(|s| s.get().is_some()).count();
        (
            self.held.load(Ordering::Relaxed) as u64,
            (segments * self.segment_len() * size_of::<Bucket>()) as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const NOW: u32 = 1_700_000_000;

    fn entry(generation: u32, fresh_until: u32) -> Entry {
        Entry {
            generation,
            fresh_until,
        }
    }

    #[test]
    fn codes_of_up_to_ten_characters_pack_into_distinct_nonzero_numbers() {
        let alphabet: Vec<char> = ('0'..='9')
            .chain('A'..='Z')
            .chain('a'..='z')
            .chain(['-'])
            .collect();
        assert_eq!(alphabet.len(), 63);
        let mut seen = HashSet::new();
        for a in &alphabet {
            for b in &alphabet {
                for code in [format!("{a}{b}xy"), format!("xy{a}{b}"), format!("{a}{b}")] {
                    let n = packed(&code).unwrap();
                    assert_ne!(n, 0);
                    seen.insert((code, n));
                }
            }
        }
        let numbers: HashSet<u64> = seen.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers.len(), seen.len());
        // A prefix is not its longer code.
        assert_ne!(packed("abcd"), packed("abcd0"));
        assert!(packed("aZ3x9Qp-Kz").is_some());
        assert_eq!(packed("aZ3x9Qp-Kz1"), None);
        assert_eq!(packed("no/slash"), None);
        assert_eq!(packed(""), None);
    }

    #[test]
    fn an_entry_is_found_by_its_code_and_replaced_by_a_later_one() {
        let table = PackedNegatives::new(1 << 20);
        let code = packed("abcdefg").unwrap();
        assert_eq!(table.get(code, 42), None);
        table.insert(code, 42, entry(3, NOW + 60), NOW);
        assert_eq!(table.get(code, 42), Some(entry(3, NOW + 60)));
        table.insert(code, 42, entry(4, NOW + 90), NOW);
        assert_eq!(table.get(code, 42), Some(entry(4, NOW + 90)));
        assert_eq!(table.size().0, 1);
        table.remove(code, 42);
        assert_eq!(table.get(code, 42), None);
        assert_eq!(table.size().0, 0);
    }

    #[test]
    fn full_buckets_give_up_their_expired_then_their_soonest_expiring_entry() {
        let table = PackedNegatives::new(1 << 20);
        // One hash: every code lands in the same two buckets.
        let [a, b] = table.places(7);
        assert_ne!(a, b);
        let ways = 2 * WAYS;
        let codes: Vec<u64> = (0..=ways)
            .map(|i| packed(&format!("code{i}")).unwrap())
            .collect();
        for (i, &code) in codes[..ways].iter().enumerate() {
            table.insert(code, 7, entry(0, NOW + 100 + i as u32), NOW);
        }
        assert!(codes[..ways].iter().all(|&c| table.get(c, 7).is_some()));
        // The way expiring first (the first code) goes.
        table.insert(codes[ways], 7, entry(0, NOW + 500), NOW);
        assert_eq!(table.get(codes[0], 7), None);
        assert!(codes[1..].iter().all(|&c| table.get(c, 7).is_some()));
        // Past the second code's time, its way goes before any live one.
        table.insert(codes[0], 7, entry(0, NOW + 600), NOW + 101);
        assert_eq!(table.get(codes[1], 7), None);
        assert!(table.get(codes[2], 7).is_some() && table.get(codes[0], 7).is_some());
        assert_eq!(table.size().0, ways as u64);
        // A later entry for a held code takes its own way, whatever else is free.
        table.remove(codes[2], 7);
        table.insert(codes[3], 7, entry(1, NOW + 700), NOW + 101);
        assert_eq!(table.get(codes[3], 7), Some(entry(1, NOW + 700)));
        assert_eq!(table.size().0, ways as u64 - 1);
    }

    #[test]
    fn a_table_holds_nearly_as_many_codes_as_it_has_ways() {
        let table = PackedNegatives::new(1 << 20);
        // 80 % full: with one bucket per code, 7.6 % of codes found it full (a simulation);
        // with the emptier of two, 0.07 %; spilling at SPILL_AT live ways, 0.3 %.
        let codes = hashed_codes((table.mask + 1) * WAYS * 8 / 10);
        for &(code, hash) in &codes {
            table.insert(code, hash, entry(0, NOW + 60), NOW);
        }
        let lost = codes
            .iter()
            .filter(|&&(code, hash)| table.get(code, hash).is_none())
            .count();
        assert!(
            lost * 200 < codes.len(),
            "{lost} of {} codes lost",
            codes.len()
        );
    }

    /// `count` distinct codes with well-spread hashes.
    fn hashed_codes(count: usize) -> Vec<(u64, u64)> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        (0..count)
            .map(|i| {
                let code = format!("{i:07}");
                (packed(&code).unwrap(), hasher.hash_one(&code))
            })
            .collect()
    }

    #[test]
    fn at_the_load_of_a_flood_nearly_every_code_is_in_its_first_bucket() {
        let table = PackedNegatives::new(1 << 20);
        let codes = hashed_codes((table.mask + 1) * WAYS * 44 / 100);
        for &(code, hash) in &codes {
            table.insert(code, hash, entry(0, NOW + 60), NOW);
        }
        let first = codes
            .iter()
            .filter(|&&(code, hash)| {
                let index = table.places(hash)[0];
                table.bucket(index).and_then(|b| b.find(code)).is_some()
            })
            .count();
        // 95 % by the simulation in `SPILL_AT`'s comment; 70 % when codes took the emptier.
        assert!(
            first * 100 >= codes.len() * 93,
            "{first} of {}",
            codes.len()
        );
        assert!(
            codes
                .iter()
                .all(|&(code, hash)| table.get(code, hash).is_some())
        );
    }

    #[test]
    fn segments_are_allocated_by_the_first_entry_in_them_and_cleared_in_place() {
        let table = PackedNegatives::new(4 << 20);
        assert_eq!(table.size(), (0, 0));
        let code = packed("abcdefg").unwrap();
        table.insert(code, 1 << 40, entry(0, NOW + 60), NOW);
        let segment = (SEGMENT * size_of::<Bucket>()) as u64;
        assert_eq!(table.size(), (1, segment));
        table.clear();
        assert_eq!(table.get(code, 1 << 40), None);
        assert_eq!(table.size(), (0, segment));
    }

    #[test]
    fn readers_never_see_one_writes_code_with_anothers_entry() {
        let table = PackedNegatives::new(1 << 20);
        let codes: Vec<u64> = (0..4 * WAYS)
            .map(|i| packed(&format!("code{i:02}")).unwrap())
            .collect();
        // Each code's entry is derived from it, so a torn read shows as a mismatch.
        let entry_of = |code: u64, round: u32| entry(code as u32, round);
        std::thread::scope(|s| {
            for writer in 0..2u32 {
                let (table, codes) = (&table, &codes);
                s.spawn(move || {
                    for round in 0..20_000u32 {
                        let code = codes[(round as usize * 7 + writer as usize) % codes.len()];
                        table.insert(code, 9, entry_of(code, round), round);
                    }
                });
            }
            for _ in 0..2 {
                let (table, codes) = (&table, &codes);
                s.spawn(move || {
                    for i in 0..100_000 {
                        let code = codes[i % codes.len()];
                        if let Some(found) = table.get(code, 9) {
                            assert_eq!(found.generation, code as u32);
                        }
                    }
                });
            }
        });
    }
}
