//! The scale-out mode end to end: shortener processes and aggregators sharing one real
//! PostgreSQL and one real Redis (standalone, or a three-master Cluster) started for the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::{
    BIN, Shortener, client, create, eventually, follow, metric, readiness, run, today_utc,
    token_in, until_status,
};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::{Process, RedisCluster, RedisServer};

/// `serve` on PostgreSQL and Redis.
fn serve(dir: &TempDir, db: &TestDb, redis: &str, extra: &[&str]) -> Shortener {
    let mut flags = vec![
        "--database",
        &db.url,
        "--redis",
        redis,
        "--click-flush-ms",
        "200",
    ];
    flags.extend_from_slice(extra);
    Shortener::start(dir.path(), &flags)
}

fn aggregator(db: &TestDb, redis: &str, name: &str) -> Process {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "aggregate",
        "--database",
        &db.url,
        "--redis",
        redis,
        "--consumer",
        name,
    ])
    .env_remove("SHORTENER_DATABASE")
    .env("SHORTENER_LOG", "warn");
    let mut process = Process::spawn(name, cmd).unwrap();
    process
        .wait_for_line("aggregating as", Duration::from_secs(60))
        .unwrap();
    process
}

/// (people, bots) clicks: link totals, and today's daily rows, straight from PostgreSQL.
async fn stored_clicks(db: &TestDb) -> ((i64, i64), (i64, i64)) {
    let pg = db.client().await;
    let totals = pg
        .query_one(
            "SELECT COALESCE(SUM(clicks), 0)::BIGINT, COALESCE(SUM(bot_clicks), 0)::BIGINT FROM counted_links",
            &[],
        )
        .await
        .unwrap();
    let daily = pg
        .query_one(
            "SELECT COALESCE(SUM(clicks), 0)::BIGINT, COALESCE(SUM(bot_clicks), 0)::BIGINT FROM click_days",
            &[],
        )
        .await
        .unwrap();
    ((totals.get(0), totals.get(1)), (daily.get(0), daily.get(1)))
}

/// Deletes `code` as the admin; the status.
async fn delete(c: &reqwest::Client, server: &Shortener, code: &str, admin: &str) -> StatusCode {
    c.delete(server.url(&format!("/api/v1/links/{code}")))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .status()
}

