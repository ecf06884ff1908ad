//! Degrade, never hang: a private PostgreSQL frozen (`SIGSTOP`: accepts, never answers) and
//! stopped under a steady redirect load; stale serving, bounded misses, the breaker, readiness;
//! Redis stopped under the same load; and `--edge-status`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::load::{Load, since};
use common::pg::{TestDb, migrated_on};
use common::{
    Shortener, client, create, error_code, eventually, metric, one_line_failure, readiness, run,
    token_in,
};
use reqwest::StatusCode;
use serde_json::json;
use shortener::cli::{ServeArgs, StoreArgs};
use shortener::config::ServeConfig;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::{Postgres, RedisServer};

/// Codes the steady load asks for; each cached before the outage.
const HOT: usize = 20;
/// How long each outage lasts under the load.
const OUTAGE: Duration = Duration::from_secs(3);

/// Misses answer 503 `store_unavailable`, within the store timeout (the bound here only
/// guards against a hang: 250 ms configured).
async fn misses_fail_fast(c: &reqwest::Client, server: &Shortener, tag: &str) {
    for i in 0..5 {
        let started = Instant::now();
        let resp = c
            .get(server.url(&format!("/{tag}{i}")))
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{tag}{i}");
        assert_eq!(error_code(resp).await, "store_unavailable");
        assert!(took < Duration::from_secs(2), "miss took {took:?}");
    }
}

/// Waits until a miss reaches the store again; how long that took.
async fn recovery(c: &reqwest::Client, server: &Shortener) -> Duration {
    let started = Instant::now();
    eventually("a miss reaches the store again", || async {
        c.get(server.url("/nosuchcode"))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::NOT_FOUND
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_or_stopped_database_degrades_redirects_and_never_hangs_them() {
    let dir = TempDir::new().unwrap();
    let mut pg = Postgres::primary(&dir.path().join("pg")).unwrap();
    let url = migrated_on(&pg).await;
    let admin = token_in(&["--database", &url], "ops", true);
    let server = Shortener::start(
        &dir.path().join("app"),
        &[
            "--database",
            &url,
            "--cache-ttl",
            "1",
            "--store-timeout-ms",
            "250",
        ],
    );
    let c = client();
    let mut hot = Vec::new();
    for i in 0..HOT {
        let alias = format!("hot-{i}");
        let body = json!({"long_url": format!("https://example.com/{i}"), "custom_alias": alias});
        assert_eq!(
            create(&c, &server, body, Some(&admin)).await.status(),
            StatusCode::CREATED
        );
        assert_eq!(
            c.get(server.url(&format!("/{alias}")))
                .send()
                .await
                .unwrap()
                .status(),
            StatusCode::FOUND
        );
        hot.push(server.url(&format!("/{alias}")));
    }
    let body = json!({"long_url": "https://example.com/moved", "custom_alias": "moved"});
    create(&c, &server, body, Some(&admin)).await;
    assert_eq!(
        c.get(server.url("/moved")).send().await.unwrap().status(),
        StatusCode::FOUND
    );
    let resp = c
        .delete(server.url("/api/v1/links/moved"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    // Past the 1 s TTL: every hot entry is stale from here on.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let load = Load::start(c.clone(), hot, 4);

    // (1) Frozen: connections are accepted, nothing answers.
    pg.freeze().unwrap();
    let before = load.tally();
    misses_fail_fast(&c, &server, "cold").await;
    // The delete was announced: its old state is never served stale.
    assert_eq!(
        c.get(server.url("/moved")).send().await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, body) = readiness(&c, &server).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "degraded", "store": "unavailable"}));
    let body = json!({"long_url": "https://example.com/new", "custom_alias": "while-frozen"});
    let started = Instant::now();
    let resp = create(&c, &server, body, Some(&admin)).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(2));
    tokio::time::sleep(OUTAGE).await;
    let frozen = since(before, load.tally());
    pg.thaw().unwrap();
    let frozen_recovery = recovery(&c, &server).await;

    // (2) Stopped: connections refused.
    pg.stop().unwrap();
    let before = load.tally();
    misses_fail_fast(&c, &server, "down").await;
    tokio::time::sleep(OUTAGE).await;
    let stopped = since(before, load.tally());
    let restarted = Instant::now();
    pg.start().unwrap();
    let started_in = restarted.elapsed();
    let stopped_recovery = recovery(&c, &server).await;
    eventually("ready again", || async {
        readiness(&c, &server).await == (StatusCode::OK, json!({"status": "ready", "store": "ok"}))
    })
    .await;

    let total = load.stop().await;
    eprintln!(
        "steady load of {HOT} hot links: frozen primary {OUTAGE:?}: {} redirected, {} failed, recovered {frozen_recovery:?} after SIGCONT; \
         stopped primary {OUTAGE:?}: {} redirected, {} failed, recovered {stopped_recovery:?} after pg_ctl start returned ({started_in:?}); whole run {} redirected, {} failed",
        frozen.redirected,
        frozen.failed,
        stopped.redirected,
        stopped.failed,
        total.redirected,
        total.failed
    );
    assert_eq!(total.failed, 0, "cached links must keep redirecting");
    assert!(frozen.redirected > 0 && stopped.redirected > 0);
    assert!(metric(&c, &server, "shortener_stale_served_total{layer=\"l1\"}").await > 0.0);
    assert!(metric(&c, &server, "shortener_store_timeouts_total").await > 0.0);
    assert!(metric(&c, &server, "shortener_store_breaker_opens_total").await >= 2.0);
    assert!(metric(&c, &server, "shortener_store_breaker_refusals_total").await > 0.0);
    assert_eq!(
        metric(&c, &server, "shortener_store_breaker_state").await,
        0.0
    );
    // The create answered 503 while the server was frozen: it may or may not have committed.
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/new", "custom_alias": "while-frozen"}),
        Some(&admin),
    )
    .await;
    assert!(
        [StatusCode::CREATED, StatusCode::CONFLICT].contains(&resp.status()),
        "{}",
        resp.status()
    );
}

