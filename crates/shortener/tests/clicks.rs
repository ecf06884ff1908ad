//! The click pipeline and the redirect cache, end to end: exact counts under load, a flush on
//! SIGTERM, a saturated queue, bots, and a cache that never hides a write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Shortener, analytics, client, eventually, metric, new_link, today_utc, token};
use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tempfile::TempDir;

/// Sends `n` GETs of `/{code}` from `clients` concurrent tasks; returns how many were 302.
async fn redirect_many(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    n: u64,
    clients: u64,
) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let found = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (c, url, next, found) = (
            c.clone(),
            server.url(&format!("/{code}")),
            next.clone(),
            found.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let resp = c.get(&url).send().await.unwrap();
                if resp.status() == StatusCode::FOUND {
                    found.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    found.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_concurrent_redirects_count_exactly() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let owner = token(dir.path(), "alice", false);
    let c = client();
    new_link(&c, &server, "busy-link", &owner).await;
    let n = 10_000;
    assert_eq!(redirect_many(&c, &server, "busy-link", n, 64).await, n);
    eventually("all clicks in analytics", || async {
        analytics(&c, &server, "busy-link", &owner).await["total_clicks"] == n
    })
    .await;
    let a = analytics(&c, &server, "busy-link", &owner).await;
    let days = a["daily_clicks"].as_array().unwrap();
    assert_eq!(days[29]["date"], today_utc().as_str());
    assert_eq!(days[29]["clicks"], n);
    let daily_sum: u64 = days.iter().map(|d| d["clicks"].as_u64().unwrap()).sum();
    assert_eq!(daily_sum, n, "daily and total agree");
    assert_eq!(a["bot_clicks"], 0);
    assert_eq!(
        metric(&c, &server, "shortener_click_events_dropped_total").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_flushes_every_pending_click() {
    let dir = TempDir::new().unwrap();
    // A flush interval far longer than the test: only the shutdown can write these clicks.
    let flags = ["--click-flush-ms", "60000"];
    let mut server = Shortener::start(dir.path(), &flags);
    let owner = token(dir.path(), "alice", false);
    let c = client();
    new_link(&c, &server, "last-orders", &owner).await;
    let n = 5_000;
    assert_eq!(redirect_many(&c, &server, "last-orders", n, 32).await, n);
    assert_eq!(
        analytics(&c, &server, "last-orders", &owner).await["total_clicks"],
        0
    );
    let status = server.process.terminate().unwrap();
    assert!(status.success(), "{status:?}");
    let server = Shortener::start(dir.path(), &flags);
    let a = analytics(&c, &server, "last-orders", &owner).await;
    assert_eq!(a["total_clicks"], n);
    assert_eq!(a["daily_clicks"][29]["clicks"], n);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_drops_and_counts_but_never_fails_a_redirect() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &["--click-queue", "1", "--click-flush-ms", "10"],
    );
    let owner = token(dir.path(), "alice", false);
    let c = client();
    new_link(&c, &server, "overflow", &owner).await;
    let n = 10_000;
    assert_eq!(
        redirect_many(&c, &server, "overflow", n, 64).await,
        n,
        "every redirect is a 302"
    );
    let dropped = metric(&c, &server, "shortener_click_events_dropped_total").await as u64;
    assert!(
        dropped > 0,
        "a one-slot queue under 64 clients must overflow"
    );
    assert!(dropped < n);
    eventually("the kept clicks to be written", || async {
        analytics(&c, &server, "overflow", &owner).await["total_clicks"] == n - dropped
    })
    .await;
    // The flushed counter moves just after the commit the analytics already read.
    eventually("the kept clicks to be counted as flushed", || async {
        metric(&c, &server, "shortener_click_events_flushed_total").await as u64 == n - dropped
    })
    .await;
    assert_eq!(
        analytics(&c, &server, "overflow", &owner).await["total_clicks"],
        n - dropped,
        "nothing written beyond the kept clicks"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bots_and_head_requests_are_counted_apart_or_dropped() {
    for drop_bots in [false, true] {
        let dir = TempDir::new().unwrap();
        let flags: &[&str] = if drop_bots {
            &["--drop-bot-clicks"]
        } else {
            &[]
        };
        let server = Shortener::start(dir.path(), flags);
        let owner = token(dir.path(), "alice", false);
        let c = client();
        new_link(&c, &server, "who-clicks", &owner).await;
        let url = server.url("/who-clicks");
        for _ in 0..4 {
            assert_eq!(
                c.get(&url).send().await.unwrap().status(),
                StatusCode::FOUND
            );
        }
        for ua in [
            "Googlebot/2.1 (+http://www.google.com/bot.html)",
            "facebookexternalhit/1.1",
            "Slackbot-LinkExpanding 1.0",
        ] {
            let resp = c.get(&url).header("user-agent", ua).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::FOUND, "bots are redirected too");
        }
        assert_eq!(
            c.head(&url).send().await.unwrap().status(),
            StatusCode::FOUND
        );
        let bare = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        assert_eq!(
            bare.get(&url).send().await.unwrap().status(),
            StatusCode::FOUND
        );

        let expected_bots = if drop_bots { 0 } else { 5 };
        eventually("clicks to be written", || async {
            let a = analytics(&c, &server, "who-clicks", &owner).await;
            a["total_clicks"] == 4 && a["bot_clicks"] == expected_bots
        })
        .await;
        assert_eq!(
            analytics(&c, &server, "who-clicks", &owner).await["daily_clicks"][29]["clicks"],
            4
        );
    }
}

/// Waits until 300 more requests of the race below were answered.
async fn more_traffic(sent: &AtomicU64) {
    let mark = sent.load(Ordering::Acquire);
    eventually("traffic in this phase", || async {
        sent.load(Ordering::Acquire) >= mark + 300
    })
    .await;
}

/// Where the edit in the race below sends `later-link`.
const EDITED: &str = "https://example.org/edited";

#[tokio::test(flavor = "multi_thread")]
async fn the_cache_never_hides_a_create_an_edit_or_a_delete() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &["--negative-cache-ttl", "3600", "--cache-ttl", "3600"],
    );
    let owner = token(dir.path(), "alice", false);
    let c = client();
    let url = server.url("/later-link");
    // Known unknown: the negative entry is there, with an hour to live.
    assert_eq!(
        c.get(&url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        c.get(&url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert!(
        metric(
            &c,
            &server,
            "shortener_cache_lookups_total{outcome=\"negative_hit\"}"
        )
        .await
            >= 1.0
    );

    // Hammer the code while it is created, edited and then deleted: a request sent after the
    // 201 must be a 302, one sent after the edit's 200 a 302 to the new destination (never
    // the old one again), one sent after the 204 a 410.
    let phase = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (c, url, phase, stop, sent) = (
            c.clone(),
            url.clone(),
            phase.clone(),
            stop.clone(),
            sent.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let before = phase.load(Ordering::Acquire);
                let resp = c.get(&url).send().await.unwrap();
                sent.fetch_add(1, Ordering::Release);
                let status = resp.status();
                let to = resp
                    .headers()
                    .get("location")
                    .map(|l| l.to_str().unwrap().to_owned());
                let edited = to.as_deref() == Some(EDITED);
                let ok = match before {
                    0 => true,
                    1 => status == StatusCode::FOUND || status == StatusCode::GONE,
                    2 => (status == StatusCode::FOUND && edited) || status == StatusCode::GONE,
                    _ => status == StatusCode::GONE,
                };
                if !ok {
                    wrong.push((before, status, to));
                }
            }
            wrong
        }));
    }
    more_traffic(&sent).await;
    new_link(&c, &server, "later-link", &owner).await;
    phase.store(1, Ordering::Release);
    more_traffic(&sent).await;
    let resp = c
        .patch(server.url("/api/v1/links/later-link"))
        .bearer_auth(&owner)
        .json(&json!({ "long_url": EDITED }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    phase.store(2, Ordering::Release);
    more_traffic(&sent).await;
    let resp = c
        .delete(server.url("/api/v1/links/later-link"))
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    phase.store(3, Ordering::Release);
    more_traffic(&sent).await;
    stop.store(true, Ordering::Release);
    for t in tasks {
        let wrong = t.await.unwrap();
        assert!(wrong.is_empty(), "stale answers: {wrong:?}");
    }
    assert!(
        metric(
            &c,
            &server,
            "shortener_cache_lookups_total{outcome=\"hit\"}"
        )
        .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_misses_of_one_code_share_one_store_read() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let owner = token(dir.path(), "alice", false);
    let c = client();
    let codes: Vec<String> = (0..20).map(|i| format!("cold-{i}")).collect();
    for code in &codes {
        new_link(&c, &server, code, &owner).await;
    }
    let before = metric(&c, &server, "shortener_store_link_reads_total").await;
    let mut tasks = Vec::new();
    for code in &codes {
        for _ in 0..32 {
            let (c, url) = (c.clone(), server.url(&format!("/{code}")));
            tasks.push(tokio::spawn(async move {
                c.get(url).send().await.unwrap().status()
            }));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::FOUND);
    }
    let reads = metric(&c, &server, "shortener_store_link_reads_total").await - before;
    assert_eq!(
        reads,
        codes.len() as f64,
        "one store read per code, however many asked at once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_code_asked_for_steadily_never_waits_on_the_store_again() {
    let dir = TempDir::new().unwrap();
    // 8 s: a lifetime of 6–8 s, the last 2 s of which queue the code for a renewal (a tick
    // every 500 ms: room for a loaded machine).
    let server = Shortener::start(dir.path(), &["--negative-cache-ttl", "8"]);
    let c = client();
    let url = server.url("/nosuch1");
    assert_eq!(
        c.get(&url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let first_read = std::time::Instant::now();
    let reads = metric(&c, &server, "shortener_store_link_reads_total").await;
    // A crawler's steady pace (a request every 20 ms), past the first lifetime: every answer
    // comes from the cache, the store is read in the background instead.
    eventually("a renewal, and the first lifetime over", || {
        let (c, url, server) = (c.clone(), url.clone(), &server);
        async move {
            assert_eq!(
                c.get(&url).send().await.unwrap().status(),
                StatusCode::NOT_FOUND
            );
            metric(&c, server, "shortener_cache_renewals_total").await >= 1.0
                && first_read.elapsed() > std::time::Duration::from_millis(8500)
        }
    })
    .await;
    assert_eq!(
        metric(&c, &server, "shortener_store_link_reads_total").await,
        reads,
        "no request past the first read the store"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn edge_mode_lets_cdns_cache_redirects() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &["--edge-cache-ttl", "300"]);
    let owner = token(dir.path(), "alice", false);
    let c = client();
    new_link(&c, &server, "viral-one", &owner).await;
    let resp = c.get(server.url("/viral-one")).send().await.unwrap();
    assert_eq!(resp.headers()["cache-control"], "public, max-age=300");
}
