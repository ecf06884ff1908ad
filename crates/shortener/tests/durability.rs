//! Concurrency, restarts and crashes against the real binary and its embedded store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair};
use common::pg::TestDb;
use common::{Shortener, client, create, eventually, metric, token, token_in};
use reqwest::StatusCode;
use serde_json::{Value, json};
use shortener::store::Store;
use shortener::store::sqlite::SqliteStore;
use shortener_core::audit::{AuditAction, AuditQuery};
use shortener_core::code::{CodePermutation, encode_id};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tempfile::TempDir;

async fn create_many(
    c: &reqwest::Client,
    server: &Shortener,
    token: &str,
    n: usize,
    concurrency: usize,
    tag: &str,
) -> Vec<(String, String)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (c, url, token, next, tag) = (
            c.clone(),
            server.url("/api/v1/links"),
            token.to_owned(),
            next.clone(),
            tag.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return made;
                }
                let long_url = format!("https://example.com/{tag}/{i}");
                let resp = c
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&json!({ "long_url": long_url }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::CREATED);
                let body: Value = resp.json().await.unwrap();
                made.push((body["short_code"].as_str().unwrap().to_owned(), long_url));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn assert_codes_well_formed_and_distinct(links: &[(String, String)]) {
    let codes: HashSet<&str> = links.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(codes.len(), links.len(), "duplicate codes");
    for code in codes {
        assert_eq!(code.len(), 7, "{code}");
        assert!(code.bytes().all(|b| b.is_ascii_alphanumeric()), "{code}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_alias_raced_by_100_clients_has_exactly_one_winner() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let admin = token(dir.path(), "ops", true);
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (c, url, admin) = (c.clone(), server.url("/api/v1/links"), admin.clone());
        tasks.push(tokio::spawn(async move {
            let resp = c
                .post(url)
                .bearer_auth(admin)
                .json(&json!({"long_url": format!("https://example.com/{i}"), "custom_alias": "contested"}))
                .send()
                .await
                .unwrap();
            (resp.status(), i)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            (StatusCode::CREATED, i) => winners.push(i),
            (StatusCode::CONFLICT, _) => conflicts += 1,
            (other, _) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(winners.len(), 1);
    assert_eq!(conflicts, 99);
    let resp = c.get(server.url("/contested")).send().await.unwrap();
    assert_eq!(
        resp.headers()["location"].to_str().unwrap(),
        format!("https://example.com/{}", winners[0])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_generated_codes_are_distinct_and_survive_a_restart() {
    let dir = TempDir::new().unwrap();
    // Small blocks so that the run leases many of them.
    let flags = ["--id-block-size", "250", "--click-flush-ms", "100"];
    let mut server = Shortener::start(dir.path(), &flags);
    let admin = token(dir.path(), "ops", true);
    let c = client();
    let links = create_many(&c, &server, &admin, 10_000, 32, "first").await;
    assert_eq!(links.len(), 10_000);
    assert_codes_well_formed_and_distinct(&links);

    let clicked = &links[0].0;
    for _ in 0..7 {
        let resp = c
            .get(server.url(&format!("/{clicked}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FOUND);
    }
    let total = |server_url: String, admin: String, c: reqwest::Client| async move {
        c.get(server_url)
            .bearer_auth(admin)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["total_clicks"]
            .as_u64()
            .unwrap()
    };
    let analytics = server.url(&format!("/api/v1/links/{clicked}/analytics"));
    eventually("7 clicks", || {
        let pending = total(analytics.clone(), admin.clone(), c.clone());
        async move { pending.await == 7 }
    })
    .await;

    let status = server.process.terminate().unwrap();
    assert!(status.success(), "clean shutdown: {status:?}");
    let server = Shortener::start(dir.path(), &flags);
    // Links, tokens and counters are all still there.
    for (code, long_url) in links.iter().skip(1).step_by(97) {
        let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::FOUND, "{code}");
        assert_eq!(resp.headers()["location"].to_str().unwrap(), long_url);
    }
    let analytics = server.url(&format!("/api/v1/links/{clicked}/analytics"));
    assert_eq!(total(analytics, admin.clone(), c.clone()).await, 7);
    // Ids continue after the restart: no code is handed out twice.
    let more = create_many(&c, &server, &admin, 500, 8, "second").await;
    let mut all = links.clone();
    all.extend(more);
    assert_codes_well_formed_and_distinct(&all);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_one_store_never_collide() {
    let pair = Pair::start(Kind::Embedded, &["--id-block-size", "100"]).await;
    let (a, b) = (&pair.a, &pair.b);
    let admin = token(pair.dir.path(), "ops", true);
    let c = client();
    let (from_a, from_b) = tokio::join!(
        create_many(&c, a, &admin, 1500, 16, "a"),
        create_many(&c, b, &admin, 1500, 16, "b"),
    );
    let mut all = from_a;
    all.extend(from_b);
    assert_codes_well_formed_and_distinct(&all);
    // Each process sees the other's links.
    for (code, long_url) in all.iter().step_by(50) {
        for server in [a, b] {
            let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
            assert_eq!(resp.headers()["location"].to_str().unwrap(), long_url);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_generated_code_held_by_an_alias_is_skipped() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    // The key is created at first start; the first generated id of a fresh store is 0.
    let db = rusqlite::Connection::open(dir.path().join("shortener.db")).unwrap();
    let key: Vec<u8> = db
        .query_row("SELECT value FROM meta WHERE key = 'code_key'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let next = encode_id(CodePermutation::new(key.try_into().unwrap()).permute(0)).unwrap();
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/alias", "custom_alias": next}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED, "alias {next}");
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/generated"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: Value = resp.json().await.unwrap();
    assert_ne!(body["short_code"], next.as_str());
    let resp = c.get(server.url(&format!("/{next}"))).send().await.unwrap();
    assert_eq!(resp.headers()["location"], "https://example.com/alias");
    assert_eq!(
        metric(&c, &server, "shortener_generated_code_skips_total").await,
        1.0
    );
}

/// Creates from 48 clients until 2 000 are acknowledged, then kill -9; the acknowledged
/// (code, destination) pairs.
async fn creates_until_kill_dash_nine(
    server: &mut Shortener,
    admin: &str,
) -> Vec<(String, String)> {
    let c = client();
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..48 {
        let (c, url, admin, acknowledged, stop) = (
            c.clone(),
            server.url("/api/v1/links"),
            admin.to_owned(),
            acknowledged.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let long_url = format!("https://example.com/crash/{w}/{i}");
                let Ok(resp) = c
                    .post(&url)
                    .bearer_auth(&admin)
                    .json(&json!({"long_url": long_url}))
                    .send()
                    .await
                else {
                    return; // the server is gone
                };
                if resp.status() != StatusCode::CREATED {
                    continue;
                }
                let Ok(body) = resp.json::<Value>().await else {
                    return;
                };
                acknowledged
                    .lock()
                    .unwrap()
                    .push((body["short_code"].as_str().unwrap().to_owned(), long_url));
            }
        }));
    }
    eventually("a few thousand acknowledged creates", || async {
        acknowledged.lock().unwrap().len() >= 2000
    })
    .await;
    server.process.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(acknowledged.len() >= 2000);
    acknowledged
}

/// After a crash: every acknowledged create has its `created` audit row, and every such
/// row has its link, with the same destination.
async fn audit_matches_links(store: &dyn Store, acknowledged: &[(String, String)]) {
    let mut audited = HashMap::new();
    let mut query = AuditQuery {
        action: Some(AuditAction::Created),
        limit: 500,
        ..AuditQuery::default()
    };
    loop {
        let rows = store.audit(&query).await.unwrap();
        for row in &rows {
            audited.insert(
                row.record.code.clone().unwrap(),
                row.record.new_url.clone().unwrap(),
            );
        }
        match rows.last() {
            Some(last) if rows.len() == query.limit => query.before = Some(last.id),
            _ => break,
        }
    }
    let unaudited: Vec<_> = acknowledged
        .iter()
        .filter(|(code, url)| audited.get(code) != Some(url))
        .collect();
    assert!(
        unaudited.is_empty(),
        "201s without their audit row: {unaudited:?}"
    );
    let mut orphans = Vec::new();
    for (code, url) in &audited {
        match store.get_link(code).await.unwrap() {
            Some(link) if &link.long_url == url => {}
            other => orphans.push((code.clone(), other)),
        }
    }
    assert!(
        orphans.is_empty(),
        "audit rows without their link: {orphans:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_201_survives_kill_dash_nine_with_its_audit_row() {
    let dir = TempDir::new().unwrap();
    let mut server = Shortener::start(dir.path(), &[]);
    let admin = token(dir.path(), "ops", true);
    let c = client();
    let acknowledged = creates_until_kill_dash_nine(&mut server, &admin).await;
    audit_matches_links(&SqliteStore::open(dir.path()).unwrap(), &acknowledged).await;

    let server = Shortener::start(dir.path(), &[]);
    let mut missing = Vec::new();
    for (code, long_url) in &acknowledged {
        let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
        if resp.status() != StatusCode::FOUND
            || resp.headers()["location"].to_str().unwrap() != long_url
        {
            missing.push(code.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged links lost: {missing:?}",
        missing.len(),
        acknowledged.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_every_201_has_its_audit_row_after_kill_dash_nine() {
    let db = TestDb::migrated().await;
    let dir = TempDir::new().unwrap();
    let mut server = Shortener::start(dir.path(), &["--database", &db.url]);
    let admin = token_in(&["--database", &db.url], "ops", true);
    let acknowledged = creates_until_kill_dash_nine(&mut server, &admin).await;
    audit_matches_links(&db.store(2).await, &acknowledged).await;
}
