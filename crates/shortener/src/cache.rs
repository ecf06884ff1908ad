//! The in-process link cache (L1) in front of the store, negative entries included.
//!
//! Lookups by `&str` on a hit allocate nothing. Concurrent misses on one code share one store
//! read. Every write to a code (create, delete) bumps a generation counter of the code's
//! shard before invalidating its entry; an entry remembers the generation it was read under
//! and is ignored once that moved on. So a read that raced a write — started before the
//! write, finished after the invalidation — can never pin a stale entry, negative or not.

use crate::metrics::Metrics;
use crate::store::Store;
use axum::http::HeaderValue;
use moka::Expiry;
use moka::future::Cache;
use shortener_core::day::UnixSeconds;
use shortener_core::link::Link;
use shortener_core::store::StoreError;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Shards of write generations; many, so that one write stales few unrelated entries.
const SHARDS: usize = 1 << 16;
/// Bytes an entry costs beyond its strings: moka's node, deque links and timestamps, the Arc,
/// the header value. An estimate: measured RSS grows by about 1.5 × the weighed size once the
/// cache is full (the frequency sketch, the hash table's slack, allocator size classes), which
/// is why the default `--cache-mb` stays well below the memory budget.
const ENTRY_OVERHEAD: usize = 270;

/// What a redirect needs of a link, ready to send. Cloning it costs two reference-count
/// increments (the code is shared with the cache key, the header value with the entry).
#[derive(Debug, Clone)]
pub(crate) struct CachedLink {
    pub(crate) code: Arc<str>,
    pub(crate) location: Option<HeaderValue>,
    pub(crate) expires_at: UnixSeconds,
    pub(crate) disabled: bool,
}

#[derive(Debug, Clone)]
struct Slot {
    link: Option<CachedLink>,
    generation: u32,
}

/// Sizes and lifetimes of the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSettings {
    pub(crate) max_bytes: u64,
    pub(crate) ttl: Duration,
    pub(crate) negative_ttl: Duration,
}

struct SlotExpiry {
    settings: CacheSettings,
}

impl Expiry<Arc<str>, Slot> for SlotExpiry {
    fn expire_after_create(&self, _: &Arc<str>, slot: &Slot, _: Instant) -> Option<Duration> {
        let Some(link) = &slot.link else {
            return Some(self.settings.negative_ttl);
        };
        if link.disabled {
            // Disabling is final; the entry can live its full TTL.
            return Some(self.settings.ttl);
        }
        let left = u64::try_from(link.expires_at - crate::now()).unwrap_or(0);
        if left == 0 {
            // Expired: as cheap to answer as an unknown code, and as short-lived in cache.
            return Some(self.settings.negative_ttl);
        }
        Some(self.settings.ttl.min(Duration::from_secs(left)))
    }
}

/// The L1 cache.
pub(crate) struct LinkCache {
    slots: Cache<Arc<str>, Slot>,
    generations: Box<[AtomicU32]>,
    hasher: std::collections::hash_map::RandomState,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for LinkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkCache")
            .field("entries", &self.slots.entry_count())
            .finish_non_exhaustive()
    }
}

fn to_cached(link: Link, code: Arc<str>) -> CachedLink {
    CachedLink {
        location: HeaderValue::from_str(&link.long_url).ok(),
        expires_at: link.expires_at,
        disabled: link.disabled_at.is_some(),
        code,
    }
}

fn weigh(code: &Arc<str>, slot: &Slot) -> u32 {
    let url = slot
        .link
        .as_ref()
        .and_then(|l| l.location.as_ref())
        .map_or(0, HeaderValue::len);
    u32::try_from(ENTRY_OVERHEAD + 2 * code.len() + url).unwrap_or(u32::MAX)
}

/// A store error shared by every waiter of one coalesced read, turned back into an owned one.
fn shared_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(inner) => StoreError::Unavailable(inner.to_string().into()),
        StoreError::Backend(inner) => StoreError::Backend(inner.to_string().into()),
        StoreError::IdSpaceExhausted => StoreError::IdSpaceExhausted,
    }
}

impl LinkCache {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        settings: CacheSettings,
    ) -> Self {
        let slots = Cache::builder()
            .max_capacity(settings.max_bytes)
            .weigher(weigh)
            .expire_after(SlotExpiry { settings })
            .build();
        Self {
            slots,
            generations: (0..SHARDS).map(|_| AtomicU32::new(0)).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            store,
            metrics,
        }
    }

    fn generation(&self, code: &str) -> &AtomicU32 {
        let mut h = self.hasher.build_hasher();
        h.write(code.as_bytes());
        // SHARDS is a power of two, so the mask keeps the index in range.
        &self.generations[(h.finish() as usize) & (SHARDS - 1)]
    }

    /// The link with this code (`None`: no such link), from cache when possible.
    pub(crate) async fn get(&self, code: &str) -> Result<Option<CachedLink>, StoreError> {
        let generation = self.generation(code);
        if let Some(slot) = self.slots.get(code).await {
            if slot.generation == generation.load(Ordering::Acquire) {
                match slot.link {
                    Some(_) => self.metrics.cache_hit.inc(),
                    None => self.metrics.cache_negative_hit.inc(),
                };
                return Ok(slot.link);
            }
            self.slots.invalidate(code).await;
        }
        self.metrics.cache_miss.inc();
        loop {
            // Read the generation before the store: a write that lands after this load
            // bumps it, and the slot we are about to fill is then recognised as stale.
            let seen = generation.load(Ordering::Acquire);
            let store = self.store.clone();
            let reads = self.metrics.store_link_reads.clone();
            let key: Arc<str> = Arc::from(code);
            let owned = key.clone();
            let slot = self
                .slots
                .try_get_with(key, async move {
                    reads.inc();
                    let link = store.get_link(&owned).await?;
                    Ok::<_, StoreError>(Slot {
                        link: link.map(|l| to_cached(l, owned)),
                        generation: seen,
                    })
                })
                .await
                .map_err(|e| shared_error(&e))?;
            if slot.generation == generation.load(Ordering::Acquire) {
                return Ok(slot.link);
            }
            // We joined a read that started before a write to this code: read again.
            self.slots.invalidate(code).await;
        }
    }

    /// Called after every write to `code` has committed: no lookup from now on returns what
    /// was read before it.
    pub(crate) async fn invalidate(&self, code: &str) {
        self.generation(code).fetch_add(1, Ordering::AcqRel);
        self.slots.invalidate(code).await;
    }

    /// Entries and their weight, for the metrics.
    pub(crate) fn size(&self) -> (u64, u64) {
        (self.slots.entry_count(), self.slots.weighted_size())
    }
}
