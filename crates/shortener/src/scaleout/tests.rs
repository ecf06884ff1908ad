//! The shared parts against real Redis servers (standalone and a three-master Cluster)
//! started for each test.

use super::clickstream::{CLAIM_IDLE, ClickShipper, aggregate};
use super::l2::{Entry, Gone, L2};
use super::ratelimit::SharedLimits;
use super::redis::{Redis, RedisTarget, Unreachable};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::store::sqlite::SqliteStore;
use shortener_core::audit::Origin;
use shortener_core::day::Day;
use shortener_core::link::Link;
use shortener_core::store::ClickDelta;
use std::sync::Arc;
use std::time::Duration;
use testkit::{RedisCluster, RedisServer};

/// A handle with the background bound: these tests check ordering and counting, and a
/// freshly started server on a machine busy with builds may take longer than the request
/// path's 250 ms to accept (`an_unreachable_redis_fails_fast_then_is_retried` checks that one).
async fn connect(url: &str) -> Arc<Redis> {
    Arc::new(
        Redis::connect(
            &RedisTarget::parse(url).unwrap(),
            super::redis::BACKGROUND_TIMEOUT,
        )
        .await
        .unwrap(),
    )
}

fn at_version(url: &str, gone: Option<Gone>, version: u64) -> Entry {
    Entry::Link {
        long_url: url.to_owned(),
        expires_at: i64::MAX,
        gone,
        version,
    }
}

fn live(url: &str) -> Entry {
    at_version(url, None, 1)
}

#[test]
fn redis_targets_parse_or_say_why_not() {
    assert_eq!(
        RedisTarget::parse("redis://127.0.0.1:6379").unwrap(),
        RedisTarget::Standalone("redis://127.0.0.1:6379".to_owned())
    );
    assert_eq!(
        RedisTarget::parse("redis+cluster://127.0.0.1:7001,127.0.0.1:7002").unwrap(),
        RedisTarget::Cluster(vec![
            "redis://127.0.0.1:7001".to_owned(),
            "redis://127.0.0.1:7002".to_owned()
        ])
    );
    assert!(matches!(
        RedisTarget::parse("redis://a:1,redis://b:2").unwrap(),
        RedisTarget::Cluster(nodes) if nodes.len() == 2
    ));
    for bad in ["http://127.0.0.1:6379", "localhost", "redis+cluster://", ""] {
        let e = RedisTarget::parse(bad).unwrap_err().to_string();
        assert!(e.starts_with("invalid --redis"), "{bad}: {e}");
    }
}

async fn l2_never_lets_an_older_read_replace_a_later_write(redis: Arc<Redis>) {
    let l2 = L2::new(redis, Duration::from_secs(3600), Duration::from_secs(60));
    let now = crate::now();
    let disabled = at_version("https://example.com/", Some(Gone::Disabled), 2);
    let enabled = at_version("https://example.com/", None, 3);
    // The writer's create lands, then a reader's fill of what it saw before the create.
    l2.fill("abc", &live("https://example.com/"), now)
        .await
        .unwrap();
    l2.fill("abc", &Entry::Unknown, now).await.unwrap();
    assert_eq!(
        l2.get("abc", now).await.map(|f| f.entry),
        Some(live("https://example.com/"))
    );
    // The disable lands; a reader's stale live fill afterwards changes nothing.
    l2.fill("abc", &disabled, now).await.unwrap();
    l2.fill("abc", &live("https://example.com/"), now)
        .await
        .unwrap();
    assert_eq!(
        l2.get("abc", now).await.map(|f| f.entry),
        Some(disabled.clone())
    );
    // The enable lands (live again, a higher version); the stale disabled fill loses.
    l2.fill("abc", &enabled, now).await.unwrap();
    l2.fill("abc", &disabled, now).await.unwrap();
    assert_eq!(l2.get("abc", now).await.map(|f| f.entry), Some(enabled));
    // Unknown codes are remembered as such; a later create replaces that.
    l2.fill("new", &Entry::Unknown, now).await.unwrap();
    assert_eq!(
        l2.get("new", now).await.map(|f| f.entry),
        Some(Entry::Unknown)
    );
    l2.fill("new", &live("https://example.org/"), now)
        .await
        .unwrap();
    assert_eq!(
        l2.get("new", now).await.map(|f| f.entry),
        Some(live("https://example.org/"))
    );
    assert_eq!(l2.get("never", now).await.map(|f| f.entry), None);
}

