//! The in-process link cache (L1) in front of the store, negative entries included.
//!
//! A [`quick_cache`] cache: size-bounded by weight, S3-FIFO-like eviction (scan resistant, as
//! TinyLFU is), and a hit that takes one shard read lock and allocates nothing — cheaper than
//! moka's read path, which records every hit in a channel. TTLs are ours: an entry carries
//! the second until which it may be served and a hit past it is a miss, so no entry outlives
//! its TTL, nor its link's expiry.
//!
//! Concurrent misses on one code share one store read (a placeholder that later readers
//! wait on). Every write to a code (create, disable, enable, delete) bumps a generation counter of the
//! code's shard before invalidating its entry; an entry remembers the generation it was read
//! under and is ignored once that moved on. So a read that raced a write — started before
//! the write, finished after the invalidation — can never pin a stale entry, negative or not.
//! Entries also carry the link's version: news of a change (another instance's
//! announcement, the store's change sequence) drops an entry only if it is older.
//!
//! Unknown codes have a room of their own (a sixteenth of the memory, `negatives.rs`; a
//! sixty-fourth for aliases too long to pack): a sweep over codes that do not exist evicts
//! other unknown codes, never live links. One asked for near the end of its lifetime is read
//! again in the background (`renewals.rs`), so a steady sweep never waits on the store. One-hit wonders need no admission filter of ours:
//! quick_cache puts new entries in a small probationary queue (3 % of its weight) and
//! promotes only those hit again, so a scan of links seen once cycles through that queue
//! without touching the hot part.
//!
//! Stale if error: a link whose entry (L1, else L2) is past its TTL but within
//! `--stale-max-age` of it (and before the link's expiry) is still served when the store is
//! unavailable. An L1 entry found past its TTL moves to a shelf (an eighth of the memory)
//! while the store is asked again, so that every request that finds the store unavailable
//! meanwhile — not only the one that took the entry out — can still serve it. An invalidation
//! empties the shelf's entry and moves the generation, and rewrites the L2 entry, so nothing
//! is served stale after a change was announced.
//!
//! Idle entries go while the links' room is nearly full: quick_cache's hot part makes room
//! only when it promotes an entry, so a working set that moved on (the bench's 1 M-link Zipf
//! before its 10 M one) stayed, hit before, while the new one's codes seen once a cycle were
//! never promoted (BENCHMARKS.md, issue 18 at 10 M links). Each entry keeps the second a
//! lookup last found it, written by the hit's own clone of the entry (the line it reads
//! anyway, see [`Slot`]); a sweep every [`IDLE_SWEEP`] drops those unread for [`IDLE_SECONDS`].

mod negatives;
mod renewals;

use crate::metrics::Metrics;
use crate::scaleout::invalidation::Invalidations;
use crate::scaleout::l2::{self, Gone, L2};
use crate::store::Store;
use axum::http::HeaderValue;
use futures_util::{StreamExt, stream};
use negatives::PackedNegatives;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
pub(crate) use renewals::RENEWAL_TICK;
use renewals::Renewals;
use shortener_core::day::UnixSeconds;
use shortener_core::link::{Link, RedirectTarget};
use shortener_core::store::{ChangeNote, StoreError};
use smol_str::SmolStr;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shards of write generations; many, so that one write stales few unrelated entries.
const SHARDS: usize = 1 << 16;
/// What quick_cache keeps for an entry beside its key and value: state and reference bits and
/// list links in its slab (16 bytes), a slot and a control byte in its index (8 on average).
/// `entries_weigh_what_quick_cache_keeps_for_them` holds the crate to it.
const CACHE_EXTRA: usize = 24;
/// Keys of entries evicted from probation that a room remembers (to admit them at once if
/// asked again), as a share of the entries it holds. Each takes a slot as large as an entry's,
/// so the room's bytes pay for them: at quick_cache's default (half) they took a fifth of the
/// links' room; a tenth gave the best Zipf hit ratios per byte (BENCHMARKS.md, issue 18).
const GHOSTS: f64 = 0.1;
/// A typical link's weight (a seven-character code, a 60-byte destination; the weigher's, by a
/// test), for sizing a room's index and its ghosts.
const TYPICAL_ENTRY: u64 = 248;
/// What `Bytes` allocates beside a destination's buffer when a hit first clones it.
const BYTES_SHARED: usize = 24;
/// An entry no lookup found for this long goes at the next sweep while its room is nearly
/// full (seconds).
const IDLE_SECONDS: u32 = 60;
/// How often [`LinkCache::drop_idle`] should run.
pub(crate) const IDLE_SWEEP: Duration = Duration::from_secs(10);
/// Announcements remembered per poll period at most (past this, polled notes look at L2).
const MAX_HEARD: usize = 100_000;
/// Polled notes whose L2 entries are checked and filled together (bounded: a note written
/// before notes were capped at a thousand codes may hold an import batch's half million).
const NOTES_AT_ONCE: usize = 1000;
/// L2 reads (or fills) of polled notes in flight at once: they share the connection that
/// redirects' lookups use, which a thousand at once would hold up.
const L2_CALLS_AT_ONCE: usize = 32;

