//! `token create --name`, `token list` and `token revoke` against the real binary, with two
//! serving processes on one store: a revoked token is refused by both, the list never shows
//! a secret, and bad ids fail in one line. On the embedded store, on PostgreSQL, and on
//! PostgreSQL with `--redis` (whose caches hold links, never tokens).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair, cli, new_token};
use common::{Shortener, client, error_code, noticed, one_line_failure, run};
use reqwest::StatusCode;

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
    let (secret, id) = new_token(store, &["--user", "alice", "--name", "ci deploy"]);
    // The first line names the token by its public id, which is not the secret.
    assert_eq!(id.len(), 12, "{id}");
    assert!(!secret.contains(&id));
    let (other, _) = new_token(store, &["--user", "bob", "--admin"]);

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
    noticed("the last use recorded", || async {
        !cli(&["token", "list"], store)
            .lines()
            .any(|l| l.starts_with(&id) && l.ends_with("never"))
    })
    .await;

    let revoked = cli(&["token", "revoke", &id], store);
    assert!(
        revoked.contains(&id) && revoked.contains("alice"),
        "{revoked}"
    );
    for server in [a, b] {
        noticed("the revoked token refused", || async {
            links_status(&c, server, &secret).await == StatusCode::UNAUTHORIZED
        })
        .await;
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

async fn on(kind: Kind) {
    let pair = Pair::start(kind, &[]).await;
    create_list_revoke(&pair.a, &pair.b, &pair.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_a_revoked_token_is_refused_by_every_process() {
    on(Kind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_revoked_token_is_refused_by_every_instance() {
    on(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_a_revoked_token_is_refused_by_every_instance() {
    on(Kind::ScaleOut).await;
}