#[test]
fn edge_status_301_needs_an_edge_cache_ttl_and_bad_values_are_refused() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--edge-status", "301"],
        &[],
    ));
    assert!(line.contains("edge-cache-ttl"), "{line}");
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--edge-status", "307"],
        &[],
    ));
    assert!(line.contains("301 or 302"), "{line}");
    for bad in [["--store-timeout-ms", "0"], ["--stale-max-age", "99999999"]] {
        let mut args = vec!["serve", "--data-dir", data];
        args.extend(bad);
        let line = one_line_failure(&run(&args, &[]));
        assert!(line.contains(&bad[0][2..]), "{line}");
    }
}

/// Each setting of this part is read from its flag, its `SHORTENER_` variable and the config
/// file (the replica list's three forms: `replicas.rs`): a bad value from any of them is
/// refused at start naming the setting, and good values from the file are applied.
#[test]
fn availability_settings_come_from_flags_the_environment_and_the_config_file() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    // Taken: a setting that went unread would fail the start on this, not serve forever.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let config = dir.path().join("shortener.toml");
    let file = config.to_str().unwrap();
    for (setting, bad) in [
        ("store-timeout-ms", "0"),
        ("stale-max-age", "99999999"),
        ("replica-max-lag-ms", "5"),
        ("edge-status", "307"),
    ] {
        let var = format!("SHORTENER_{}", setting.to_uppercase().replace('-', "_"));
        std::fs::write(&config, format!("{} = {bad}\n", setting.replace('-', "_"))).unwrap();
        let flag = format!("--{setting}");
        let base = ["serve", "--data-dir", data, "--listen", &listen];
        for (extra, env) in [
            (vec![flag.as_str(), bad], vec![]),
            (vec![], vec![(var.as_str(), bad)]),
            (vec!["--config", file], vec![]),
        ] {
            let line = one_line_failure(&run(&[&base[..], &extra].concat(), &env));
            assert!(
                line.contains(setting),
                "{setting} via {extra:?} {env:?}: {line}"
            );
        }
    }
    // 301 without a TTL, from the environment.
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--listen", &listen],
        &[("SHORTENER_EDGE_STATUS", "301")],
    ));
    assert!(line.contains("edge-cache-ttl"), "{line}");

    std::fs::write(
        &config,
        "store_timeout_ms = 1500\nstale_max_age = 600\nreplica_max_lag_ms = 2000\n\
         edge_status = 301\nedge_cache_ttl = 90\n",
    )
    .unwrap();
    let resolved = ServeConfig::resolve(ServeArgs {
        store: StoreArgs {
            config: Some(config.clone()),
            data_dir: Some(dir.path().join("data")),
            ..StoreArgs::default()
        },
        ..ServeArgs::default()
    })
    .unwrap();
    assert_eq!(resolved.store_timeout, Duration::from_millis(1500));
    assert_eq!(resolved.stale_max_age, Duration::from_secs(600));
    assert_eq!(resolved.replica_max_lag, Duration::from_millis(2000));
    assert_eq!(
        (resolved.edge_status, resolved.edge_cache_ttl),
        (301, Some(90))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn edge_status_301_carries_a_public_max_age() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &["--edge-status", "301", "--edge-cache-ttl", "120"],
    );
    let c = client();
    let body = json!({"long_url": "https://example.com/edge", "custom_alias": "edge"});
    assert_eq!(
        create(&c, &server, body, None).await.status(),
        StatusCode::CREATED
    );
    let resp = c.get(server.url("/edge")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(resp.headers()["location"], "https://example.com/edge");
    assert_eq!(resp.headers()["cache-control"], "public, max-age=120");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_redis_loses_no_redirect_of_a_steady_load() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let mut redis = RedisServer::start(dir.path()).unwrap();
    let admin = token_in(&["--database", &db.url], "ops", true);
    let flags = [
        "--database",
        &db.url,
        "--redis",
        &redis.url(),
        "--cache-ttl",
        "1",
    ];
    let server = Shortener::start(&dir.path().join("app"), &flags);
    let c = client();
    let mut hot = Vec::new();
    for i in 0..HOT {
        let alias = format!("hot-{i}");
        let body = json!({"long_url": format!("https://example.com/{i}"), "custom_alias": alias});
        assert_eq!(
            create(&c, &server, body, Some(&admin)).await.status(),
            StatusCode::CREATED
        );
        hot.push(server.url(&format!("/{alias}")));
    }
    let load = Load::start(c.clone(), hot, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = load.tally();
    redis.stop();
    tokio::time::sleep(OUTAGE).await;
    let stopped = since(before, load.tally());
    let restarted = Instant::now();
    redis.restart().unwrap();
    eventually("ready again", || async {
        readiness(&c, &server).await.1["status"] == "ready"
    })
    .await;
    let ready_after = restarted.elapsed();
    let total = load.stop().await;
    eprintln!(
        "steady load of {HOT} links (cache TTL 1 s): Redis stopped {OUTAGE:?}: {} redirected, {} failed; ready (Redis answering, invalidations subscribed) {ready_after:?} after the restart began; whole run {} redirected, {} failed",
        stopped.redirected, stopped.failed, total.redirected, total.failed
    );
    assert_eq!(total.failed, 0);
    assert!(stopped.redirected > 0);
}

/// An L2 entry past its soft expiry, as an instance wrote it a day ago.
fn plant_stale_l2(redis: &RedisServer, code: &str, long_url: &str) {
    let day_ago = time::OffsetDateTime::now_utc().unix_timestamp() - 86_400;
    let value = format!("v1|l|{}|{day_ago}|{long_url}", i64::MAX);
    let key = format!("shortener:link:{code}");
    assert_eq!(redis.cli(&["SET", &key, &value]), ["OK"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_l2_entry_stands_in_for_a_frozen_database_and_only_then() {
    let dir = TempDir::new().unwrap();
    let pg = Postgres::primary(&dir.path().join("pg")).unwrap();
    let url = migrated_on(&pg).await;
    let redis = RedisServer::start(dir.path()).unwrap();
    let admin = token_in(&["--database", &url], "ops", true);
    let flags = ["--database", &url, "--redis", &redis.url()];
    let server = Shortener::start(&dir.path().join("app"), &flags);
    let c = client();
    for alias in ["old-news", "gone-since"] {
        let body =
            json!({"long_url": format!("https://example.com/{alias}"), "custom_alias": alias});
        assert_eq!(
            create(&c, &server, body, Some(&admin)).await.status(),
            StatusCode::CREATED
        );
    }
    // A stale entry is not served while the store answers: the store's state wins.
    let resp = c
        .delete(server.url("/api/v1/links/gone-since"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    plant_stale_l2(&redis, "gone-since", "https://example.com/gone-since");
    // A fresh instance: nothing in its L1.
    let fresh = Shortener::start(&dir.path().join("fresh"), &flags);
    assert_eq!(
        c.get(fresh.url("/gone-since"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::GONE
    );
    plant_stale_l2(&redis, "old-news", "https://example.com/stale-copy");
    pg.freeze().unwrap();
    let resp = c.get(fresh.url("/old-news")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    assert_eq!(resp.headers()["location"], "https://example.com/stale-copy");
    assert_eq!(
        metric(&c, &fresh, "shortener_stale_served_total{layer=\"l2\"}").await,
        1.0
    );
    pg.thaw().unwrap();
}
