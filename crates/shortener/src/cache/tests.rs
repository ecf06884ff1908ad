//! The cache's tests: lifetimes, rooms and weights, the idle sweep, the shelf (on a real embedded
//! store where one is needed).

use super::*;

const SETTINGS: CacheSettings = CacheSettings {
    max_bytes: 1 << 20,
    ttl: Duration::from_secs(300),
    negative_ttl: Duration::from_secs(60),
    stale_max_age: Duration::from_secs(86_400),
};
const NOW: UnixSeconds = 1_700_000_000;

/// What a redirect gets for `code`: the cache's answer, else the store's.
async fn get(
    cache: &LinkCache,
    code: &str,
    now: UnixSeconds,
) -> Result<Option<CachedLink>, StoreError> {
    match cache.cached(code, now) {
        Some(answer) => Ok(answer),
        None => cache.read(code, now).await,
    }
}

fn link(expires_at: UnixSeconds, disabled: bool) -> CachedLink {
    CachedLink {
        code: SmolStr::new("abcdefg"),
        location: Some(HeaderValue::from_static("https://example.com/")),
        expires_at,
        gone: disabled.then_some(Gone::Disabled),
        version: 1,
    }
}

#[test]
fn a_live_link_is_kept_its_ttl_but_never_past_its_expiry() {
    let far = link(NOW + 86_400, false);
    assert_eq!(SETTINGS.fresh_until(Some(&far), NOW), NOW + 300);
    let soon = link(NOW + 10, false);
    assert_eq!(SETTINGS.fresh_until(Some(&soon), NOW), NOW + 10);
}

#[test]
fn unknown_and_expired_codes_get_the_negative_ttl_disabled_ones_the_full_ttl() {
    assert_eq!(SETTINGS.fresh_until(None, NOW), NOW + 60);
    assert_eq!(SETTINGS.fresh_until(Some(&link(NOW, false)), NOW), NOW + 60);
    assert_eq!(
        SETTINGS.fresh_until(Some(&link(NOW - 5, true)), NOW),
        NOW + 300
    );
}

#[test]
fn unknown_codes_expire_spread_over_the_last_quarter_of_the_negative_ttl() {
    let (_dir, _store, cache) = cache_on_sqlite();
    let ends: std::collections::BTreeSet<UnixSeconds> = (0..1000)
        .map(|i| SETTINGS.unknown_until(cache.hash(&format!("code{i:03}")), NOW))
        .collect();
    assert!(
        ends.iter().all(|end| (NOW + 45..=NOW + 60).contains(end)),
        "{ends:?}"
    );
    // Every second of the last quarter ends some of them: no second takes the whole sweep.
    assert_eq!(ends.len(), 16, "{ends:?}");
    // Codes that share a first bucket of negatives (a bucket's ways) expire apart as well.
    let mut by_bucket: std::collections::HashMap<u64, std::collections::BTreeSet<UnixSeconds>> =
        std::collections::HashMap::new();
    for i in 0..20_000 {
        let hash = cache.hash(&format!("code{i:05}"));
        by_bucket
            .entry((hash >> 32) & 0xFF)
            .or_default()
            .insert(SETTINGS.unknown_until(hash, NOW));
    }
    assert!(
        by_bucket.values().all(|ends| ends.len() > 8),
        "{by_bucket:?}"
    );
    let one_second = CacheSettings {
        negative_ttl: Duration::from_secs(1),
        ..SETTINGS
    };
    assert_eq!(one_second.unknown_until(u64::MAX, NOW), NOW + 1);
}

#[test]
fn links_stay_servable_stale_for_the_stale_age_but_never_past_expiry_unknowns_never() {
    let far = SETTINGS.slot(Some(link(NOW + 10 * 86_400, false)), 0, NOW);
    assert_eq!(far.stale_until, NOW + 300 + 86_400);
    let soon = SETTINGS.slot(Some(link(NOW + 1000, false)), 0, NOW);
    assert_eq!(soon.stale_until, NOW + 1000);
    let capped = SETTINGS.slot(Some(link(NOW + 10, false)), 0, NOW);
    assert_eq!(capped.stale_until, NOW + 10);
    let disabled = SETTINGS.slot(Some(link(NOW - 5, true)), 0, NOW);
    assert_eq!(disabled.stale_until, NOW + 300 + 86_400);
    assert_eq!(SETTINGS.slot(None, 0, NOW).stale_until, NOW + 60);
    let expired = SETTINGS.slot(Some(link(NOW, false)), 0, NOW);
    assert_eq!(expired.stale_until, expired.fresh_until);
}

