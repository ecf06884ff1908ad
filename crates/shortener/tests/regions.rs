//! Two regions on loopback: region A (the primary, its Redis, an instance) and region B (a
//! streaming standby of the primary, its own Redis, an instance reading from the standby and
//! writing to the primary). B serves A's links; a delete in A reaches B through B's replica;
//! B's Redis down and the primary down leave redirects working; clicks from both regions count
//! exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::load::{Load, since};
use common::pg::migrated_on;
use common::{Shortener, client, create, error_code, eventually, token_in};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;
use tempfile::TempDir;
use testkit::{Postgres, RedisServer};

const LINKS: usize = 6;
const OUTAGE: Duration = Duration::from_secs(3);

/// HEAD: checks a redirect without counting a click by a person (HEAD counts as a bot).
async fn status(c: &reqwest::Client, server: &Shortener, path: &str) -> StatusCode {
    c.head(server.url(path)).send().await.unwrap().status()
}

/// GET as a browser: one click by a person.
async fn click(c: &reqwest::Client, server: &Shortener, path: &str) -> StatusCode {
    c.get(server.url(path)).send().await.unwrap().status()
}

/// Clicks by people on the primary, over every link.
async fn stored_clicks(primary: &Postgres) -> i64 {
    let (client, connection) =
        tokio_postgres::connect(&primary.url("shortener"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
        .query_one("SELECT COALESCE(SUM(clicks), 0)::BIGINT FROM links", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_regions_share_links_survive_outages_and_count_clicks_once() {
    let dir = TempDir::new().unwrap();
    let mut primary = Postgres::primary(&dir.path().join("primary")).unwrap();
    let url = migrated_on(&primary).await;
    let standby = primary.standby(&dir.path().join("standby")).unwrap();
    let replica_url = standby.url("shortener");
    let redis_a = RedisServer::start(&dir.path().join("redis-a")).unwrap();
    let mut redis_b = RedisServer::start(&dir.path().join("redis-b")).unwrap();
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
            "--negative-cache-ttl",
            "1",
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

    // B's Redis down: B keeps redirecting.
    let b_urls: Vec<String> = paths.iter().map(|p| b.url(p)).collect();
    let load = Load::start(c.clone(), b_urls, 2);
    let start = load.tally();
    redis_b.stop();
    tokio::time::sleep(OUTAGE).await;
    let without_redis = since(start, load.tally());
    redis_b.restart().unwrap();
    let total = load.stop().await;
    eprintln!(
        "region B, its Redis stopped {OUTAGE:?}: {} redirected, {} failed",
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
    tokio::time::sleep(OUTAGE).await;
    let without_primary = since(start, load.tally());
    primary.start().unwrap();
    let total = load.stop().await;
    eprintln!(
        "both regions, the primary stopped {OUTAGE:?}: {} redirected, {} failed",
        without_primary.redirected, without_primary.failed
    );
    assert_eq!(total.failed, 0);
    eventually("creates work again in B", || async {
        let body = json!({"long_url": "https://example.com/after"});
        create(&c, &b, body, Some(&admin)).await.status() == StatusCode::CREATED
    })
    .await;
}