/// Announcements this instance heard (code → version) over the last two poll periods. Their
/// writer wrote that version into L2 (or dropped the entry) before publishing, so a polled
/// note of the same write needs no L2 round trip: with every create noted, that trip per
/// create and instance would cost as much Redis work as the create's own announcement.
#[derive(Debug, Default)]
struct Heard {
    recent: HashMap<Box<str>, u64, quick_cache::DefaultHashBuilder>,
    /// The period before: on PostgreSQL a create's note is numbered after one poll and read
    /// at the next, and a replica's lag can defer a note further.
    earlier: HashMap<Box<str>, u64, quick_cache::DefaultHashBuilder>,
}

/// What a redirect needs of a link, ready to send. Cloning it costs one reference-count
/// increment (the header value, shared with the entry): the code is inline, as in the key
/// (an alias longer than 23 bytes is an `Arc` shared with the key, a second increment).
#[derive(Debug, Clone)]
pub(crate) struct CachedLink {
    pub(crate) code: SmolStr,
    pub(crate) location: Option<HeaderValue>,
    pub(crate) expires_at: UnixSeconds,
    /// Set: answers 410.
    pub(crate) gone: Option<Gone>,
    pub(crate) version: u64,
}

#[derive(Debug)]
struct Slot {
    link: Option<CachedLink>,
    generation: u32,
    /// The second (Unix, 32 bits) a lookup last found this entry; in the padding after
    /// `generation`, so it costs no byte.
    read_at: AtomicU32,
    /// Served while `now < fresh_until` (Unix seconds).
    fresh_until: UnixSeconds,
    /// Past `fresh_until`, served while `now < stale_until` if the store is unavailable.
    stale_until: UnixSeconds,
}

thread_local! {
    /// The second of the lookup this thread is making (0 outside [`LinkCache::cached`]),
    /// for [`Slot::clone`].
    static LOOKUP_AT: Cell<u32> = const { Cell::new(0) };
}

/// quick_cache's `get` hands out a clone made under the shard's read lock, and the clone is
/// the only code that sees the entry the cache keeps: a lookup's clone notes the read there,
/// on the line it reads anyway (a stamp array beside the cache was a cache miss per hit).
impl Clone for Slot {
    fn clone(&self) -> Self {
        let at = LOOKUP_AT.get();
        let read_at = self.read_at.load(Ordering::Relaxed);
        // Only forwards and once a second, so a hot entry's line is seldom written; two
        // lookups racing across a second may lose the later one's second (harmless).
        if at > read_at {
            self.read_at.store(at, Ordering::Relaxed);
        }
        Self {
            link: self.link.clone(),
            generation: self.generation,
            read_at: AtomicU32::new(read_at.max(at)),
            fresh_until: self.fresh_until,
            stale_until: self.stale_until,
        }
    }
}

/// Sizes and lifetimes of the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSettings {
    pub(crate) max_bytes: u64,
    pub(crate) ttl: Duration,
    pub(crate) negative_ttl: Duration,
    pub(crate) stale_max_age: Duration,
}

impl CacheSettings {
    /// Until when an entry read at `now` may be served.
    fn fresh_until(&self, link: Option<&CachedLink>, now: UnixSeconds) -> UnixSeconds {
        let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let negative = now.saturating_add(seconds(self.negative_ttl));
        let Some(link) = link else {
            return negative;
        };
        if link.gone.is_some() {
            // Every change is announced or polled, so the entry can live its full TTL.
            return now.saturating_add(seconds(self.ttl));
        }
        if link.expires_at <= now {
            // Expired: as cheap to answer as an unknown code, and as short-lived in cache.
            return negative;
        }
        now.saturating_add(seconds(self.ttl)).min(link.expires_at)
    }