/// A cache of [`SETTINGS`] (1 MiB: a packed room of 512 buckets, 3 584 codes) in front of
/// a fresh embedded store, and the directory that holds the store.
fn cache_on_sqlite() -> (tempfile::TempDir, Arc<dyn Store>, LinkCache) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
    let cache = LinkCache::new(store.clone(), None, Arc::new(Metrics::new()), SETTINGS).unwrap();
    (dir, store, cache)
}

/// Writes a link of `code` straight to `store`, as another process would: no note polled and
/// no announcement heard here.
async fn create_elsewhere(store: &dyn Store, code: &str, now: UnixSeconds) {
    let origin = shortener_core::audit::Origin::system("test");
    let link = Link::new(code, "https://example.com/", now, now + 86_400);
    store.insert_link(&link, &origin).await.unwrap();
}

/// [`cache_on_sqlite`] with a link of `code` in the store, read once through the cache;
/// the link as read, and when.
async fn cache_holding(code: &str) -> (tempfile::TempDir, LinkCache, CachedLink, UnixSeconds) {
    let (dir, store, cache) = cache_on_sqlite();
    let now = crate::now();
    create_elsewhere(&*store, code, now).await;
    let read = get(&cache, code, now).await.unwrap().unwrap();
    (dir, cache, read, now)
}

#[tokio::test]
async fn a_sweep_of_unknown_codes_evicts_no_live_link() {
    let (_dir, store, cache) = cache_on_sqlite();
    let now = crate::now();
    let codes: Vec<String> = (0..50).map(|i| format!("live{i:03}")).collect();
    for code in &codes {
        create_elsewhere(&*store, code, now).await;
        assert!(get(&cache, code, now).await.unwrap().is_some());
    }
    // Far more unknown codes than their rooms hold, packed and long: more than the links'
    // room would hold too, were they kept there.
    for i in 0..5_000 {
        for code in [format!("nope{i:04}"), format!("nope{i:04}-a-long-alias")] {
            assert!(get(&cache, &code, now).await.unwrap().is_none());
        }
    }
    for code in &codes {
        assert!(
            cache.slots.peek(code.as_str()).is_some(),
            "{code} was evicted"
        );
    }
    // And the last unknown codes are answered from their own rooms.
    let reads = cache.metrics.store_link_reads.get();
    for code in ["nope4999", "nope4999-a-long-alias"] {
        assert!(get(&cache, code, now).await.unwrap().is_none());
    }
    assert_eq!(cache.metrics.store_link_reads.get(), reads);
}

#[tokio::test]
async fn unknown_codes_short_or_long_are_remembered_until_a_write_to_them() {
    let (_dir, store, cache) = cache_on_sqlite();
    let now = crate::now();
    // Packed (up to 10 characters) and a long alias's room.
    for code in ["abcdefg", "a-much-longer-alias"] {
        assert!(get(&cache, code, now).await.unwrap().is_none());
        let reads = cache.metrics.store_link_reads.get();
        assert!(matches!(cache.cached(code, now), Some(None)));
        assert!(get(&cache, code, now).await.unwrap().is_none());
        assert_eq!(cache.metrics.store_link_reads.get(), reads);
        // Past its time the store is asked again.
        assert!(cache.cached(code, now + 60).is_none());

        create_elsewhere(&*store, code, now).await;
        cache.invalidate(code);
        assert!(cache.cached(code, now).is_none());
        assert!(get(&cache, code, now).await.unwrap().is_some());
    }
}

#[tokio::test]
async fn unknown_codes_asked_for_late_in_their_lifetime_are_read_again_off_the_request_path() {
    let (_dir, _store, cache) = cache_on_sqlite();
    let codes = ["nope001", "a-much-longer-alias"];
    for code in codes {
        assert!(get(&cache, code, NOW).await.unwrap().is_none());
    }
    let until = |code: &str| SETTINGS.unknown_until(cache.hash(code), NOW);
    let reads = cache.metrics.store_link_reads.get();
    // Before the last quarter of their lifetime, a lookup queues nothing.
    for code in codes {
        assert!(matches!(cache.cached(code, until(code) - 16), Some(None)));
    }
    assert_eq!(cache.renew_unknown(NOW).await.unwrap(), 0);
    // In it, the first lookup queues the code, the next ones find it claimed.
    for code in codes {
        for _ in 0..3 {
            assert!(matches!(cache.cached(code, until(code) - 15), Some(None)));
        }
    }
    let renewed_at = NOW + 50;
    assert_eq!(cache.renew_unknown(renewed_at).await.unwrap(), 2);
    assert_eq!(cache.metrics.cache_renewals.get(), 2);
    // Past their first lifetime, each is still answered from the cache: no read on a
    // request's path. Read, a code's claim was given back: the last quarter of its new
    // lifetime queues it again.
    let renewed_until = |code: &str| SETTINGS.unknown_until(cache.hash(code), renewed_at);
    for code in codes {
        assert!(matches!(cache.cached(code, until(code) + 1), Some(None)));
        assert!(matches!(
            cache.cached(code, renewed_until(code) - 1),
            Some(None)
        ));
    }
    assert_eq!(cache.metrics.store_link_reads.get(), reads);
    let again = NOW + 100;
    assert_eq!(cache.renew_unknown(again).await.unwrap(), 2);
    for code in codes {
        assert!(matches!(
            cache.cached(code, renewed_until(code)),
            Some(None)
        ));
        let last = SETTINGS.unknown_until(cache.hash(code), again);
        assert!(cache.cached(code, last).is_none());
    }
}

