//! The real binary on PostgreSQL: `--database` on every subcommand, `migrate`, one-line
//! failures, two instances on one database, and an outage of the database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::{
    BIN, Shortener, analytics, client, create, eventually, noticed, one_line_failure, readiness,
    run, token_in,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use shortener::store::postgres::CURRENT_VERSION;
use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// `serve` on `url`, on a free port, with an unused data directory.
fn serve(dir: &TempDir, url: &str, extra: &[&str]) -> Shortener {
    let mut flags = vec!["--database", url];
    flags.extend_from_slice(extra);
    Shortener::start(dir.path(), &flags)
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_on_postgres_creates_redirects_and_counts() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let admin = token_in(&["--database", &db.url], "ops", true);
    let server = serve(&dir, &db.url, &["--click-flush-ms", "100"]);
    let c = client();

    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/pg", "custom_alias": "on-pg"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/pg2", "custom_alias": "on-pg"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/generated"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let generated: Value = resp.json().await.unwrap();
    let generated = generated["short_code"].as_str().unwrap().to_owned();
    assert_eq!(generated.len(), 7);

    for _ in 0..5 {
        let resp = c.get(server.url("/on-pg")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::FOUND);
        assert_eq!(resp.headers()["location"], "https://example.com/pg");
    }
    let resp = c.head(server.url("/on-pg")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    let resp = c
        .get(server.url(&format!("/{generated}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["location"], "https://example.com/generated");

    eventually("clicks reach PostgreSQL", || async {
        let a = analytics(&c, &server, "on-pg", &admin).await;
        a["total_clicks"] == 5 && a["bot_clicks"] == 1
    })
    .await;
    let a = analytics(&c, &server, "on-pg", &admin).await;
    let today = common::today_utc();
    let days = a["daily_clicks"].as_array().unwrap();
    assert!(
        days.iter()
            .any(|d| d["date"] == today.as_str() && d["clicks"] == 5),
        "{a}"
    );

    let resp = c
        .delete(server.url("/api/v1/links/on-pg"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = c.get(server.url("/on-pg")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::GONE);

    // Everything went to PostgreSQL, nothing to the data directory.
    assert!(!dir.path().join("shortener.db").exists());
    let row = db
        .client()
        .await
        .query_one(
            "SELECT clicks, bot_clicks, deleted_at IS NOT NULL FROM counted_links WHERE code = 'on-pg'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, bool>(2)
        ),
        (5, 1, true)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_share_one_database() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let admin = token_in(&["--database", &db.url], "ops", true);
    // Small blocks and pools: many leases, few connections. What is tested is sharing, not
    // the request deadline: a loaded machine (CI's 2 cores) took over 250 ms for some creates.
    let flags = [
        "--id-block-size",
        "37",
        "--database-pool-size",
        "4",
        "--store-timeout-ms",
        "10000",
    ];
    let a = serve(&dir, &db.url, &flags);
    let b = serve(&dir, &db.url, &flags);
    let c = client();
    let mut tasks = Vec::new();
    for w in 0..16 {
        let (c, url, admin) = (
            c.clone(),
            if w % 2 == 0 {
                a.url("/api/v1/links")
            } else {
                b.url("/api/v1/links")
            },
            admin.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            for i in 0..40 {
                let long_url = format!("https://example.com/{w}/{i}");
                let resp = c
                    .post(&url)
                    .bearer_auth(&admin)
                    .json(&json!({ "long_url": long_url }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::CREATED);
                let body: Value = resp.json().await.unwrap();
                made.push((body["short_code"].as_str().unwrap().to_owned(), long_url));
            }
            made
        }));
    }
    let mut links = Vec::new();
    for t in tasks {
        links.extend(t.await.unwrap());
    }
    let codes: HashSet<&str> = links.iter().map(|(code, _)| code.as_str()).collect();
    assert_eq!(codes.len(), 640, "duplicate codes across instances");
    for (code, long_url) in &links {
        for server in [&a, &b] {
            let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::FOUND, "{code}");
            assert_eq!(resp.headers()["location"], long_url.as_str());
        }
    }
    // Aliases B found unknown, then created through A all at once: in groups, one change
    // note each, which B's poll reads whole, clearing every "unknown" it remembered (for the
    // default --negative-cache-ttl, 60 s, without the note).
    let aliases: Vec<String> = (0..64).map(|i| format!("grouped-{i}")).collect();
    for alias in &aliases {
        let resp = c.get(b.url(&format!("/{alias}"))).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{alias}");
    }
    let creates: Vec<_> = aliases
        .iter()
        .map(|alias| {
            let (c, url, admin) = (c.clone(), a.url("/api/v1/links"), admin.clone());
            let body =
                json!({"long_url": format!("https://example.com/{alias}"), "custom_alias": alias});
            tokio::spawn(async move {
                let resp = c.post(&url).bearer_auth(&admin).json(&body).send().await;
                resp.unwrap().status()
            })
        })
        .collect();
    for t in creates {
        assert_eq!(t.await.unwrap(), StatusCode::CREATED);
    }
    for alias in &aliases {
        noticed(
            "B redirects every alias created in a group through A",
            || async {
                let resp = c.get(b.url(&format!("/{alias}"))).send().await.unwrap();
                resp.status() == StatusCode::FOUND
            },
        )
        .await;
    }

    // A token made while both run is known to both at once.
    let late = token_in(&["--database", &db.url], "late", false);
    for server in [&a, &b] {
        let resp = create(
            &c,
            server,
            json!({"long_url": "https://example.com/"}),
            Some(&late),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_is_idempotent_and_serve_refuses_an_unmigrated_database() {
    let db = TestDb::empty().await;
    let line = one_line_failure(&run(
        &["serve", "--listen", "127.0.0.1:0", "--database", &db.url],
        &[],
    ));
    assert!(line.contains("shortener migrate"), "{line}");
    let line = one_line_failure(&run(
        &["token", "create", "--user", "x", "--database", &db.url],
        &[],
    ));
    assert!(line.contains("shortener migrate"), "{line}");

    let first = run(&["migrate", "--database", &db.url], &[]);
    assert!(first.status.success(), "{first:?}");
    assert!(
        String::from_utf8_lossy(&first.stdout).contains(&format!(
            "applied {CURRENT_VERSION} migration(s); schema version {CURRENT_VERSION}"
        )),
        "{first:?}"
    );
    // The environment works as well as the flag; a second run changes nothing.
    let second = run(&["migrate"], &[("SHORTENER_DATABASE", &db.url)]);
    assert!(second.status.success(), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stdout).contains("applied 0 migration"),
        "{second:?}"
    );

    // And the TOML file: `database = "…"`.
    let dir = TempDir::new().unwrap();
    let cfg = dir.path().join("shortener.toml");
    std::fs::write(&cfg, format!("database = \"{}\"\n", db.url)).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .current_dir(dir.path())
        .env("SHORTENER_LOG", "warn")
        .env_remove("SHORTENER_DATABASE");
    let mut process = testkit::Process::spawn("shortener", cmd).unwrap();
    let line = process
        .wait_for_line("listening on ", Duration::from_secs(60))
        .unwrap();
    let base = line.trim_start_matches("listening on ");
    let resp = client().get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The embedded store (default ./data) was not created.
    assert!(!dir.path().join("data").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_database_fails_at_start_with_one_line() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let refused = format!("postgres://postgres:s3cret@127.0.0.1:{closed}/postgres");
    for args in [
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["migrate"],
        vec!["token", "create", "--user", "x"],
    ] {
        let mut with = args.clone();
        with.extend(["--database", &refused]);
        let line = one_line_failure(&run(&with, &[]));
        assert!(line.contains("cannot connect"), "{line}");
        assert!(line.contains(&format!("127.0.0.1:{closed}")), "{line}");
        assert!(!line.contains("s3cret"), "the password leaked: {line}");
    }

    let line = one_line_failure(&run(&["serve", "--database", "mysql://x/y"], &[]));
    assert!(line.contains("postgres://"), "{line}");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--database",
            "postgres://u:s3cret@127.0.0.1:notaport/db",
        ],
        &[],
    ));
    assert!(line.contains("port"), "{line}");
    assert!(!line.contains("s3cret"), "the password leaked: {line}");
    let line = one_line_failure(&run(
        &["migrate"],
        &[(
            "SHORTENER_DATABASE",
            "postgres://127.0.0.1/db?sslmode=require",
        )],
    ));
    assert!(line.contains("TLS"), "{line}");

    let mut missing = url::Url::parse(&common::pg::admin_url()).unwrap();
    missing.set_path("shortener_no_such_database");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            missing.as_str(),
        ],
        &[],
    ));
    assert!(line.contains("shortener_no_such_database"), "{line}");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--database-pool-size",
            "0",
            "--database",
            missing.as_str(),
        ],
        &[],
    ));
    assert!(line.contains("database-pool-size"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_cached_links_redirect_misses_fail_fast_and_recovery_is_automatic() {
    let db = TestDb::migrated().await;
    let mut relay = common::pg::relay().await;
    let dir = TempDir::new().unwrap();
    let url = common::pg::url_through(&relay, &db.url);
    let admin = token_in(&["--database", &url], "ops", true);
    let server = serve(&dir, &url, &[]);
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/hot", "custom_alias": "hot-link"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = c.get(server.url("/hot-link")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);

    relay.cut().await;
    // The cached link keeps redirecting.
    let resp = c.get(server.url("/hot-link")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    // A miss answers 503 at once, every time, never hangs.
    for i in 0..5 {
        let started = Instant::now();
        let resp = c
            .get(server.url(&format!("/cold{i}")))
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(common::error_code(resp).await, "store_unavailable");
        assert!(took < Duration::from_millis(100), "miss took {took:?}");
    }
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/new", "custom_alias": "while-down"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Still 200, so that a load balancer keeps an instance that serves cached links.
    assert_eq!(
        readiness(&c, &server).await,
        (
            StatusCode::OK,
            json!({"status": "degraded", "store": "unavailable"})
        )
    );

    relay.restore().await.unwrap();
    eventually("the store is ready again", || async {
        readiness(&c, &server).await.1["status"] == "ready"
    })
    .await;
    let resp = c.get(server.url("/cold0")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/new", "custom_alias": "after-down"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}