    /// Until when a code the store did not know at `now` may be answered as unknown: the
    /// negative TTL ([`Self::fresh_until`]), less up to a quarter of it (at most 65 535 s)
    /// picked by bits 16–31 of the code's `hash`, which neither its generation (bits 0–15) nor
    /// its first bucket of negatives (from bit 32) uses: codes sharing a bucket expire apart
    /// too. A sweep's codes, first seen within a second, would otherwise all expire in the same
    /// second a TTL later and go to the store together: a stall the length of the sweep's
    /// reads, every TTL.
    fn unknown_until(&self, hash: u64, now: UnixSeconds) -> UnixSeconds {
        let less = ((hash >> 16) & 0xFFFF) % (self.negative_quarter() + 1);
        // `less` is below 2^16, so the conversion holds.
        self.fresh_until(None, now)
            .saturating_sub(i64::try_from(less).unwrap_or(0))
    }

    /// A quarter of the negative TTL, whole seconds: the spread of unknown codes' lifetimes,
    /// and the end of one in which a lookup queues the code for a renewal (`renewals.rs`).
    fn negative_quarter(&self) -> u64 {
        self.negative_ttl.as_secs() / 4
    }

    /// A code of `hash` found unknown by a store read begun at `now` under `generation`.
    fn unknown(&self, hash: u64, generation: u32, now: UnixSeconds) -> Negative {
        Negative {
            generation,
            fresh_until: self.unknown_until(hash, now),
        }
    }

    /// Until when an entry fresh until `fresh_until` may be served while the store is
    /// unavailable: links only (an unknown code may have been created since), never past
    /// their expiry.
    fn stale_until(&self, link: Option<&CachedLink>, fresh_until: UnixSeconds) -> UnixSeconds {
        let stale_age = i64::try_from(self.stale_max_age.as_secs()).unwrap_or(i64::MAX);
        match link {
            Some(link) if link.gone.is_some() => fresh_until.saturating_add(stale_age),
            Some(link) if fresh_until < link.expires_at => {
                fresh_until.saturating_add(stale_age).min(link.expires_at)
            }
            _ => fresh_until,
        }
    }

    fn slot(&self, link: Option<CachedLink>, generation: u32, now: UnixSeconds) -> Slot {
        let fresh_until = self.fresh_until(link.as_ref(), now);
        Slot {
            stale_until: self.stale_until(link.as_ref(), fresh_until),
            fresh_until,
            link,
            generation,
            read_at: AtomicU32::new(seconds_u32(now)),
        }
    }
}

/// An unknown code: only when it was read and until when it may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Negative {
    generation: u32,
    fresh_until: UnixSeconds,
}

/// The block the allocator (mimalloc) hands out for `bytes`: 8-byte steps up to 64, then
/// four size classes per doubling.
fn allocation(bytes: usize) -> usize {
    if bytes <= 64 {
        return bytes.next_multiple_of(8).max(8);
    }
    let below = 1usize << (usize::BITS - 1 - (bytes - 1).leading_zeros());
    bytes.next_multiple_of(below / 4)
}

/// Bytes a room holds for an entry of a `V` under `code`: quick_cache's slot, and the code's
/// `Arc` (shared with a link's value) when it is too long to be inline. Weighers run under the
/// shard's lock, often: nothing here allocates.
fn entry_bytes<V>(code: &SmolStr) -> usize {
    let shared = if code.is_heap_allocated() {
        allocation(2 * size_of::<usize>() + code.len())
    } else {
        0
    };
    size_of::<(SmolStr, V)>() + CACHE_EXTRA + shared
}

#[derive(Debug, Clone, Copy)]
struct NegativeWeigher;

impl Weighter<SmolStr, Negative> for NegativeWeigher {
    fn weight(&self, code: &SmolStr, _: &Negative) -> u64 {
        entry_bytes::<Negative>(code) as u64
    }
}

#[derive(Debug, Clone, Copy)]
struct SlotWeigher;