#[tokio::test]
async fn a_renewal_that_finds_the_code_created_elsewhere_forgets_it() {
    let (_dir, store, cache) = cache_on_sqlite();
    let now = crate::now();
    for code in ["latecomer", "a-late-long-alias"] {
        assert!(get(&cache, code, now).await.unwrap().is_none());
        let until = SETTINGS.unknown_until(cache.hash(code), now);
        assert!(matches!(cache.cached(code, until - 1), Some(None)));
        // Another process creates it: no write here, no note polled yet.
        create_elsewhere(&*store, code, now).await;
        assert_eq!(cache.renew_unknown(until - 1).await.unwrap(), 1);
        assert!(cache.cached(code, until - 1).is_none());
        assert!(get(&cache, code, until - 1).await.unwrap().is_some());
    }
}

/// A cache of [`SETTINGS`] in front of a fresh embedded store, with an L2 in a Redis started
/// for the test: the directory (store and Redis), the server, the store, L2 and the cache.
pub(crate) async fn cache_on_sqlite_and_redis() -> (
    tempfile::TempDir,
    testkit::RedisServer,
    Arc<dyn Store>,
    Arc<L2>,
    LinkCache,
) {
    use crate::scaleout::redis::{BACKGROUND_TIMEOUT, Redis, RedisTarget};
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::RedisServer::start(dir.path()).unwrap();
    let target = RedisTarget::parse(&server.url()).unwrap();
    let redis = Arc::new(Redis::connect(&target, BACKGROUND_TIMEOUT).await.unwrap());
    let l2 = Arc::new(L2::new(
        redis.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ));
    let store: Arc<dyn Store> =
        Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
    let shared = SharedLayer {
        l2: l2.clone(),
        invalidations: Arc::new(Invalidations::new(redis, l2.clone())),
    };
    let cache = LinkCache::new(
        store.clone(),
        Some(shared),
        Arc::new(Metrics::new()),
        SETTINGS,
    )
    .unwrap();
    (dir, server, store, l2, cache)
}

/// In the scale-out mode a renewal reads as a miss does: a fresh L2 entry first (no store
/// read), the store for the rest, whose answers fill L2 for the other instances.
#[tokio::test]
async fn a_renewal_in_the_scale_out_mode_reads_l2_first_and_fills_it() {
    let (_dir, _redis, store, l2, cache) = cache_on_sqlite_and_redis().await;
    let now = crate::now();
    // Remembered as unknown here (by hand: a miss's L2 fill would race the ones below).
    let codes = ["l2known", "l2unkn"];
    for code in codes {
        let hash = cache.hash(code);
        let negative = SETTINGS.unknown(hash, 0, now);
        cache.remember_unknown(&SmolStr::new(code), hash, negative, now);
    }
    // Another instance created the first: the store has it, and its writer put it in L2.
    create_elsewhere(&*store, "l2known", now).await;
    let created = l2::Entry::of_target(store.redirect_target("l2known").await.unwrap());
    l2.fill("l2known", &created, now).await.unwrap();

    for code in codes {
        let until = SETTINGS.unknown_until(cache.hash(code), now);
        assert!(matches!(cache.cached(code, until - 1), Some(None)));
    }
    let later = now + 30;
    assert_eq!(cache.renew_unknown(later).await.unwrap(), 2);
    assert_eq!(
        cache.metrics.cache_renewals.get(),
        1,
        "one read of the store"
    );
    assert!(
        cache.cached("l2known", later).is_none(),
        "L2 said it exists"
    );
    let filled = l2.get("l2unkn", later).await.unwrap();
    assert!(matches!(filled.entry, l2::Entry::Unknown) && !filled.stale);
    let until = SETTINGS.unknown_until(cache.hash("l2unkn"), now);
    assert!(matches!(cache.cached("l2unkn", until + 1), Some(None)));
}

