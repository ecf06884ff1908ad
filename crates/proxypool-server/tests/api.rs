//! The JSON API from plain curl, and the credentials that keep the server from being open.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, Target, Tinyproxy, get, get_via_connect};
use serde_json::{Value, json};
use std::process::Command;

/// `curl` with a JSON body: (status, parsed body or null).
fn curl(method: &str, url: &str, body: Option<Value>, extra: &[&str]) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-X", method, "-w", "\n%{http_code}"])
        .args(extra);
    if let Some(body) = body {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ]);
    }
    let out = cmd.arg(url).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    let value = serde_json::from_str(body).unwrap_or(Value::Null);
    (code.parse().unwrap(), value)
}

fn assert_error(v: &Value, code: &str) {
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_works_from_curl() {
    let dir = tempfile::tempdir().unwrap();
    let t1 = Tinyproxy::start(dir.path(), "127.0.0.2");
    let t2 = Tinyproxy::start(dir.path(), "127.0.0.3");
    let target = Target::start(&["127.0.20.1"]);
    let server = Server::start(dir.path(), &[t1.url()], "", &[]);
    let api = server.api.clone();

    let (status, v) = curl("GET", &format!("{api}/healthz"), None, &[]);
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));

    // acquire → use the address → release.
    let (status, lease) = curl(
        "POST",
        &format!("{api}/v1/acquire"),
        Some(json!({"key": "acct-1", "site": "www.shop.example"})),
        &[],
    );
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["address"], t1.url().as_str());
    assert!(lease["expires_at"].as_u64().unwrap() > 1_700_000_000_000);
    let (status, _) = curl(
        "POST",
        &format!("{api}/v1/release"),
        Some(json!({"lease_id": lease["lease_id"], "outcome": "success", "latency_ms": 120})),
        &[],
    );
    assert_eq!(status, 204);
    let (status, v) = curl(
        "POST",
        &format!("{api}/v1/release"),
        Some(json!({"lease_id": lease["lease_id"], "outcome": "success"})),
        &[],
    );
    assert_eq!(status, 404);
    assert_error(&v, "unknown_lease");
    // The site was reduced to its registrable domain.
    let (_, matrix) = curl("GET", &format!("{api}/v1/matrix"), None, &[]);
    assert!(
        matrix["cells"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["site"] == "shop.example"),
        "{matrix}"
    );

    // Add an address, see it, delete it.
    let (status, added) = curl(
        "POST",
        &format!("{api}/v1/addresses"),
        Some(json!({"address": t2.url()})),
        &[],
    );
    assert_eq!(status, 201, "{added}");
    let (status, v) = curl(
        "POST",
        &format!("{api}/v1/addresses"),
        Some(json!({"address": t2.url()})),
        &[],
    );
    assert_eq!(status, 409);
    assert_error(&v, "duplicate_address");
    let (_, rows) = curl("GET", &format!("{api}/v1/addresses"), None, &[]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r["state"] == "healthy" && r["id"].is_string())
    );
    let id = added["id"].as_str().unwrap();
    let (status, _) = curl("DELETE", &format!("{api}/v1/addresses/{id}"), None, &[]);
    assert_eq!(status, 204);
    let (status, v) = curl("DELETE", &format!("{api}/v1/addresses/{id}"), None, &[]);
    assert_eq!(status, 404);
    assert_error(&v, "unknown_address");

    // Feedback for a gateway session: what the client saw inside a tunnel.
    let (status, body) = get_via_connect(
        server.gateway,
        Some("erin-session-t1"),
        "127.0.20.1",
        target.port,
        "/",
    )
    .await;
    assert!(status.contains(" 200"), "{status} {body}");
    let (status, v) = curl(
        "POST",
        &format!("{api}/v1/feedback"),
        Some(json!({"session": "erin-session-t1", "site": "127.0.20.1", "outcome": "captcha"})),
        &[],
    );
    assert_eq!(status, 204, "{v}");
    let (_, rows) = curl("GET", &format!("{api}/v1/addresses"), None, &[]);
    assert_eq!(rows[0]["captchas"], 1, "{rows}");
    let (status, v) = curl(
        "POST",
        &format!("{api}/v1/feedback"),
        Some(json!({"session": "erin-session-nope", "site": "x.example", "outcome": "blocked"})),
        &[],
    );
    assert_eq!(status, 404);
    assert_error(&v, "unknown_session");

    // Errors keep one shape, also for bad bodies and unknown routes.
    let (status, v) = curl(
        "POST",
        &format!("{api}/v1/acquire"),
        Some(json!({"keyy": 1})),
        &[],
    );
    assert_eq!(status, 400);
    assert_error(&v, "invalid_body");
    let (status, v) = curl("GET", &format!("{api}/v1/nothing"), None, &[]);
    assert_eq!(status, 404);
    assert_error(&v, "not_found");

    // Metrics (the library's and the gateway's) and the OpenAPI document.
    let out = Command::new("curl")
        .args(["-s", &format!("{api}/metrics")])
        .output()
        .unwrap();
    let metrics = String::from_utf8(out.stdout).unwrap();
    assert!(metrics.contains("proxypool_acquires_total"), "{metrics}");
    assert!(
        metrics.contains("proxypool_gateway_requests_total"),
        "{metrics}"
    );
    let (status, doc) = curl("GET", &format!("{api}/v1/openapi.json"), None, &[]);
    assert_eq!(status, 200);
    for path in [
        "/v1/acquire",
        "/v1/release",
        "/v1/feedback",
        "/v1/addresses",
        "/v1/matrix",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_required_when_given_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let t1 = Tinyproxy::start(dir.path(), "127.0.0.2");
    let target = Target::start(&["127.0.20.1"]);
    let auth = dir.path().join("users.txt");
    std::fs::write(&auth, "# users\nfrank:secret\n").unwrap();
    let server = Server::start(
        dir.path(),
        &[t1.url()],
        "",
        &["--auth-file", auth.to_str().unwrap()],
    );
    let url = target.url("127.0.20.1", "/");
    let (status, error, _) = get(&server.client(None), &url).await;
    assert_eq!((status, error.as_deref()), (407, Some("auth-required")));
    let wrong = reqwest::Client::builder()
        .proxy(
            reqwest::Proxy::http(format!("http://{}", server.gateway))
                .unwrap()
                .basic_auth("frank", "wrong"),
        )
        .build()
        .unwrap();
    assert_eq!(get(&wrong, &url).await.0, 407);
    // The password belongs to the account; the session suffix rides along.
    let (status, _, body) = get(&server.client(Some("frank-session-9")), &url).await;
    assert_eq!((status, body.trim()), (200, "127.0.0.2"));
    let (status, _) = get_via_connect(server.gateway, None, "127.0.20.1", target.port, "/").await;
    assert!(status.contains(" 407"), "{status}");

    let api = &server.api;
    let (status, v) = curl("GET", &format!("{api}/v1/addresses"), None, &[]);
    assert_eq!(status, 401);
    assert_error(&v, "unauthorized");
    let (status, _) = curl(
        "GET",
        &format!("{api}/v1/addresses"),
        None,
        &["-u", "frank:secret"],
    );
    assert_eq!(status, 200);
    let (status, _) = curl("GET", &format!("{api}/healthz"), None, &[]);
    assert_eq!(status, 200);
}

#[test]
fn a_public_listen_address_without_credentials_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let upstreams = dir.path().join("u.txt");
    std::fs::write(&upstreams, "http://127.0.0.1:3128\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_proxypool"))
        .args(["serve", "--upstreams"])
        .arg(&upstreams)
        .args(["--proxy-listen", "0.0.0.0:0", "--api-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--auth-file"), "{stderr}");
}