impl Weighter<SmolStr, Slot> for SlotWeigher {
    fn weight(&self, code: &SmolStr, slot: &Slot) -> u64 {
        let url = slot
            .link
            .as_ref()
            .and_then(|l| l.location.as_ref())
            .map_or(0, |v| allocation(v.len()) + allocation(BYTES_SHARED));
        (entry_bytes::<Slot>(code) + url) as u64
    }
}

/// A room of `bytes` (its ghosts included) whose entries weigh about `typical`.
fn room<V: Clone, W: Weighter<SmolStr, V> + Clone>(
    bytes: u64,
    typical: u64,
    weighter: W,
) -> anyhow::Result<Cache<SmolStr, V, W>> {
    let items = (bytes / typical).max(1);
    // A ghost is a hash in an entry's slot.
    let ghost = (size_of::<(SmolStr, V)>() + CACHE_EXTRA) as u64;
    let ghosts = (items as f64 * GHOSTS) as u64;
    let options = quick_cache::OptionsBuilder::new()
        .estimated_items_capacity(usize::try_from(items).unwrap_or(usize::MAX))
        .weight_capacity(bytes.saturating_sub(ghosts * ghost).max(1))
        .ghost_allocation(GHOSTS)
        .build()?;
    Ok(Cache::with_options(
        options,
        weighter,
        quick_cache::DefaultHashBuilder::default(),
        quick_cache::sync::DefaultLifecycle::default(),
    ))
}

/// The shared layer of the scale-out mode, between L1 and the store.
#[derive(Debug, Clone)]
pub(crate) struct SharedLayer {
    pub(crate) l2: Arc<L2>,
    pub(crate) invalidations: Arc<Invalidations>,
}

impl SharedLayer {
    /// L2's entries of `codes`, in their order, [`L2_CALLS_AT_ONCE`] reads at a time.
    async fn get_all(&self, codes: &[&str], now: UnixSeconds) -> Vec<Option<l2::Found>> {
        // Collected first: a lazy iterator of futures inside the caller's future trips the
        // compiler over `Send`.
        let reads: Vec<_> = codes.iter().map(|code| self.l2.get(code, now)).collect();
        stream::iter(reads)
            .buffered(L2_CALLS_AT_ONCE)
            .collect()
            .await
    }

    /// Fills L2 with what the store said of each code, [`L2_CALLS_AT_ONCE`] at a time (the
    /// fill script never lets an older read replace a later write); how many fills failed.
    async fn fill_all(
        &self,
        read: impl IntoIterator<Item = (&str, Option<RedirectTarget>)>,
        now: UnixSeconds,
    ) -> usize {
        let fills: Vec<_> = read
            .into_iter()
            .map(|(code, target)| async move {
                let entry = l2::Entry::of_target(target);
                self.l2.fill(code, &entry, now).await.is_err()
            })
            .collect();
        stream::iter(fills)
            .buffer_unordered(L2_CALLS_AT_ONCE)
            .filter(|failed| std::future::ready(*failed))
            .count()
            .await
    }
}

/// The L1 cache.
pub(crate) struct LinkCache {
    slots: Cache<SmolStr, Slot, SlotWeigher>,
    /// Entries past their TTL that may still stand in for an unavailable store.
    shelf: Cache<SmolStr, Slot, SlotWeigher>,
    /// Codes the store does not know, apart from the links: those that pack into a word...
    negatives: PackedNegatives,
    /// ...and longer aliases.
    long_negatives: Cache<SmolStr, Negative, NegativeWeigher>,
    /// Unknown codes due to be read again before they expire.
    renewals: Renewals,
    generations: Box<[AtomicU32]>,
    /// quick_cache's own fast keyed hasher: SipHash here cost a redirect more than the
    /// cache lookup itself.
    hasher: quick_cache::DefaultHashBuilder,
    settings: CacheSettings,
    store: Arc<dyn Store>,
    shared: Option<SharedLayer>,
    heard: Mutex<Heard>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for LinkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkCache")
            .field("entries", &self.slots.len())
            .finish_non_exhaustive()
    }
}

fn to_cached(entry: l2::Entry, code: SmolStr) -> Option<CachedLink> {
    match entry {
        l2::Entry::Unknown => None,
        l2::Entry::Link {
            long_url,
            expires_at,
            gone,
            version,
        } => Some(CachedLink {
            location: HeaderValue::from_str(&long_url).ok(),
            expires_at,
            gone,
            version,
            code,
        }),
    }
}

