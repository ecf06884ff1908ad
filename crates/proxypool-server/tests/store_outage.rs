//! `proxypool serve --redis` when Redis stops answering under gateway load: clear 503s with
//! `X-Proxypool-Error: store-unavailable` within the store's timeout (no hang), the same
//! process serves again once Redis is back, never answering `no-upstream` for the grants of
//! acquires given up meanwhile, and those leave no lease.

#![allow(clippy::unwrap_used)]

mod common;

use common::{FAST_POOL, Server, Target, Tinyproxy};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

const SITE: &str = "127.0.21.1";
/// Guard against a hung request: far above the store's 500 ms timeout, not a measurement.
const HANG: Duration = Duration::from_secs(10);

/// One GET through the gateway: its status and `X-Proxypool-Error`; panics if it hangs.
async fn fetch(client: &reqwest::Client, url: &str) -> (u16, Option<String>) {
    let response = tokio::time::timeout(HANG, client.get(url).send())
        .await
        .expect("a gateway request hung")
        .unwrap();
    let error = response
        .headers()
        .get("x-proxypool-error")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status().as_u16(), error)
}

/// Requests until `want` answers; returns what came before it.
async fn until(
    client: &reqwest::Client,
    url: &str,
    want: (u16, Option<&str>),
) -> Vec<(u16, Option<String>)> {
    let mut before = Vec::new();
    for _ in 0..200 {
        let got = fetch(client, url).await;
        if (got.0, got.1.as_deref()) == want {
            return before;
        }
        before.push(got);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "never got {want:?}; last answers {:?}",
        &before[before.len() - 5..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_under_load_answers_store_unavailable_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = testkit::RedisServer::start(dir.path()).unwrap();
    let proxy = Tinyproxy::start(dir.path(), "127.0.0.2");
    let target = Target::start(&[SITE]);
    let url = redis.url();
    let server = Server::start(
        dir.path(),
        &[proxy.url()],
        FAST_POOL,
        &["--redis", url.as_str(), "--redis-pool", "outage"],
    );
    let page = target.url(SITE, "/");
    let probe = server.client(None);
    until(&probe, &page, (200, None)).await;

    // Background load through the gateway for the whole test; every answer must come back.
    // Each answer is filed under the phase it arrived in: 0 before the pause, 1 paused, 2 after.
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicU8::new(0));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (client, page) = (server.client(None), page.clone());
            let (stop, phase) = (stop.clone(), phase.clone());
            tokio::spawn(async move {
                let mut seen = std::collections::BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let (status, error) = fetch(&client, &page).await;
                    let at = phase.load(Ordering::SeqCst);
                    *seen.entry((at, status, error)).or_insert(0u32) += 1;
                }
                seen
            })
        })
        .collect();

    phase.store(1, Ordering::SeqCst);
    redis.pause().unwrap();
    let before = until(&probe, &page, (503, Some("store-unavailable"))).await;
    assert!(
        before.iter().all(|(s, _)| *s == 200),
        "before the first store-unavailable: {before:?}"
    );
    // Every answer while Redis is away is that one.
    for _ in 0..5 {
        let (status, error) = fetch(&probe, &page).await;
        assert_eq!((status, error.as_deref()), (503, Some("store-unavailable")));
    }
    phase.store(2, Ordering::SeqCst);
    redis.resume().unwrap();
    let during = until(&probe, &page, (200, None)).await;
    assert!(
        during
            .iter()
            .all(|(s, e)| (*s, e.as_deref()) == (503, Some("store-unavailable"))),
        "after Redis came back: {during:?}"
    );
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let seen = task.await.unwrap();
        for (at, status, error) in seen.keys() {
            // After the thaw Redis runs what it had queued, acquires whose callers gave up
            // included: until their grants are back, caps look used up, and the store says it
            // is recovering rather than that no upstream is free (that would be false).
            let fine = matches!(
                (*at, *status, error.as_deref()),
                (_, 200, None) | (1 | 2, 503, Some("store-unavailable"))
            );
            assert!(fine, "load saw (phase, status, error): {seen:?}");
        }
    }
    // Those grants go back as soon as their late replies arrive, not after the lease TTL
    // (5 minutes): with the load stopped, no lease is left.
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let snapshot = server.api_get("/v1/snapshot").await;
        let active = &snapshot["snapshot"]["pool"]["active_leases"];
        if active == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "leases left after the thaw: {active}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Killed and started again empty: the same answer while it is down, and service again
    // once it is back (the library and the addresses come back from this process; until they
    // are, the empty pool may answer no-upstream).
    redis.stop();
    until(&probe, &page, (503, Some("store-unavailable"))).await;
    redis.restart().unwrap();
    until(&probe, &page, (200, None)).await;
    assert!(!server_has_exited(server));
}

fn server_has_exited(mut server: Server) -> bool {
    server.process.has_exited()
}