async fn l2_keeps_links_past_their_ttl_marked_stale(redis: Arc<Redis>) {
    let hour = Duration::from_secs(3600);
    let l2 = L2::new(redis, hour, Duration::from_secs(60)).serving_stale_for(24 * hour);
    let now = crate::now();
    // Filled two hours ago: past its one-hour TTL, within its day of stale age.
    l2.fill("old", &live("https://example.com/old"), now - 7200)
        .await
        .unwrap();
    let found = l2.get("old", now).await.unwrap();
    assert_eq!(found.entry, live("https://example.com/old"));
    assert!(found.stale);
    l2.fill("old", &live("https://example.com/old"), now)
        .await
        .unwrap();
    assert!(!l2.get("old", now).await.unwrap().stale);
    // Unknown codes are never kept past their negative TTL, so never stale.
    l2.fill("gone", &Entry::Unknown, now - 7200).await.unwrap();
    assert!(l2.get("gone", now).await.is_none_or(|f| !f.stale));
}

async fn instances_share_one_create_budget(a: Arc<Redis>, b: Arc<Redis>) {
    let limits = [
        Arc::new(SharedLimits::new(a)),
        Arc::new(SharedLimits::new(b)),
    ];
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let limits = limits[i % 2].clone();
            tokio::spawn(async move { limits.check("anon:10.0.0.1", 10).await.unwrap() })
        })
        .collect();
    let mut allowed = 0;
    let mut remaining = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(budget) => {
                allowed += 1;
                remaining.push(budget.remaining);
            }
            Err(refused) => {
                // One cell of ten per hour comes back within six minutes.
                assert!(refused.retry_after <= Duration::from_secs(360));
                assert!(refused.retry_after > Duration::from_secs(300));
            }
        }
    }
    assert_eq!(allowed, 10, "exactly the budget, across both instances");
    remaining.sort_unstable();
    assert_eq!(remaining, (0..10).collect::<Vec<u32>>());
    // The remaining count is exact for limits that do not divide an hour evenly.
    let first = limits[0].check("anon:10.0.0.7", 7).await.unwrap().unwrap();
    assert_eq!(first.remaining, 6);
    // Another client has a budget of its own.
    assert!(limits[0].check("anon:10.0.0.2", 10).await.unwrap().is_ok());
}

fn link(code: &str) -> Link {
    Link {
        custom_alias: true,
        ..Link::new(code, "https://example.com/", 0, i64::MAX)
    }
}

async fn every_shipped_click_counts_once(redis: Arc<Redis>, other: Arc<Redis>) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).unwrap());
    store
        .insert_link(&link("promo"), &Origin::system("test"))
        .await
        .unwrap();
    let today = Day::from_unix(crate::now());
    let shippers = [
        ClickShipper::new(redis.clone()),
        ClickShipper::new(other.clone()),
    ];
    let mut expected = 0;
    for round in 0..50u64 {
        let shipper = &shippers[(round % 2) as usize];
        let batch = shipper.batch(vec![ClickDelta {
            code: "promo".into(),
            day: today,
            human: round + 1,
            bot: 1,
            people: Default::default(),
        }]);
        shipper.ship(&batch).await.unwrap();
        // A send whose answer was lost is sent again: still one batch.
        if round % 10 == 0 {
            shipper.ship(&batch).await.unwrap();
        }
        expected += round + 1;
    }
    // Two aggregators share the stream.
    let metrics = Arc::new(Metrics::new());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let aggregators = [
        tokio::spawn(aggregate(
            redis.clone(),
            store.clone(),
            metrics.clone(),
            "one".into(),
            CLAIM_IDLE,
            stopped.clone(),
        )),
        tokio::spawn(aggregate(
            other,
            store.clone(),
            metrics.clone(),
            "two".into(),
            CLAIM_IDLE,
            stopped,
        )),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stored = store.get_link("promo").await.unwrap().unwrap();
        if stored.bot_clicks == 50 {
            assert_eq!(stored.clicks, expected);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "clicks never arrived: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    for a in aggregators {
        a.await.unwrap();
    }
    assert_eq!(metrics.click_batches_applied.get(), 50);
    assert_eq!(metrics.click_batches_replayed.get(), 5);
    // Acknowledged entries are gone from the stream.
    let left: i64 = redis
        .query(redis::cmd("XLEN").arg("shortener:clicks"))
        .await
        .unwrap();
    assert_eq!(left, 0);
}