impl LinkCache {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        shared: Option<SharedLayer>,
        metrics: Arc<Metrics>,
        settings: CacheSettings,
    ) -> anyhow::Result<Self> {
        let shelf_bytes = settings.max_bytes / 8;
        let negative_bytes = settings.max_bytes / 16;
        let long_negative_bytes = settings.max_bytes / 64;
        let generations = (SHARDS * size_of::<AtomicU32>()) as u64;
        let fresh_bytes = settings
            .max_bytes
            .saturating_sub(shelf_bytes + negative_bytes + long_negative_bytes + generations);
        let long_negative_typical =
            entry_bytes::<Negative>(&SmolStr::new_inline("a-twenty-char-alias")) as u64;
        Ok(Self {
            slots: room(fresh_bytes, TYPICAL_ENTRY, SlotWeigher)?,
            shelf: room(shelf_bytes, TYPICAL_ENTRY, SlotWeigher)?,
            negatives: PackedNegatives::new(negative_bytes),
            long_negatives: room(long_negative_bytes, long_negative_typical, NegativeWeigher)?,
            renewals: Renewals::default(),
            generations: (0..SHARDS).map(|_| AtomicU32::new(0)).collect(),
            hasher: quick_cache::DefaultHashBuilder::default(),
            settings,
            store,
            shared,
            heard: Mutex::default(),
            metrics,
        })
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        // A poisoned map is still a map: every insert and take leaves it whole.
        self.heard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hash that picks `code`'s generation (bits 0–15), its buckets of negatives (bits
    /// 32–63 and all of them mixed), when it stops being known as unknown (bits 16–31) and
    /// its claim bit for a renewal (all of them mixed again, `renewals.rs`).
    fn hash(&self, code: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(code.as_bytes());
        h.finish()
    }

    fn generation(&self, hash: u64) -> &AtomicU32 {
        // SHARDS is a power of two, so the mask keeps the index in range.
        &self.generations[(hash as usize) & (SHARDS - 1)]
    }

    /// Drops the links' entries that no lookup found for [`IDLE_SECONDS`] while their room is
    /// at least 90 % full (run every [`IDLE_SWEEP`], off the request path: a shard's write
    /// lock is held while it is walked).
    pub(crate) fn drop_idle(&self, now: UnixSeconds) {
        if self.slots.weight() < self.slots.capacity() / 10 * 9 {
            return;
        }
        let now = seconds_u32(now);
        self.slots.retain(|_, slot| {
            now.saturating_sub(slot.read_at.load(Ordering::Relaxed)) < IDLE_SECONDS
        });
    }

    fn usable(&self, slot: &Slot, generation: &AtomicU32, now: UnixSeconds) -> bool {
        now < slot.fresh_until && slot.generation == generation.load(Ordering::Acquire)
    }

    /// A slot past its TTL that may stand in for the store while it is unavailable.
    fn stale_stand_in(&self, slot: &Slot, generation: &AtomicU32, now: UnixSeconds) -> bool {
        now < slot.stale_until && slot.generation == generation.load(Ordering::Acquire)
    }

    /// What the cache alone answers for `code` (`Some(None)`: known unknown), or `None` when
    /// the store must be asked ([`Self::read`]). Synchronous, so that a hit needs no future
    /// at all (see `api/redirect.rs`).
    pub(crate) fn cached(&self, code: &str, now: UnixSeconds) -> Option<Option<CachedLink>> {
        let hash = self.hash(code);
        let generation = self.generation(hash);
        LOOKUP_AT.set(seconds_u32(now));
        let found = self.slots.get(code);
        LOOKUP_AT.set(0);
        if let Some(slot) = found {
            if self.usable(&slot, generation, now) {
                match slot.link {
                    Some(_) => self.metrics.cache_hit.inc(),
                    None => self.metrics.cache_negative_hit.inc(),
                };
                return Some(slot.link);
            }
            self.forget(code, &slot, now);
        }
        if self.known_unknown(code, hash, generation, now) {
            self.metrics.cache_negative_hit.inc();
            return Some(None);
        }
        None
    }

    /// A miss: the store (or L2) is asked, concurrent misses on `code` sharing one read.
    pub(crate) async fn read(
        &self,
        code: &str,
        now: UnixSeconds,
    ) -> Result<Option<CachedLink>, StoreError> {
        let hash = self.hash(code);
        let generation = self.generation(hash);
        self.metrics.cache_miss.inc();
        let key = SmolStr::new(code);
        loop {
            let guard = match self.slots.get_value_or_guard_async(&key).await {
                Ok(slot) if self.usable(&slot, generation, now) => return Ok(slot.link),
                Ok(slot) => {
                    // We joined a read that started before a write to this code, or found
                    // an entry past its time: read again.
                    self.forget(code, &slot, now);
                    continue;
                }
                Err(guard) => guard,
            };
            // The read we waited on may have found the code unknown (kept apart).
            if self.known_unknown(code, hash, generation, now) {
                return Ok(None);
            }
            // Read the generation before the store: a write that lands after this load
            // bumps it, and the slot we are about to fill is then recognised as stale.
            let seen = generation.load(Ordering::Acquire);
            let (entry, stale) = match self.load(code, now).await {
                Ok(loaded) => loaded,
                Err(e @ StoreError::Unavailable(_)) => {
                    let shelved = self.shelf.get(code);
                    return match shelved.filter(|s| self.stale_stand_in(s, generation, now)) {
                        Some(slot) => {
                            self.metrics.stale_l1.inc();
                            Ok(slot.link)
                        }
                        None => Err(e),
                    };
                }
                // The guard drops unfilled and a waiter, if any, reads in its turn.
                Err(e) => return Err(e),
            };
            let link = to_cached(entry, key.clone());
            if stale {
                // A stale L2 entry stood in for the store: never cached as fresh here.
                return Ok(link);
            }
            if link.is_none() {
                let negative = self.settings.unknown(hash, seen, now);
                self.remember_unknown(&key, hash, negative, now);
                // Unfilled, the placeholder lets a waiter in, which finds the entry above.
                drop(guard);
                if seen == generation.load(Ordering::Acquire) {
                    return Ok(None);
                }
                continue;
            }
            let slot = self.settings.slot(link, seen, now);
            // Err only if an invalidation removed the placeholder meanwhile; the answer we
            // return is still what the store said when asked.
            let _ = guard.insert(slot.clone());
            self.shelf.remove(code);
            if slot.generation == generation.load(Ordering::Acquire) {
                return Ok(slot.link);
            }
        }
    }

    /// Whether `code` is cached as unknown (and still may be); one due to be read again is
    /// queued for that (`renewals.rs`). A packed entry past its time stays until its way is
    /// needed; a long alias's is dropped.
    fn known_unknown(
        &self,
        code: &str,
        hash: u64,
        generation: &AtomicU32,
        now: UnixSeconds,
    ) -> bool {
        let usable = |n: &Negative| {
            let usable = now < n.fresh_until && n.generation == generation.load(Ordering::Acquire);
            if usable && self.settings.renewal_due(n.fresh_until, now) {
                self.renewals.claim(code, hash);
            }
            usable
        };
        if let Some(packed) = negatives::packed(code) {
            return self.negatives.get(packed, hash).is_some_and(|entry| {
                usable(&Negative {
                    generation: entry.generation,
                    fresh_until: entry.fresh_until.into(),
                })
            });
        }
        let Some(negative) = self.long_negatives.get(code) else {
            return false;
        };
        if usable(&negative) {
            return true;
        }
        self.long_negatives.remove_if(code, |n| *n == negative);
        false
    }

    /// Remembers that the store does not know `code` (`hash` its [`Self::hash`]).
    fn remember_unknown(&self, code: &SmolStr, hash: u64, negative: Negative, now: UnixSeconds) {
        match negatives::packed(code) {
            Some(packed) => {
                let entry = negatives::Entry {
                    generation: negative.generation,
                    fresh_until: seconds_u32(negative.fresh_until),
                };
                self.negatives.insert(packed, hash, entry, seconds_u32(now));
            }
            None => {
                self.long_negatives.insert(code.clone(), negative);
            }
        }
    }

    /// What L2 (in the scale-out mode) or else the store says of `code`; `true` with a stale
    /// L2 link that stood in for an unavailable store.
    async fn load(&self, code: &str, now: UnixSeconds) -> Result<(l2::Entry, bool), StoreError> {
        let mut stand_in = None;
        if let Some(shared) = &self.shared
            && let Some(found) = shared.l2.get(code, now).await
        {
            if !found.stale {
                self.metrics.l2_hit.inc();
                return Ok((found.entry, false));
            }
            stand_in = Some(found.entry);
        }
        self.metrics.store_link_reads.inc();
        let entry = match (self.store.redirect_target(code).await, stand_in) {
            (Ok(target), _) => l2::Entry::of_target(target),
            (Err(StoreError::Unavailable(_)), Some(stale)) => {
                self.metrics.stale_l2.inc();
                return Ok((stale, true));
            }
            (Err(e), _) => return Err(e),
        };
        if let Some(shared) = &self.shared {
            // Off the redirect's path, best effort: the script never lets this (possibly
            // older) read replace a later write, whichever reaches Redis first.
            let (l2, code, fill) = (shared.l2.clone(), code.to_owned(), entry.clone());
            tokio::spawn(async move {
                if let Err(e) = l2.fill(&code, &fill, now).await {
                    tracing::debug!(error = %e, "cannot fill L2");
                }
            });
        }
        Ok((entry, false))
    }

    /// Drops the entry of `code` if it is still `stale` (not one filled since), shelving it
    /// if it may stand in for an unavailable store.
    fn forget(&self, code: &str, stale: &Slot, now: UnixSeconds) {
        // Shelved before it leaves the slots: a polled note of the version it holds checks
        // both (`knows`), and finding neither in between it dropped the stand-in (a cached
        // link answered 503 in an outage: tests/availability.rs failed so once). A copy
        // shelved after a write removed the entry has an older generation: never served.
        let shelve = now < stale.stale_until;
        if shelve {
            // The link's own code as the key: a long alias's `Arc` shared, not copied.
            let key = stale
                .link
                .as_ref()
                .map_or_else(|| SmolStr::new(code), |l| l.code.clone());
            self.shelf.insert(key, stale.clone());
        }
        let same = |slot: &Slot| {
            slot.generation == stale.generation && slot.fresh_until == stale.fresh_until
        };
        if self.slots.remove_if(code, same).is_none() && shelve && self.slots.peek(code).is_some() {
            // A later read took its place (maybe of a later version): that one is shelved
            // when it is forgotten in turn, and this copy must not outlive it.
            self.shelf.remove_if(code, same);
        }
    }

    /// Called after every write to a link has committed, with its new state: no lookup in
    /// this instance from now on returns what was read before it; in the scale-out mode the
    /// L2 entry is updated and every other instance told.
    pub(crate) async fn written(&self, link: &Link) {
        self.invalidate(&link.code);
        if let Some(shared) = &self.shared {
            shared
                .invalidations
                .announce(&link.code, l2::Entry::of(Some(link)), crate::now())
                .await;
            // A lookup here between the first invalidation and the L2 update may have
            // cached L2's old state under the new generation.
            self.invalidate(&link.code);
        }
    }

    /// Whether this instance holds `version` of `code` or a later one, on the shelf too: a
    /// late note of a change already read must not take the stand-in an outage would need.
    fn knows(&self, code: &str, version: u64) -> bool {
        let holds = |slot: Option<Slot>| {
            slot.and_then(|slot| slot.link)
                .is_some_and(|link| link.version >= version)
        };
        holds(self.slots.peek(code)) || holds(self.shelf.peek(code))
    }

    /// An instance (this one included) announced that `code` reached `version`: forgets it
    /// here unless this instance already holds that version or a later one.
    pub(crate) fn invalidate_below(&self, code: &str, version: u64) {
        if !self.knows(code, version) {
            self.invalidate(code);
        }
        let mut heard = self.heard();
        if heard.recent.len() < MAX_HEARD {
            let known = heard.recent.entry(code.into()).or_insert(version);
            *known = (*known).max(version);
        }
    }

    /// A poll ended: announcements heard before the previous one ended are forgotten.
    pub(crate) fn poll_done(&self) {
        let mut heard = self.heard();
        heard.earlier = std::mem::take(&mut heard.recent);
    }

    /// Whether an announcement of `version` of `code`, or a later one, was heard lately.
    fn was_announced(&self, code: &str, version: u64) -> bool {
        let heard = self.heard();
        [&heard.recent, &heard.earlier]
            .iter()
            .any(|map| map.get(code).is_some_and(|&v| v >= version))
    }

    /// The store's change sequence says each note's code reached its version, possibly
    /// written by a process that told nobody (the CLI, an instance without Redis, one that
    /// died before announcing): forgets them here and, in the scale-out mode, puts the stored
    /// states into L2 (the fill never replaces a later version).
    ///
    /// The L2 work goes [`NOTES_AT_ONCE`] notes at a time: one store read for the codes L2
    /// lacks, reads and fills [`L2_CALLS_AT_ONCE`] at a time — an import of a million links
    /// is a million notes, which one round trip each to Redis and PostgreSQL made minutes of
    /// work for all three. A store read older than a note (a replica behind the one the notes
    /// came from) fills nothing and fails the batch, so the poll reads it again.
    pub(crate) async fn changed_elsewhere(&self, notes: &[ChangeNote]) -> Result<(), StoreError> {
        let news: Vec<&ChangeNote> = notes
            .iter()
            .filter(|note| !self.knows(&note.code, note.version))
            .collect();
        for note in &news {
            self.invalidate(&note.code);
        }
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let unheard: Vec<&ChangeNote> = news
            .into_iter()
            .filter(|note| !self.was_announced(&note.code, note.version))
            .collect();
        for notes in unheard.chunks(NOTES_AT_ONCE) {
            // A writer of another region, or one whose announcement is late or lost: L2 may
            // still hold an older state (an "unknown" above all, every create being noted).
            let now = crate::now();
            let codes: Vec<&str> = notes.iter().map(|note| note.code.as_str()).collect();
            let found = shared.get_all(&codes, now).await;
            let older: Vec<&ChangeNote> = notes
                .iter()
                .zip(found)
                .filter(|(note, found)| {
                    !found
                        .as_ref()
                        .is_some_and(|f| !f.stale && f.entry.version() >= note.version)
                })
                .map(|(note, _)| *note)
                .collect();
            if !older.is_empty() {
                let codes: Vec<String> = older.iter().map(|note| note.code.clone()).collect();
                let targets = self.store.redirect_targets(&codes).await?;
                let behind = older
                    .iter()
                    .zip(&targets)
                    .any(|(note, target)| target.as_ref().map_or(0, |t| t.version) < note.version);
                if behind {
                    return Err(StoreError::Unavailable(
                        "the store read is older than the change notes".into(),
                    ));
                }
                let read = codes.iter().map(String::as_str).zip(targets);
                let failed = shared.fill_all(read, now).await;
                if failed > 0 {
                    // Their L2 entries may stay older until their TTL: said, not retried.
                    tracing::warn!(failed, "cannot fill L2 with polled changes");
                }
            }
            // A lookup meanwhile may have cached L2's older state.
            for note in notes {
                self.invalidate(&note.code);
            }
        }
        Ok(())
    }

    /// Forgets `code` in this instance.
    pub(crate) fn invalidate(&self, code: &str) {
        let hash = self.hash(code);
        self.generation(hash).fetch_add(1, Ordering::AcqRel);
        self.slots.remove(code);
        self.shelf.remove(code);
        match negatives::packed(code) {
            Some(packed) => self.negatives.remove(packed, hash),
            None => {
                self.long_negatives.remove(code);
            }
        }
    }

    /// Forgets everything in this instance (after missing announcements of others' writes).
    pub(crate) fn invalidate_all(&self) {
        for generation in &self.generations {
            generation.fetch_add(1, Ordering::AcqRel);
        }
        self.slots.clear();
        self.shelf.clear();
        self.negatives.clear();
        self.long_negatives.clear();
    }

    /// Entries and their weight, for the metrics.
    pub(crate) fn size(&self) -> (u64, u64) {
        let (negatives, negative_bytes) = self.negatives.size();
        (
            (self.slots.len() + self.shelf.len() + self.long_negatives.len()) as u64 + negatives,
            self.slots.weight()
                + self.shelf.weight()
                + self.long_negatives.weight()
                + negative_bytes,
        )
    }
}

/// Unix seconds as the packed negatives keep them (saturated: 32 bits last until 2106).
fn seconds_u32(seconds: UnixSeconds) -> u32 {
    u32::try_from(seconds.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
