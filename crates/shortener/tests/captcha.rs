//! The CAPTCHA of anonymous creation against the real binary: solve, replay, expiry,
//! forgery, the modes, and replays refused across processes on one store (with and without
//! Redis).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::pair::{Kind, Pair};
use common::{Shortener, client, error_code, token};
use reqwest::StatusCode;
use serde_json::{Value, json};
use shortener::store::sqlite::SqliteStore;
use shortener_core::altcha::{self, Challenge};
use shortener_core::store::LinkStore;
use tempfile::TempDir;

fn challenge_of(v: &Value) -> Challenge {
    Challenge {
        algorithm: altcha::ALGORITHM,
        challenge: v["challenge"].as_str().unwrap().to_owned(),
        maxnumber: v["maxnumber"].as_u64().unwrap(),
        salt: v["salt"].as_str().unwrap().to_owned(),
        signature: v["signature"].as_str().unwrap().to_owned(),
    }
}

/// The base64 payload a client sends for `c` solved with `number`.
fn payload(c: &Challenge, number: u64) -> String {
    STANDARD.encode(
        json!({
            "algorithm": c.algorithm, "challenge": c.challenge, "number": number,
            "salt": c.salt, "signature": c.signature,
        })
        .to_string(),
    )
}

/// Solves a fresh challenge of `server`, as the widget does.
async fn solved(c: &reqwest::Client, server: &Shortener) -> String {
    let v: Value = c
        .get(server.url("/api/v1/challenge"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["algorithm"], "SHA-256");
    assert!(v["salt"].as_str().unwrap().contains("?expires="));
    let challenge = challenge_of(&v);
    payload(&challenge, altcha::solve(&challenge).unwrap())
}

async fn create(
    c: &reqwest::Client,
    server: &Shortener,
    altcha: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut req = c.post(server.url("/api/v1/links")).json(&body);
    if let Some(altcha) = altcha {
        req = req.header("x-altcha", altcha);
    }
    req.send().await.unwrap()
}

fn url(i: usize) -> Value {
    json!({ "long_url": format!("https://example.com/{i}") })
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_mode_asks_near_the_limit_and_takes_each_solution_once() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let flags = [
        "--anon-creates-per-hour",
        "20",
        "--captcha-after",
        "0.1",
        "--captcha-max-number",
        "2000",
        "--user-creates-per-hour",
        "3",
    ];
    let server = Shortener::start(&data, &flags);
    let c = client();
    // Under 2 of 20 used: no question asked.
    for i in 0..2 {
        assert_eq!(
            create(&c, &server, None, url(i)).await.status(),
            StatusCode::CREATED
        );
    }
    // The third: 428 with a challenge in the body.
    let resp = create(&c, &server, None, url(2)).await;
    assert_eq!(resp.status(), StatusCode::PRECONDITION_REQUIRED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "captcha_required");
    let challenge = challenge_of(&body["challenge"]);
    assert_eq!(challenge.maxnumber, 2000);
    let good = payload(&challenge, altcha::solve(&challenge).unwrap());
    assert_eq!(
        create(&c, &server, Some(&good), url(3)).await.status(),
        StatusCode::CREATED
    );
    // Replayed: refused.
    let resp = create(&c, &server, Some(&good), url(4)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(resp).await, "captcha_invalid");
    // In the body instead of the header.
    let fresh = solved(&c, &server).await;
    let mut with_field = url(5);
    with_field["altcha"] = json!(fresh);
    assert_eq!(
        create(&c, &server, None, with_field).await.status(),
        StatusCode::CREATED
    );

    // Forged: a signature of our own, a wrong number, garbage.
    let v: Value = c
        .get(server.url("/api/v1/challenge"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut forged = challenge_of(&v);
    let number = altcha::solve(&forged).unwrap();
    forged.signature = "00".repeat(32);
    let wrong = challenge_of(&v);
    for bad in [
        payload(&forged, number),
        payload(&wrong, number + 1),
        "not base64!".to_owned(),
        STANDARD.encode("{\"algorithm\": \"SHA-256\"}"),
    ] {
        let resp = create(&c, &server, Some(&bad), url(6)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_code(resp).await, "captcha_invalid");
    }
    // Expired: signed with the server's own key (read from its store), expiry passed.
    let store = SqliteStore::open(&data).unwrap();
    let key = store.secret("captcha_key", vec![0; 32]).await.unwrap();
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let old = altcha::create(&key, [9; 12], 17, 100, now - 1);
    let resp = create(&c, &server, Some(&payload(&old, 17)), url(7)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(resp.text().await.unwrap().contains("expired"));
    // The same key, unexpired, is accepted: the key is the one in the store.
    let fine = altcha::create(&key, [8; 12], 17, 100, now + 60);
    let resp = create(&c, &server, Some(&payload(&fine, 17)), url(8)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);

    // Authenticated users are never asked, whatever their budget.
    let alice = token(&data, "alice", false);
    for i in 0..3 {
        let resp = c
            .post(server.url("/api/v1/links"))
            .bearer_auth(&alice)
            .json(&url(100 + i))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn always_asks_at_once_and_off_never_does() {
    let dir = TempDir::new().unwrap();
    let always = Shortener::start(
        &dir.path().join("a"),
        &["--captcha", "always", "--captcha-max-number", "500"],
    );
    let off = Shortener::start(
        &dir.path().join("b"),
        &["--captcha", "off", "--anon-creates-per-hour", "2"],
    );
    let c = client();
    assert_eq!(
        create(&c, &always, None, url(0)).await.status(),
        StatusCode::PRECONDITION_REQUIRED
    );
    let good = solved(&c, &always).await;
    assert_eq!(
        create(&c, &always, Some(&good), url(0)).await.status(),
        StatusCode::CREATED
    );
    let statuses = [
        create(&c, &off, None, url(0)).await.status(),
        create(&c, &off, None, url(1)).await.status(),
        create(&c, &off, None, url(2)).await.status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let bad = common::run(&["serve", "--captcha", "sometimes"], &[]);
    assert!(common::one_line_failure(&bad).contains("off, auto or always"));
}

/// Two processes on `kind`: a challenge of one solves on the other (they share the key in
/// the store), and a solution taken by one is refused by the other.
async fn good_once_across_processes(kind: Kind) {
    let flags = ["--captcha", "always", "--captcha-max-number", "500"];
    let Pair { a, b, .. } = &Pair::start(kind, &flags).await;
    let c = client();
    let good = solved(&c, a).await;
    assert_eq!(
        create(&c, b, Some(&good), url(0)).await.status(),
        StatusCode::CREATED
    );
    for server in [a, b] {
        let resp = create(&c, server, Some(&good), url(1)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_code(resp).await, "captcha_invalid");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn in_scale_out_a_solution_is_good_once_across_instances() {
    good_once_across_processes(Kind::ScaleOut).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_without_redis_a_solution_is_good_once_across_instances() {
    good_once_across_processes(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_one_embedded_file_a_solution_is_good_once_across_processes() {
    good_once_across_processes(Kind::Embedded).await;
}
