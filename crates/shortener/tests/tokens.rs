//! `token create --name`, `token list` and `token revoke` against the real binary, with two
//! serving processes on one store: a revoked token is refused by both, the list never shows
//! a secret, and bad ids fail in one line. On the embedded store, on PostgreSQL, and on
//! PostgreSQL with `--redis` (whose caches hold links, never tokens).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::{NOTICED_WITHIN, Shortener, client, error_code, one_line_failure, run};
use reqwest::StatusCode;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// `shortener token …` on the store `store` names; asserts success and returns stdout.
fn cli(args: &[&str], store: &[&str]) -> String {
    let out = run(&[args, store].concat(), &[]);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The status `GET /api/v1/links` answers `token` on `server`.
async fn links_status(c: &reqwest::Client, server: &Shortener, token: &str) -> StatusCode {
    c.get(server.url("/api/v1/links"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
}

async fn create_list_revoke(a: &Shortener, b: &Shortener, store: &[&str]) {
    let c = client();
    let out = cli(
        &["token", "create", "--user", "alice", "--name", "ci deploy"],
        store,
    );
    let secret = out.lines().last().unwrap().to_owned();
    // The first line names the token by its public id, which is not the secret.
    let id = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_owned();
    assert_eq!(id.len(), 12, "{out}");
    assert!(!secret.contains(&id));
    let other = cli(&["token", "create", "--user", "bob", "--admin"], store);
    let other = other.lines().last().unwrap().to_owned();

    for server in [a, b] {
        assert_eq!(links_status(&c, server, &secret).await, StatusCode::OK);
    }
    let list = cli(&["token", "list"], store);
    assert!(
        !list.contains(&secret) && !list.contains(&secret[4..]),
        "{list}"
    );
    let row = list.lines().find(|l| l.starts_with(&id)).expect("listed");
    let fields: Vec<&str> = row.split('\t').collect();
    assert_eq!(&fields[..4], [id.as_str(), "alice", "\"ci deploy\"", "no"]);
    // The requests above recorded a last use (written in the background).
    let since = Instant::now();
    while cli(&["token", "list"], store)
        .lines()
        .any(|l| l.starts_with(&id) && l.ends_with("never"))
    {
        assert!(since.elapsed() < NOTICED_WITHIN, "last use never recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let revoked = cli(&["token", "revoke", &id], store);
    assert!(
        revoked.contains(&id) && revoked.contains("alice"),
        "{revoked}"
    );
    for server in [a, b] {
        let since = Instant::now();
        while links_status(&c, server, &secret).await != StatusCode::UNAUTHORIZED {
            assert!(
                since.elapsed() < NOTICED_WITHIN,
                "revoked token still accepted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let resp = c
            .get(server.url("/api/v1/links"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(resp).await, "invalid_token");
        // Other tokens are untouched.
        assert_eq!(links_status(&c, server, &other).await, StatusCode::OK);
    }
    assert!(!cli(&["token", "list"], store).contains(&id));
    let trail = cli(&["audit", "--action", "token_revoked"], store);
    assert!(trail.contains(&id) && trail.contains("cli"), "{trail}");

    // Bad input: one line, non-zero exit, nothing changed.
    let again = run(&[&["token", "revoke", id.as_str()], store].concat(), &[]);
    assert!(one_line_failure(&again).contains(&format!("no token {id}")));
    let out = run(&[&["token", "revoke", "not-an-id"], store].concat(), &[]);
    assert!(one_line_failure(&out).contains("12 hex digits"));
    let out = run(
        &[
            &["token", "create", "--user", "carol", "--name", "a\nb"],
            store,
        ]
        .concat(),
        &[],
    );
    assert!(one_line_failure(&out).contains("token name"));
    assert_eq!(
        cli(&["token", "list"], store).lines().count(),
        2,
        "header and bob"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_a_revoked_token_is_refused_by_every_process() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let a = Shortener::start(dir.path(), &[]);
    let b = Shortener::start(dir.path(), &[]);
    create_list_revoke(&a, &b, &["--data-dir", &data]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_revoked_token_is_refused_by_every_instance() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let a = Shortener::start(dir.path(), &["--database", &db.url]);
    let b = Shortener::start(dir.path(), &["--database", &db.url]);
    create_list_revoke(&a, &b, &["--database", &db.url]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_a_revoked_token_is_refused_by_every_instance() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let redis = testkit::RedisServer::start(dir.path()).unwrap();
    let flags = ["--database", db.url.as_str(), "--redis", &redis.url()];
    let a = Shortener::start(dir.path(), &flags);
    let b = Shortener::start(dir.path(), &flags);
    create_list_revoke(&a, &b, &["--database", &db.url]).await;
}