#[tokio::test]
async fn a_late_note_of_a_change_already_read_keeps_the_shelved_stand_in() {
    let (_dir, cache, read, now) = cache_holding("shelved").await;
    // Past its TTL a lookup moves the entry to the shelf (the store is asked next).
    assert!(cache.cached("shelved", now + 301).is_none());
    assert!(cache.slots.peek("shelved").is_none());
    // The change sequence reports the create this instance read: the stand-in stays.
    cache
        .changed_elsewhere(&[note("shelved", read.version)])
        .await
        .unwrap();
    assert!(cache.shelf.peek("shelved").is_some());
    // A later version is news: forgotten.
    cache
        .changed_elsewhere(&[note("shelved", read.version + 1)])
        .await
        .unwrap();
    assert!(cache.shelf.peek("shelved").is_none());
}

#[tokio::test]
async fn a_forgotten_entry_is_shelved_unless_a_later_read_replaced_it() {
    let (_dir, cache, _, now) = cache_holding("shelve1").await;
    let first = cache.slots.peek("shelve1").unwrap();
    // A later read's entry in its place: the older copy is not left on the shelf.
    let later = cache
        .settings
        .slot(first.link.clone(), first.generation, now + 1);
    cache.slots.insert(SmolStr::new("shelve1"), later.clone());
    cache.forget("shelve1", &first, now + 301);
    assert!(cache.shelf.peek("shelve1").is_none());
    assert!(cache.slots.peek("shelve1").is_some());
    // Forgotten itself: shelved, and out of the slots.
    cache.forget("shelve1", &later, now + 302);
    assert!(cache.slots.peek("shelve1").is_none());
    let shelved = cache.shelf.peek("shelve1").unwrap();
    assert_eq!(shelved.fresh_until, later.fresh_until);
}

#[tokio::test]
async fn a_long_alias_is_one_allocation_for_the_key_its_link_and_the_shelf() {
    let alias = "a-twenty-nine-char-long-alias";
    let (_dir, cache, read, now) = cache_holding(alias).await;
    assert!(read.code.is_heap_allocated());
    let at = |code: &SmolStr| code.as_str().as_ptr();
    let (key, slot) = cache.slots.iter().next().unwrap();
    assert_eq!(key, alias);
    assert_eq!(at(&key), at(&read.code));
    assert_eq!(at(&slot.link.as_ref().unwrap().code), at(&read.code));
    // Shelved under the link's own code, not a copy the weigher would not count.
    cache.forget(alias, &slot, now + 301);
    let (key, _) = cache.shelf.iter().next().unwrap();
    assert_eq!(at(&key), at(&read.code));
}

/// A change note of `code` reaching `version`.
fn note(code: &str, version: u64) -> shortener_core::store::ChangeNote {
    shortener_core::store::ChangeNote {
        seq: 1,
        code: code.to_owned(),
        version,
    }
}

/// Fills `cache`'s links' room to 95 % with entries read at [`NOW`]; the codes it kept.
fn fill_read_at_now(cache: &LinkCache) -> Vec<SmolStr> {
    let mut codes = Vec::new();
    for i in 0.. {
        if cache.slots.weight() >= cache.slots.capacity() / 100 * 95 {
            break;
        }
        let code = SmolStr::new(format!("c{i:06}"));
        let slot = SETTINGS.slot(Some(link(NOW + 9_000, false)), 0, NOW);
        cache.slots.insert(code.clone(), slot);
        codes.push(code);
    }
    // Those quick_cache's shards kept.
    codes.retain(|c| cache.slots.peek(c.as_str()).is_some());
    codes
}

fn held(cache: &LinkCache, codes: &[SmolStr]) -> usize {
    codes
        .iter()
        .filter(|c| cache.slots.peek(c.as_str()).is_some())
        .count()
}

#[tokio::test]
async fn a_sweep_drops_entries_unread_for_a_minute_once_the_room_is_nearly_full() {
    let (_dir, _store, cache) = cache_on_sqlite();
    let first = SmolStr::new("first");
    let slot = SETTINGS.slot(Some(link(NOW + 9_000, false)), 0, NOW);
    cache.slots.insert(first.clone(), slot);
    // Far from full: nothing goes, however long unread.
    cache.drop_idle(NOW + 600);
    assert_eq!(held(&cache, &[first]), 1);
    cache.slots.clear();

    let codes = fill_read_at_now(&cache);
    let (read, unread) = codes.split_at(codes.len() / 2);
    for code in read {
        assert!(cache.cached(code, NOW + 59).is_some());
    }
    // A peek is no read.
    for code in unread {
        assert!(cache.slots.peek(code.as_str()).is_some());
    }
    cache.drop_idle(NOW + 60);
    assert_eq!(held(&cache, read), read.len());
    assert_eq!(held(&cache, unread), 0);
}

