//! Disable, enable and delete through the API and the CLI, the audit trail, and other
//! processes on the same store noticing changes without Redis: the real binary on the
//! embedded store and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair, cli};
use common::{
    Shortener, client, create, error_code, follow, get_json, one_line_failure, run, token_in,
    until_status,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn post(
    c: &reqwest::Client,
    server: &Shortener,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = c.post(server.url(path)).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().await.unwrap()
}

async fn info(c: &reqwest::Client, server: &Shortener, code: &str, token: &str) -> Value {
    get_json(c, server, &format!("/api/v1/links/{code}"), token).await
}

async fn audit(c: &reqwest::Client, server: &Shortener, query: &str, token: &str) -> Value {
    get_json(c, server, &format!("/api/v1/audit{query}"), token).await
}

fn actions(page: &Value) -> Vec<String> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} by {}",
                e["action"].as_str().unwrap(),
                e["actor"].as_str().unwrap()
            )
        })
        .collect()
}

/// The whole story on one store: `a` and `b` are two serving processes on it, `store` the
/// flags naming it for the CLI.
async fn disable_enable_delete_and_audit(a: &Shortener, b: &Shortener, store: &[&str]) {
    let c = client();
    let admin = token_in(store, "root", true);
    let alice = token_in(store, "alice", false);
    let bob = token_in(store, "bob", false);
    let resp = create(
        &c,
        a,
        json!({"long_url": "https://example.com/a", "custom_alias": "alices"}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let code = "alices";
    assert_eq!(follow(&c, a, code).await, StatusCode::FOUND);
    assert_eq!(follow(&c, b, code).await, StatusCode::FOUND);

    // The CLI disables: both processes answer 410 soon, without being told.
    let out = cli(
        &["link", "disable", code, "--reason", "reported phishing"],
        store,
    );
    assert!(out.contains("disabled (version 2)"), "{out}");
    until_status(&c, a, code, StatusCode::GONE).await;
    until_status(&c, b, code, StatusCode::GONE).await;
    let shown = info(&c, a, code, &alice).await;
    assert_eq!(shown["status"], "disabled");
    assert_eq!(shown["version"], 2);
    assert_eq!(shown["disabled"]["reason"], "reported phishing");
    assert_eq!(shown["disabled"]["by"], "cli");
    // The owner may not undo an admin's disable; another user learns nothing.
    let resp = post(&c, a, &format!("/api/v1/links/{code}/enable"), &alice, None).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(error_code(resp).await, "forbidden");
    let resp = post(&c, a, &format!("/api/v1/links/{code}/enable"), &bob, None).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // The CLI enables: both redirect again soon.
    let out = cli(&["link", "enable", code], store);
    assert!(out.contains("active (version 3)"), "{out}");
    until_status(&c, a, code, StatusCode::FOUND).await;
    until_status(&c, b, code, StatusCode::FOUND).await;

    // The owner disables through `a`: `a` answers 410 at once, `b` soon; the owner may
    // enable their own disable.
    let disable = |reason: &str| json!({ "reason": reason });
    let resp = post(
        &c,
        a,
        &format!("/api/v1/links/{code}/disable"),
        &alice,
        Some(disable("moved")),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (
            body["status"].as_str(),
            body["disabled"]["by_kind"].as_str()
        ),
        (Some("disabled"), Some("user"))
    );
    assert_eq!(follow(&c, a, code).await, StatusCode::GONE);
    until_status(&c, b, code, StatusCode::GONE).await;
    // Disabling again keeps the first reason and the version.
    let again: Value = post(
        &c,
        b,
        &format!("/api/v1/links/{code}/disable"),
        &admin,
        Some(disable("other")),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        (
            again["disabled"]["reason"].as_str(),
            again["version"].as_u64()
        ),
        (Some("moved"), Some(4))
    );
    let resp = post(&c, b, &format!("/api/v1/links/{code}/enable"), &alice, None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(follow(&c, b, code).await, StatusCode::FOUND);
    until_status(&c, a, code, StatusCode::FOUND).await;

    // Bad input: nothing changes.
    for bad in [
        json!({}),
        json!({"reason": ""}),
        json!({"reason": "x".repeat(501)}),
        json!({"reason": "ok", "extra": 1}),
    ] {
        let resp = post(
            &c,
            a,
            &format!("/api/v1/links/{code}/disable"),
            &admin,
            Some(bad.clone()),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let resp = post(
        &c,
        a,
        "/api/v1/links/nosuchcode/disable",
        &admin,
        Some(disable("x")),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let out = run(
        &[&["link", "disable", "nosuchcode", "--reason", "x"], store].concat(),
        &[],
    );
    assert!(one_line_failure(&out).contains("no link"));
    let out = run(
        &[&["link", "disable", code, "--reason", ""], store].concat(),
        &[],
    );
    assert!(one_line_failure(&out).contains("reason"));
    assert_eq!(follow(&c, a, code).await, StatusCode::FOUND);

    // Delete is final: 410 everywhere, never enabled again.
    let resp = c
        .delete(a.url(&format!("/api/v1/links/{code}")))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(follow(&c, a, code).await, StatusCode::GONE);
    until_status(&c, b, code, StatusCode::GONE).await;
    let resp = post(&c, a, &format!("/api/v1/links/{code}/enable"), &admin, None).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(error_code(resp).await, "link_deleted");
    let out = run(&[&["link", "enable", code], store].concat(), &[]);
    assert!(one_line_failure(&out).contains("deleted"));
    assert_eq!(info(&c, b, code, &admin).await["status"], "deleted");
    let resp = create(
        &c,
        a,
        json!({"long_url": "https://example.com/b", "custom_alias": code}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);

    // The trail: every change, newest first, with who and from where.
    let page = audit(&c, a, &format!("?code={code}"), &admin).await;
    assert_eq!(
        actions(&page),
        [
            "deleted by alice",
            "enabled by alice",
            "disabled by alice",
            "enabled by cli",
            "disabled by cli",
            "created by alice"
        ]
    );
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries[2]["detail"], "moved");
    assert_eq!(entries[2]["ip"], "127.0.0.1");
    assert!(
        entries[2]["user_agent"]
            .as_str()
            .unwrap()
            .starts_with("Mozilla/5.0")
    );
    assert_eq!(entries[5]["new_url"], "https://example.com/a");
    assert!(page["next_cursor"].is_null());
    // Paging by cursor, filters, and refusals.
    let first = audit(&c, b, &format!("?code={code}&limit=4"), &admin).await;
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let rest = audit(
        &c,
        b,
        &format!("?code={code}&limit=4&cursor={cursor}"),
        &admin,
    )
    .await;
    assert_eq!(actions(&rest), ["disabled by cli", "created by alice"]);
    let tokens = audit(&c, a, "?action=token_issued&actor=cli", &admin).await;
    assert_eq!(tokens["entries"].as_array().unwrap().len(), 3);
    let future = audit(&c, a, "?since=2100-01-01T00:00:00Z", &admin).await;
    assert_eq!(future["entries"].as_array().unwrap().len(), 0);
    for bad in [
        "?limit=501",
        "?limit=0",
        "?limit=x",
        "?since=yesterday",
        "?action=nope",
        "?cursor=zzz",
        "?colour=red",
    ] {
        let resp = c
            .get(a.url(&format!("/api/v1/audit{bad}")))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
        error_code(resp).await;
    }
    let resp = c
        .get(a.url("/api/v1/audit"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // The CLI reads the same trail.
    let text = cli(&["audit", "--code", code], store);
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(text.lines().next().unwrap().contains("deleted"), "{text}");
    let lines = cli(&["audit", "--code", code, "--json", "--limit", "2"], store);
    let rows: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["action"], "enabled");
    let out = run(&[&["audit", "--since", "last week"], store].concat(), &[]);
    assert!(one_line_failure(&out).contains("RFC 3339"));
}

async fn on(kind: Kind) {
    let pair = Pair::start(kind, &[]).await;
    disable_enable_delete_and_audit(&pair.a, &pair.b, &pair.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_two_processes_and_the_cli_share_changes_and_the_trail() {
    on(Kind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_two_instances_and_the_cli_share_changes_and_the_trail() {
    on(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_changes_made_without_redis_still_reach_l1_and_l2_everywhere() {
    // The CLI runs without --redis: the instances must fix their L1 and the shared L2
    // from the store's change sequence alone.
    on(Kind::ScaleOut).await;
}