/// Redirects `code` on `server` until it answers `status`, failing past one second: the
/// bound the issue sets on invalidation across instances.
async fn within_a_second(c: &reqwest::Client, server: &Shortener, code: &str, status: StatusCode) {
    let since = Instant::now();
    loop {
        let got = follow(c, server, code).await;
        if got == status {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(1),
            "{code} still answers {got} instead of {status} after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_and_an_aggregator_count_exactly_and_see_each_others_writes() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let redis = RedisServer::start(dir.path()).unwrap();
    let admin = token_in(&["--database", &db.url], "ops", true);
    // 32 creates in flight on a shared 2-core machine: the default 250 ms store deadline
    // would turn commit queues into 503s, which this test of counting is not about.
    let patient = ["--no-aggregator", "--store-timeout-ms", "10000"];
    let a = serve(&dir, &db, &redis.url(), &patient);
    let b = serve(&dir, &db, &redis.url(), &patient);
    let mut agg = aggregator(&db, &redis.url(), "agg-1");
    let c = client();
    let servers = [&a, &b];

    // 10 000 creates split over both instances: every code distinct.
    let codes: Vec<String> = futures_util::stream::iter(0..10_000)
        .map(|i| {
            let (c, admin, server) = (c.clone(), admin.clone(), servers[i % 2]);
            async move {
                let resp = create(
                    &c,
                    server,
                    json!({"long_url": format!("https://example.com/{i}")}),
                    Some(&admin),
                )
                .await;
                assert_eq!(resp.status(), StatusCode::CREATED);
                let body: Value = resp.json().await.unwrap();
                body["short_code"].as_str().unwrap().to_owned()
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(codes.iter().collect::<HashSet<_>>().len(), 10_000);

    // Every link redirects on both (HEAD: counted as bots, apart from the people below).
    futures_util::stream::iter(codes.iter().flat_map(|code| servers.map(|s| (s, code))))
        .for_each_concurrent(32, |(server, code)| {
            let c = c.clone();
            async move {
                let resp = c
                    .head(server.url(&format!("/{code}")))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::FOUND, "{code}");
            }
        })
        .await;

    // 20 000 redirects by people spread over both; the aggregator is killed with -9 in the
    // middle of the second half and restarted under the same name.
    let hot = &codes[..200];
    let spread = |range: std::ops::Range<usize>| {
        let c = c.clone();
        futures_util::stream::iter(range).for_each_concurrent(32, move |i| {
            let (c, code, server) = (c.clone(), &hot[i % hot.len()], servers[i % 2]);
            async move { assert_eq!(follow(&c, server, code).await, StatusCode::FOUND) }
        })
    };
    spread(0..10_000).await;
    // Killed while batches of the second half stream in and get applied.
    let kill_mid_stream = async {
        eventually("the aggregator applying the second half", || async {
            stored_clicks(&db).await.0.0 > 11_000
        })
        .await;
        agg.kill();
    };
    tokio::join!(spread(10_000..20_000), kill_mid_stream);
    let _agg = aggregator(&db, &redis.url(), "agg-1");
    eventually("every click applied", || async {
        stored_clicks(&db).await.0 == (20_000, 20_000)
    })
    .await;
    let ((people, bots), (daily_people, daily_bots)) = stored_clicks(&db).await;
    assert_eq!((people, bots), (20_000, 20_000));
    assert_eq!(
        (daily_people, daily_bots),
        (20_000, 20_000),
        "daily rows agree"
    );
    let pg = db.client().await;
    let days: Vec<i32> = pg
        .query("SELECT DISTINCT day FROM click_days", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(days.len(), 1, "one UTC day");
    let analytics: Value = c
        .get(b.url(&format!("/api/v1/links/{}/analytics", hot[0])))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(analytics["total_clicks"], 100);
    assert_eq!(analytics["bot_clicks"], 2);
    assert_eq!(
        analytics["daily_clicks"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["date"],
        today_utc()
    );

    // A delete on A: B, which has the link in its cache, answers 410 within a second.
    let victim = &codes[500];
    assert_eq!(follow(&c, &b, victim).await, StatusCode::FOUND);
    assert_eq!(delete(&c, &a, victim, &admin).await, StatusCode::NO_CONTENT);
    within_a_second(&c, &b, victim, StatusCode::GONE).await;
    // A create on B: A, which remembered the alias as unknown, redirects within a second.
    assert_eq!(follow(&c, &a, "late-alias").await, StatusCode::NOT_FOUND);
    let resp = create(
        &c,
        &b,
        json!({"long_url": "https://example.com/late", "custom_alias": "late-alias"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    within_a_second(&c, &a, "late-alias", StatusCode::FOUND).await;
    let ready = readiness(&c, &a).await.1;
    assert_eq!(ready["status"], "ready", "{ready}");
}

/// An import by the CLI tells no instance: they learn of it from the change sequence, and the
/// first to poll puts every imported link into L2, over an "unknown" L2 held before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_by_the_cli_reaches_l2_through_the_change_poll() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let redis = RedisServer::start(dir.path()).unwrap();
    let r = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // What an instance that was asked for the alias before the import put there.
    let () = redis::cmd("SET")
        .arg("shortener:link:imported-alias")
        .arg("v0|u")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut r.clone())
        .await
        .unwrap();

    // Batches of 500, 1 000 and 1 001 links: notes of 500, 1 000, 1 000 and 1 codes, numbered
    // by the instance's first poll, which reads the first two together (more than it checks
    // in L2 at once) and the last two next.
    let file = dir.path().join("links.csv");
    let mut text = String::from("https://example.com/alias,imported-alias\n");
    for i in 0..2_500 {
        text.push_str(&format!("https://example.com/{i}\n"));
    }
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    let args = ["import", file, "--user", "ops", "--batch", "4000"];
    let out = run(&[&args[..], &["--database", &db.url]].concat(), &[]);
    assert!(out.status.success(), "{out:?}");

    let server = serve(&dir, &db, &redis.url(), &["--no-aggregator"]);
    until_status(&client(), &server, "imported-alias", StatusCode::FOUND).await;
    let links: Vec<(String, String)> = db
        .client()
        .await
        .query("SELECT code, long_url FROM links", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(links.len(), 2_501);
    let keys: Vec<String> = links
        .iter()
        .map(|(code, _)| format!("shortener:link:{code}"))
        .collect();
    eventually("every imported link in L2, at version 1", || {
        let (keys, links, mut r) = (&keys, &links, r.clone());
        async move {
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(keys)
                .query_async(&mut r)
                .await
                .unwrap();
            values.iter().zip(links).all(|(value, (_, long_url))| {
                value
                    .as_deref()
                    .is_some_and(|v| v.starts_with("v1|l|") && v.ends_with(&format!("|{long_url}")))
            })
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_redis_an_instance_degrades_and_recovers() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let mut redis = RedisServer::start(dir.path()).unwrap();
    let admin = token_in(&["--database", &db.url], "ops", true);
    let server = serve(&dir, &db, &redis.url(), &["--click-queue", "500"]);
    let other = serve(&dir, &db, &redis.url(), &["--no-aggregator"]);
    let c = client();
    for alias in ["cached", "cold"] {
        let resp = create(
            &c,
            &server,
            json!({"long_url": format!("https://example.com/{alias}"), "custom_alias": alias}),
            Some(&admin),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    assert_eq!(follow(&c, &server, "cached").await, StatusCode::FOUND);
    assert_eq!(follow(&c, &other, "cached").await, StatusCode::FOUND);
    eventually("the clicks counted", || async {
        stored_clicks(&db).await.0.0 == 2
    })
    .await;

    redis.stop();
    // Redirects: from L1, and from PostgreSQL for what L1 does not hold.
    assert_eq!(follow(&c, &server, "cached").await, StatusCode::FOUND);
    assert_eq!(follow(&c, &server, "cold").await, StatusCode::FOUND);
    // Creates: with the local limiter.
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/while-down"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert!(resp.headers().contains_key("ratelimit-remaining"));
    let ready = readiness(&c, &server).await.1;
    assert_eq!(ready["status"], "degraded", "{ready}");
    assert_eq!(ready["redis"], "unreachable");

    // Clicks wait while Redis is away; past the queue, they are dropped and counted.
    futures_util::stream::iter(0..3_000)
        .for_each_concurrent(32, |_| {
            let c = c.clone();
            let server = &server;
            async move { assert_eq!(follow(&c, server, "cached").await, StatusCode::FOUND) }
        })
        .await;
    let dropped = metric(&c, &server, "shortener_click_events_dropped_total").await as i64;
    assert!(dropped > 0, "a 500-event queue cannot hold 3 000 clicks");

    // A delete while Redis is away: the other instance cannot hear of it yet.
    assert_eq!(
        delete(&c, &server, "cached", &admin).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(follow(&c, &server, "cached").await, StatusCode::GONE);

    redis.restart().unwrap();
    // Once Redis is back, the delete is announced (or the other instance, resubscribing,
    // drops its cache): it answers 410 too.
    // (HEAD: polling must not add people's clicks.)
    eventually("the other instance sees the delete", || async {
        let resp = c.head(other.url("/cached")).send().await.unwrap();
        resp.status() == StatusCode::GONE
    })
    .await;
    eventually("ready again", || async {
        readiness(&c, &server).await.1["status"] == "ready"
    })
    .await;
    // Everything not dropped arrives: 2 before the outage, 2 then 3 000 during it, less drops.
    eventually("the buffered clicks applied", || async {
        stored_clicks(&db).await.0.0 == 3_004 - dropped
    })
    .await;
    assert_eq!(
        stored_clicks(&db).await.0.0,
        3_004 - dropped,
        "exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_redis_cluster_instances_share_links_limits_and_clicks() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let cluster = RedisCluster::start(dir.path()).unwrap();
    // The shared budget alone: no CAPTCHA near its end.
    let limit = ["--anon-creates-per-hour", "5", "--captcha", "off"];
    let a = serve(&dir, &db, &cluster.url(), &limit);
    let b = serve(&dir, &db, &cluster.url(), &limit);
    let c = client();

    // One budget of 5 anonymous creates per hour across both instances.
    let mut statuses = Vec::new();
    for i in 0..6 {
        let server = if i % 2 == 0 { &a } else { &b };
        let resp = create(
            &c,
            server,
            json!({"long_url": "https://example.com/x", "custom_alias": format!("cl-{i}")}),
            None,
        )
        .await;
        statuses.push(resp.status());
    }
    assert_eq!(&statuses[..5], [StatusCode::CREATED; 5]);
    assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS);

    for i in 0..1_000 {
        let server = if i % 2 == 0 { &a } else { &b };
        assert_eq!(
            follow(&c, server, &format!("cl-{}", i % 5)).await,
            StatusCode::FOUND
        );
    }
    eventually("clicks applied by both instances' aggregators", || async {
        stored_clicks(&db).await.0.0 == 1_000
    })
    .await;

    let admin = token_in(&["--database", &db.url], "ops", true);
    assert_eq!(delete(&c, &a, "cl-0", &admin).await, StatusCode::NO_CONTENT);
    eventually("B sees the delete", || async {
        follow(&c, &b, "cl-0").await == StatusCode::GONE
    })
    .await;
}