#[tokio::test]
async fn lookups_racing_sweeps_leave_their_read_on_the_entry_kept() {
    let (_dir, _store, cache) = cache_on_sqlite();
    let codes = fill_read_at_now(&cache);
    let (read, unread) = codes.split_at(codes.len() / 2);
    for code in read {
        assert!(cache.cached(code, NOW + 50).is_some());
    }
    std::thread::scope(|s| {
        for chunk in read.chunks(read.len() / 4 + 1) {
            let cache = &cache;
            s.spawn(move || {
                for _ in 0..5 {
                    for code in chunk {
                        assert!(cache.cached(code, NOW + 100).is_some());
                    }
                }
            });
        }
        // Entries read at +50 stay through these; those never read go.
        s.spawn(|| {
            for _ in 0..50 {
                cache.drop_idle(NOW + 100);
            }
        });
    });
    assert_eq!(held(&cache, unread), 0);
    // And every racing lookup's read landed on the entry the cache keeps.
    for code in read {
        let slot = cache.slots.peek(code.as_str()).unwrap();
        assert_eq!(slot.read_at.into_inner(), seconds_u32(NOW + 100), "{code}");
    }
}

#[test]
fn entries_weigh_what_quick_cache_keeps_for_them() {
    // One shard and a power of two of entries: the slab's capacity is its length.
    let options = quick_cache::OptionsBuilder::new()
        .shards(1)
        .estimated_items_capacity(1024)
        .weight_capacity(u64::MAX)
        .build()
        .unwrap();
    let cache: Cache<SmolStr, Slot, SlotWeigher> = Cache::with_options(
        options,
        SlotWeigher,
        quick_cache::DefaultHashBuilder::default(),
        quick_cache::sync::DefaultLifecycle::default(),
    );
    let n = 1024;
    for i in 0..n {
        let code = SmolStr::new(format!("c{i:06}"));
        cache.insert(code, SETTINGS.slot(Some(link(NOW + 1, false)), 0, NOW));
    }
    assert_eq!(cache.len(), n);
    let used = cache.memory_used();
    // A slab slot is the key, the value and 16 bytes; the index takes 5 bytes a bucket,
    // at 1.14 to 2.3 buckets an entry (8 on average over its growth).
    assert_eq!(used.entries / n, size_of::<(SmolStr, Slot)>() + 16);
    assert!((6..=12).contains(&(used.map / n)), "{}", used.map / n);
    assert_eq!(CACHE_EXTRA, 16 + 8);
    // The read stamp sits in what was padding after the generation.
    assert_eq!(size_of::<Slot>(), size_of::<Option<CachedLink>>() + 3 * 8);
    // And the weight adds the destination and `Bytes`' header; a code too long to be inline,
    // its `Arc` (two counts and the bytes).
    let slot = SETTINGS.slot(Some(link(NOW + 1, false)), 0, NOW);
    let inline = (size_of::<(SmolStr, Slot)>() + CACHE_EXTRA + 24 + 24) as u64;
    assert_eq!(SlotWeigher.weight(&SmolStr::new("abcdefg"), &slot), inline);
    let alias = SmolStr::new("a-thirty-character-long-alias!");
    assert!(alias.is_heap_allocated());
    assert_eq!(SlotWeigher.weight(&alias, &slot), inline + 48);
    // `TYPICAL_ENTRY`, what the rooms are sized by: a seven-character code's link to a 60-byte
    // destination.
    let sixty = HeaderValue::from_str(&format!("https://example.com/{}", "x".repeat(40))).unwrap();
    let typical = CachedLink {
        location: Some(sixty),
        ..link(NOW + 1, false)
    };
    let slot = SETTINGS.slot(Some(typical), 0, NOW);
    assert_eq!(
        SlotWeigher.weight(&SmolStr::new("abcdefg"), &slot),
        TYPICAL_ENTRY
    );
}

#[test]
fn allocations_round_up_to_the_allocators_size_classes() {
    let sizes = [
        (1, 8),
        (23, 24),
        (64, 64),
        (65, 80),
        (96, 96),
        (129, 160),
        (700, 768),
    ];
    for (bytes, block) in sizes {
        assert_eq!(allocation(bytes), block, "{bytes}");
    }
}
