//! Read replicas: a private PostgreSQL primary and a streaming standby started by the test;
//! redirects keep working with the replica stopped, read-your-writes while its replay is
//! paused, analytics read from the replica agree once it caught up; an instance starts with
//! its replica down and uses it once it answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::load::{Load, since};
use common::pg::migrated_on;
use common::{
    Shortener, analytics, client, create, eventually, metric, noticed, one_line_failure, readiness,
    run, token_in, token_with_id,
};
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::Postgres;

const HOT: usize = 10;
const OUTAGE: Duration = Duration::from_secs(3);

async fn sql(server: &Postgres, statement: &str) {
    let (client, connection) =
        tokio_postgres::connect(&server.url("shortener"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client.batch_execute(statement).await.unwrap();
}

async fn status(c: &reqwest::Client, server: &Shortener, path: &str) -> StatusCode {
    c.get(server.url(path)).send().await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_serve_reads_and_a_stopped_or_paused_one_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let primary = Postgres::primary(&dir.path().join("primary")).unwrap();
    let url = migrated_on(&primary).await;
    let mut standby = primary.standby(&dir.path().join("standby")).unwrap();
    let replica_url = standby.url("shortener");
    let replica = format!(
        "shortener_replica_healthy{{replica=\"postgres@127.0.0.1:{}/shortener\"}}",
        standby.port()
    );
    let admin = token_in(&["--database", &url], "ops", true);
    let flags = |data: &str, timeout_ms: &str| {
        let dir = dir.path().join(data);
        let flags = [
            "--database",
            &url,
            "--database-replica",
            &replica_url,
            "--cache-ttl",
            "1",
            "--store-timeout-ms",
            timeout_ms,
        ];
        Shortener::start(&dir, &flags)
    };
    // A writes; B only reads, so its misses go to the replica. A's creates are set-up, not
    // what is measured: on a shared 2-core machine one took longer than the default 250 ms
    // deadline (a 503), so A waits longer; B, under test, keeps the default.
    let a = flags("a", "10000");
    let b = flags("b", "250");
    let c = client();
    let mut hot = Vec::new();
    for i in 0..HOT {
        let body = json!({"long_url": format!("https://example.com/{i}"), "custom_alias": format!("hot-{i}")});
        assert_eq!(
            create(&c, &a, body, Some(&admin)).await.status(),
            StatusCode::CREATED
        );
        hot.push(b.url(&format!("/hot-{i}")));
    }
    let body = json!({"long_url": "https://example.com/counted", "custom_alias": "counted"});
    assert_eq!(
        create(&c, &a, body, Some(&admin)).await.status(),
        StatusCode::CREATED
    );
    eventually("B sees A's links through the replica", || async {
        status(&c, &b, "/hot-0").await == StatusCode::FOUND
    })
    .await;
    assert!(metric(&c, &b, "shortener_replica_reads_total").await > 0.0);
    assert_eq!(metric(&c, &b, &replica).await, 1.0);

    // (1) The replica stops: B's misses fall back to the primary.
    let load = Load::start(c.clone(), hot.clone(), 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = load.tally();
    standby.stop().unwrap();
    eventually("the stopped replica is skipped", || async {
        metric(&c, &b, &replica).await == 0.0
    })
    .await;
    tokio::time::sleep(OUTAGE).await;
    let stopped = since(before, load.tally());
    let restarted = Instant::now();
    standby.start().unwrap();
    eventually("the replica is back in use", || async {
        metric(&c, &b, &replica).await == 1.0
    })
    .await;
    let back_after = restarted.elapsed();

    // (2) The replica frozen (accepts, never answers): skipped too, nothing lost.
    let before = load.tally();
    standby.freeze().unwrap();
    eventually("the frozen replica is skipped", || async {
        metric(&c, &b, &replica).await == 0.0
    })
    .await;
    tokio::time::sleep(OUTAGE).await;
    let frozen = since(before, load.tally());
    let thawed = Instant::now();
    standby.thaw().unwrap();
    eventually("the replica is back in use", || async {
        metric(&c, &b, &replica).await == 1.0
    })
    .await;
    let thawed_after = thawed.elapsed();
    let total = load.stop().await;
    eprintln!(
        "steady load of {HOT} links on B (cache TTL 1 s): replica stopped {OUTAGE:?}+: {} redirected, {} failed, back in use {back_after:?} after pg_ctl start began; \
         replica frozen {OUTAGE:?}+: {} redirected, {} failed, back in use {thawed_after:?} after SIGCONT; whole run {} redirected, {} failed",
        stopped.redirected,
        stopped.failed,
        frozen.redirected,
        frozen.failed,
        total.redirected,
        total.failed
    );
    assert_eq!(total.failed, 0);

    // (3) Replay paused: a fresh create redirects on the instance that made it at once; B
    // gets it once the replica, lagging past the bound, is skipped.
    sql(&standby, "SELECT pg_wal_replay_pause()").await;
    let body = json!({"long_url": "https://example.com/fresh", "custom_alias": "fresh"});
    assert_eq!(
        create(&c, &a, body, Some(&admin)).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(status(&c, &a, "/fresh").await, StatusCode::FOUND);
    for _ in 0..20 {
        assert_eq!(status(&c, &a, "/fresh").await, StatusCode::FOUND);
    }
    eventually("B skips the lagging replica", || async {
        status(&c, &b, "/fresh").await == StatusCode::FOUND
    })
    .await;
    assert_eq!(metric(&c, &b, &replica).await, 0.0);

    // (4) Clicks counted on the primary; B's analytics read the replica once it caught up.
    for _ in 0..7 {
        assert_eq!(status(&c, &a, "/counted").await, StatusCode::FOUND);
    }
    sql(&standby, "SELECT pg_wal_replay_resume()").await;
    eventually("the replica is in use again", || async {
        metric(&c, &b, &replica).await == 1.0
    })
    .await;
    let reads_before = metric(&c, &b, "shortener_replica_reads_total").await;
    eventually("B's analytics show A's clicks", || async {
        analytics(&c, &b, "counted", &admin).await["total_clicks"] == json!(7)
    })
    .await;
    assert!(metric(&c, &b, "shortener_replica_reads_total").await > reads_before);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_starts_with_its_replica_down_and_uses_it_once_it_answers() {
    let dir = TempDir::new().unwrap();
    let primary = Postgres::primary(&dir.path().join("primary")).unwrap();
    let url = migrated_on(&primary).await;
    let mut standby = primary.standby(&dir.path().join("standby")).unwrap();
    let name = format!("postgres@127.0.0.1:{}/shortener", standby.port());
    let healthy = format!("shortener_replica_healthy{{replica=\"{name}\"}}");
    standby.stop().unwrap();
    let admin = token_in(&["--database", &url], "ops", true);
    let server = Shortener::start(
        &dir.path().join("app"),
        &[
            "--database",
            &url,
            "--database-replica",
            &standby.url("shortener"),
        ],
    );
    let c = client();
    assert_eq!(metric(&c, &server, &healthy).await, 0.0);
    let body = readiness(&c, &server).await.1;
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(body["replicas"][&name], "skipped", "{body}");
    // The primary serves meanwhile.
    let body = json!({"long_url": "https://example.com/away", "custom_alias": "away"});
    assert_eq!(
        create(&c, &server, body, Some(&admin)).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(status(&c, &server, "/away").await, StatusCode::FOUND);
    let primary_reads = metric(&c, &server, "shortener_primary_reads_total").await;
    assert_eq!(status(&c, &server, "/not-yet").await, StatusCode::NOT_FOUND);
    assert!(metric(&c, &server, "shortener_primary_reads_total").await > primary_reads);
    assert_eq!(
        metric(&c, &server, "shortener_replica_reads_total").await,
        0.0
    );

    let started = Instant::now();
    standby.start().unwrap();
    eventually("the replica is in use once it answers", || async {
        metric(&c, &server, &healthy).await == 1.0
    })
    .await;
    eprintln!(
        "a replica down at start: in use {:?} after pg_ctl start began",
        started.elapsed()
    );
    assert_eq!(readiness(&c, &server).await.1["replicas"][&name], "ok");
    assert_eq!(
        status(&c, &server, "/never-made").await,
        StatusCode::NOT_FOUND
    );
    assert!(metric(&c, &server, "shortener_replica_reads_total").await > 0.0);
}

#[test]
fn a_replica_needs_a_primary_and_a_postgres_url() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let line = one_line_failure(&run(
        &[
            "serve",
            "--data-dir",
            data,
            "--database-replica",
            "postgres://x@127.0.0.1/db",
        ],
        &[],
    ));
    assert!(
        line.contains("--database-replica needs --database"),
        "{line}"
    );
    let line = one_line_failure(&run(
        &[
            "serve",
            "--database",
            "postgres://x@127.0.0.1/db",
            "--database-replica",
            "mysql://x@127.0.0.1/db",
        ],
        &[],
    ));
    assert!(line.contains("database-replica"), "{line}");
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--replica-max-lag-ms", "5"],
        &[],
    ));
    assert!(line.contains("replica-max-lag-ms"), "{line}");

    // The environment's comma-separated list and the file's array are read too: a bad
    // second entry in either is refused the same way.
    let list = "postgres://x@127.0.0.1/db,mysql://x@127.0.0.1/db";
    let line = one_line_failure(&run(
        &["serve", "--database", "postgres://x@127.0.0.1/db"],
        &[("SHORTENER_DATABASE_REPLICA", list)],
    ));
    assert!(
        line.contains("database-replica: database must be a postgres://"),
        "{line}"
    );
    // The start's one line with a config file of `replicas` and no --database.
    let with_file = |replicas: &str| {
        let config = dir.path().join("shortener.toml");
        std::fs::write(&config, format!("database_replica = {replicas}\n")).unwrap();
        one_line_failure(&run(
            &[
                "serve",
                "--config",
                config.to_str().unwrap(),
                "--data-dir",
                data,
            ],
            &[],
        ))
    };
    let line = with_file(r#"["postgres://x@127.0.0.1/db", "mysql://x@127.0.0.1/db"]"#);
    assert!(
        line.contains("database-replica: database must be a postgres://"),
        "{line}"
    );
    // Good URLs, but without --database the file's replicas have no primary.
    let line = with_file(r#"["postgres://x@127.0.0.1/db"]"#);
    assert!(
        line.contains("--database-replica needs --database"),
        "{line}"
    );
}

/// Rows of `table` on `server` (the primary or a standby).
async fn rows(server: &Postgres, table: &str) -> i64 {
    let (client, connection) =
        tokio_postgres::connect(&server.url("shortener"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap();
    row.get(0)
}

/// A revoke on the primary is refused by an instance whose replica has not replayed it
/// (the lag bound set high, so the replica stays in use): tokens are looked up on the
/// primary, and cached only briefly.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_is_refused_while_the_replica_still_holds_it() {
    let dir = TempDir::new().unwrap();
    let primary = Postgres::primary(&dir.path().join("primary")).unwrap();
    let url = migrated_on(&primary).await;
    let standby = primary.standby(&dir.path().join("standby")).unwrap();
    let (secret, id) = token_with_id(&["--database", &url], "alice");
    let server = Shortener::start(
        &dir.path().join("app"),
        &[
            "--database",
            &url,
            "--database-replica",
            &standby.url("shortener"),
            "--replica-max-lag-ms",
            "600000",
        ],
    );
    let c = client();
    let links = || async {
        c.get(server.url("/api/v1/links"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(links().await, StatusCode::OK);
    eventually("the replica has the token", || async {
        rows(&standby, "tokens").await == 1
    })
    .await;
    sql(&standby, "SELECT pg_wal_replay_pause()").await;
    let out = run(&["token", "revoke", &id, "--database", &url], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(rows(&primary, "tokens").await, 0);
    noticed("the revoked token refused", || async {
        links().await == StatusCode::UNAUTHORIZED
    })
    .await;
    // The replica still holds it: only the primary's answer refused it.
    assert_eq!(rows(&standby, "tokens").await, 1);
    sql(&standby, "SELECT pg_wal_replay_resume()").await;
}
