//! Two regions on loopback: region A (the primary, its Redis, an instance) and region B (a
//! streaming standby of the primary, its own Redis, an instance reading from the standby and
//! writing to the primary). B serves A's links; a delete or disable in A and an edit in B reach
//! the other region through the change sequence (B reads it from its replica);
//! B's Redis down and the primary down leave redirects working; clicks from both regions count
//! exactly once, also while a region's aggregator is killed -9 mid-stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::load::{Load, since};
use common::pg::schema_on;
use common::{
    BIN, Shortener, client, create, error_code, eventually, metric, noticed, readiness, token_in,
};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::{Postgres, Process, RedisServer, Regions};

const LINKS: usize = 6;
const OUTAGE: Duration = Duration::from_secs(3);

/// HEAD: checks a redirect without counting a click by a person (HEAD counts as a bot).
async fn status(c: &reqwest::Client, server: &Shortener, path: &str) -> StatusCode {
    c.head(server.url(path)).send().await.unwrap().status()
}

/// The `Location` of a HEAD of `path`.
async fn location(c: &reqwest::Client, server: &Shortener, path: &str) -> String {
    let resp = c.head(server.url(path)).send().await.unwrap();
    resp.headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Whether the standby has replayed the link `code`.
async fn replica_has(standby: &Postgres, code: &str) -> bool {
    let (client, connection) =
        tokio_postgres::connect(&standby.url("shortener"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
        .query_opt("SELECT 1 FROM links WHERE code = $1", &[&code])
        .await
        .unwrap()
        .is_some()
}

/// GET as a browser: one click by a person.
async fn click(c: &reqwest::Client, server: &Shortener, path: &str) -> StatusCode {
    c.get(server.url(path)).send().await.unwrap().status()
}

/// Clicks by people on the primary, over the links whose code starts with `prefix`.
async fn stored_clicks_of(primary: &Postgres, prefix: &str) -> i64 {
    let (client, connection) =
        tokio_postgres::connect(&primary.url("shortener"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT COALESCE(SUM(clicks), 0)::BIGINT FROM counted_links WHERE starts_with(code, $1)",
            &[&prefix],
        )
        .await
        .unwrap()
        .get(0)
}

/// Clicks by people on the primary, over every link.
async fn stored_clicks(primary: &Postgres) -> i64 {
    stored_clicks_of(primary, "").await
}

/// `shortener aggregate` of one region: folds that region's click stream into the primary.
fn aggregator(database: &str, redis: &RedisServer, name: &str) -> Process {
    let mut cmd = Command::new(BIN);
    cmd.args(["aggregate", "--database", database, "--redis", &redis.url()])
        .args(["--consumer", name])
        .env_remove("SHORTENER_DATABASE")
        .env("SHORTENER_LOG", "warn");
    let mut process = Process::spawn(name, cmd).unwrap();
    process
        .wait_for_line("aggregating as", Duration::from_secs(60))
        .unwrap();
    process
}

/// Entries in a region's click stream: acknowledged ones are deleted, so 0 means every
/// shipped batch was applied.
fn stream_length(redis: &RedisServer) -> u64 {
    redis.cli(&["XLEN", "shortener:clicks"])[0].parse().unwrap()
}

/// `n` clicks by people on `server`, spread over `codes`, 16 at a time.
async fn clicks(c: &reqwest::Client, server: &Shortener, codes: &[String], n: usize) {
    futures_util::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let path = format!("/{}", codes[i % codes.len()]);
            async move { assert_eq!(click(c, server, &path).await, StatusCode::FOUND) }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_regions_share_links_survive_outages_and_count_clicks_once() {
    let dir = TempDir::new().unwrap();
    let Regions {
        mut primary,
        standby,
        redis_a,
        mut redis_b,
    } = Regions::start(dir.path(), "shortener").unwrap();
    let url = schema_on(&primary).await;
    let replica_url = standby.url("shortener");
    let admin = token_in(&["--database", &url], "ops", true);
    let a = Shortener::start(
        &dir.path().join("a"),
        &[
            "--database",
            &url,
            "--redis",
            &redis_a.url(),
            "--click-flush-ms",
            "200",
        ],
    );
    let b = Shortener::start(
        &dir.path().join("b"),
        &[
            "--database",
            &url,
            "--database-replica",
            &replica_url,
            "--redis",
            &redis_b.url(),
            "--click-flush-ms",
            "200",
        ],
    );
    let c = client();

    // Links created in A redirect in B (read from B's replica); B's creates go to the primary.
    let mut paths = Vec::new();
    for i in 0..LINKS {
        let (server, alias) = if i % 2 == 0 {
            (&a, format!("from-a-{i}"))
        } else {
            (&b, format!("from-b-{i}"))
        };
        let body = json!({"long_url": format!("https://example.com/{i}"), "custom_alias": alias});
        assert_eq!(
            create(&c, server, body, Some(&admin)).await.status(),
            StatusCode::CREATED
        );
        paths.push(format!("/{alias}"));
    }
    for path in &paths {
        for server in [&a, &b] {
            eventually("every link redirects in both regions", || async {
                status(&c, server, path).await == StatusCode::FOUND
            })
            .await;
        }
    }

    // Clicks in both regions, each shipped to its own region's stream, counted once.
    for path in &paths {
        for server in [&a, &b] {
            for _ in 0..5 {
                assert_eq!(click(&c, server, path).await, StatusCode::FOUND);
            }
        }
    }
    let expected = i64::try_from(paths.len() * 2 * 5).unwrap();
    eventually("both regions' clicks applied", || async {
        stored_clicks(&primary).await == expected
    })
    .await;

    // A delete in A reaches B's caches through B's own replica (the change note replicates
    // with the change; the regions share no Redis).
    let started = std::time::Instant::now();
    let resp = c
        .delete(a.url(&format!("/api/v1/links{}", paths[0])))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    eventually("B answers 410 for the link deleted in A", || async {
        status(&c, &b, &paths[0]).await == StatusCode::GONE
    })
    .await;
    eprintln!("a delete in A reached B after {:?}", started.elapsed());
    let paths = &paths[1..];

    // A create in A reaches B, which found the code unknown just before: B's negative
    // entries, L1 and L2, live the default --negative-cache-ttl (60 s), so only the create's
    // change note, polled from B's replica, can clear them in time.
    for server in [&a, &b] {
        assert_eq!(status(&c, server, "/later").await, StatusCode::NOT_FOUND);
    }
    let body = json!({"long_url": "https://example.com/later", "custom_alias": "later"});
    assert_eq!(
        create(&c, &a, body, Some(&admin)).await.status(),
        StatusCode::CREATED
    );
    let started = std::time::Instant::now();
    for server in [&a, &b] {
        noticed(
            "the link created in A redirects in both regions after a 404",
            || async { location(&c, server, "/later").await == "https://example.com/later" },
        )
        .await;
    }
    eprintln!("a create in A reached B after {:?}", started.elapsed());

    // An edit made in B reaches A's cache and B's; a disable in A reaches B's.
    let resp = c
        .patch(b.url("/api/v1/links/later"))
        .bearer_auth(&admin)
        .json(&json!({"long_url": "https://example.com/edited-in-b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    for server in [&a, &b] {
        noticed("the edit in B redirects in both regions", || async {
            location(&c, server, "/later").await == "https://example.com/edited-in-b"
        })
        .await;
    }
    let resp = c
        .post(a.url("/api/v1/links/later/disable"))
        .bearer_auth(&admin)
        .json(&json!({"reason": "paused"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    noticed("B answers 410 for the link disabled in A", || async {
        status(&c, &b, "/later").await == StatusCode::GONE
    })
    .await;

    // A link B never looked up, so neither of its caches holds it: while the primary is down
    // B serves it from its replica.
    let body = json!({"long_url": "https://example.com/cold", "custom_alias": "cold"});
    assert_eq!(
        create(&c, &a, body, Some(&admin)).await.status(),
        StatusCode::CREATED
    );
    eventually("B's replica has the cold link", || async {
        replica_has(&standby, "cold").await
    })
    .await;

    // B's Redis down: B keeps redirecting.
    let b_urls: Vec<String> = paths.iter().map(|p| b.url(p)).collect();
    let load = Load::start(c.clone(), b_urls, 2);
    let start = load.tally();
    redis_b.stop();
    tokio::time::sleep(OUTAGE).await;
    let without_redis = since(start, load.tally());
    let restarted = Instant::now();
    redis_b.restart().unwrap();
    eventually("B ready again", || async {
        readiness(&c, &b).await.1["status"] == "ready"
    })
    .await;
    let ready_after = restarted.elapsed();
    let total = load.stop().await;
    eprintln!(
        "region B, its Redis stopped {OUTAGE:?}: {} redirected, {} failed; B ready (Redis answering, invalidations subscribed) {ready_after:?} after the restart began",
        without_redis.redirected, without_redis.failed
    );
    assert_eq!(total.failed, 0);

    // The primary down: both regions keep redirecting, creates fail with a clear 503.
    let all: Vec<String> = paths.iter().flat_map(|p| [a.url(p), b.url(p)]).collect();
    let load = Load::start(c.clone(), all, 2);
    let start = load.tally();
    primary.stop().unwrap();
    for server in [&a, &b] {
        let body = json!({"long_url": "https://example.com/while-down"});
        let resp = create(&c, server, body, Some(&admin)).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error_code(resp).await, "store_unavailable");
    }
    let replica_reads = metric(&c, &b, "shortener_replica_reads_total").await;
    assert_eq!(status(&c, &b, "/cold").await, StatusCode::FOUND);
    assert!(metric(&c, &b, "shortener_replica_reads_total").await > replica_reads);
    tokio::time::sleep(OUTAGE).await;
    let without_primary = since(start, load.tally());
    let restarted = Instant::now();
    primary.start().unwrap();
    eventually("creates work again in B", || async {
        let body = json!({"long_url": "https://example.com/after"});
        create(&c, &b, body, Some(&admin)).await.status() == StatusCode::CREATED
    })
    .await;
    let creates_after = restarted.elapsed();
    let total = load.stop().await;
    eprintln!(
        "both regions, the primary stopped {OUTAGE:?}: {} redirected, {} failed; creates in B work {creates_after:?} after pg_ctl start began",
        without_primary.redirected, without_primary.failed
    );
    assert_eq!(total.failed, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_region_aggregator_killed_mid_stream_loses_and_doubles_no_click() {
    const PER_REGION: usize = 3000;
    let dir = TempDir::new().unwrap();
    let regions = Regions::start(dir.path(), "shortener").unwrap();
    let url = schema_on(&regions.primary).await;
    let replica_url = regions.standby.url("shortener");
    let admin = token_in(&["--database", &url], "ops", true);
    // Each region ships to its own stream; aggregation runs apart, one process per region.
    let apart = ["--no-aggregator", "--click-flush-ms", "200"];
    let a = Shortener::start(
        &dir.path().join("a"),
        &[
            &["--database", &url, "--redis", &regions.redis_a.url()][..],
            &apart,
        ]
        .concat(),
    );
    let b = Shortener::start(
        &dir.path().join("b"),
        &[
            &[
                "--database",
                &url,
                "--database-replica",
                &replica_url,
                "--redis",
                &regions.redis_b.url(),
            ][..],
            &apart,
        ]
        .concat(),
    );
    let c = client();
    let mut codes = (Vec::new(), Vec::new());
    for i in 0..4 {
        for (prefix, list) in [("ra-", &mut codes.0), ("rb-", &mut codes.1)] {
            let alias = format!("{prefix}{i}");
            let body =
                json!({"long_url": format!("https://example.com/{alias}"), "custom_alias": alias});
            assert_eq!(
                create(&c, &a, body, Some(&admin)).await.status(),
                StatusCode::CREATED
            );
            list.push(alias);
        }
    }
    for code in codes.0.iter().chain(&codes.1) {
        eventually("B has every link", || async {
            status(&c, &b, &format!("/{code}")).await == StatusCode::FOUND
        })
        .await;
    }
    let _aggregate_a = aggregator(&url, &regions.redis_a, "region-a");
    let mut aggregate_b = aggregator(&url, &regions.redis_b, "region-b");

    // Both regions click; B's aggregator is killed once part of B's clicks are applied and
    // more keep streaming in, then restarted under its name (resuming what it held).
    let kill_mid_stream = async {
        eventually("region B's aggregator applying", || async {
            stored_clicks_of(&regions.primary, "rb-").await > 300
        })
        .await;
        aggregate_b.kill();
        let applied = stored_clicks_of(&regions.primary, "rb-").await;
        eprintln!(
            "region B's aggregator killed with {applied} of {PER_REGION} of B's clicks applied"
        );
        assert!(
            applied < i64::try_from(PER_REGION).unwrap(),
            "killed mid-stream"
        );
    };
    tokio::join!(
        clicks(&c, &a, &codes.0, PER_REGION),
        clicks(&c, &b, &codes.1, PER_REGION),
        kill_mid_stream
    );
    let _aggregate_b = aggregator(&url, &regions.redis_b, "region-b");
    let per_region = i64::try_from(PER_REGION).unwrap();
    eventually("every click of both regions applied", || async {
        stored_clicks_of(&regions.primary, "ra-").await == per_region
            && stored_clicks_of(&regions.primary, "rb-").await == per_region
    })
    .await;
    eventually("both streams emptied", || async {
        stream_length(&regions.redis_a) == 0 && stream_length(&regions.redis_b) == 0
    })
    .await;
    // Nothing is left to apply (a redelivered batch would still be in a stream): final.
    assert_eq!(stored_clicks_of(&regions.primary, "ra-").await, per_region);
    assert_eq!(stored_clicks_of(&regions.primary, "rb-").await, per_region);
}