async fn a_dead_aggregators_batches_are_taken_over(redis: Arc<Redis>) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path()).unwrap());
    store
        .insert_link(&link("orphan"), &Origin::system("test"))
        .await
        .unwrap();
    let shipper = ClickShipper::new(redis.clone());
    for _ in 0..5 {
        let batch = shipper.batch(vec![ClickDelta {
            code: "orphan".into(),
            day: Day::from_unix(crate::now()),
            human: 1,
            bot: 0,
            people: Default::default(),
        }]);
        shipper.ship(&batch).await.unwrap();
    }
    // An aggregator reads them all, then dies before applying or acknowledging anything.
    let _: redis::Value = redis
        .query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg("shortener:clicks")
                .arg("aggregators")
                .arg("0")
                .arg("MKSTREAM"),
        )
        .await
        .or_else(|e| match e {
            Unreachable::Failed(e) if e.code() == Some("BUSYGROUP") => Ok(redis::Value::Nil),
            e => Err(e),
        })
        .unwrap();
    let _: redis::Value = redis
        .query(
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("aggregators")
                .arg("ghost")
                .arg("STREAMS")
                .arg("shortener:clicks")
                .arg(">"),
        )
        .await
        .unwrap();
    // Another one, under another name, claims them once they have been idle long enough.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let live = tokio::spawn(aggregate(
        redis.clone(),
        store.clone(),
        Arc::new(Metrics::new()),
        "live".into(),
        Duration::from_millis(100),
        stopped,
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.get_link("orphan").await.unwrap().unwrap().clicks < 5 {
        assert!(tokio::time::Instant::now() < deadline, "never taken over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    live.await.unwrap();
    assert_eq!(store.get_link("orphan").await.unwrap().unwrap().clicks, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_redis() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path()).unwrap();
    let (a, b) = (connect(&server.url()).await, connect(&server.url()).await);
    l2_never_lets_an_older_read_replace_a_later_write(a.clone()).await;
    l2_keeps_links_past_their_ttl_marked_stale(a.clone()).await;
    instances_share_one_create_budget(a.clone(), b.clone()).await;
    every_shipped_click_counts_once(a.clone(), b).await;
    a_dead_aggregators_batches_are_taken_over(a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(dir.path()).unwrap();
    let (a, b) = (connect(&cluster.url()).await, connect(&cluster.url()).await);
    l2_never_lets_an_older_read_replace_a_later_write(a.clone()).await;
    l2_keeps_links_past_their_ttl_marked_stale(a.clone()).await;
    instances_share_one_create_budget(a.clone(), b.clone()).await;
    every_shipped_click_counts_once(a, b).await;
}

#[tokio::test]
async fn an_unreachable_redis_fails_fast_then_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RedisServer::start(dir.path()).unwrap();
    let redis = connect(&server.url()).await;
    assert!(redis.is_up());
    server.stop();
    let first = redis.query::<String>(&redis::cmd("PING")).await;
    assert!(first.is_err());
    assert!(!redis.is_up());
    // While the breaker is open, callers do not wait for a timeout.
    assert!(matches!(
        redis.query::<String>(&redis::cmd("PING")).await,
        Err(Unreachable::BreakerOpen)
    ));
    server.restart().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while redis.query::<String>(&redis::cmd("PING")).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(redis.is_up());
}
