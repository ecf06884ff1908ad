//! Every endpoint of the v1 API over real HTTP against the real binary and store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Shortener, client, create, error_code, eventually, token};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

fn is_rfc3339_utc(s: &str) -> bool {
    s.len() == 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

#[tokio::test(flavor = "multi_thread")]
async fn create_then_follow_a_generated_code() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/a?b=c#d"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let code_location = resp.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(resp.headers()["ratelimit-limit"], "100");
    assert_eq!(resp.headers()["ratelimit-remaining"], "99");
    let body: Value = resp.json().await.unwrap();
    let code = body["short_code"].as_str().unwrap();
    assert_eq!(code.len(), 7);
    assert!(code.bytes().all(|b| b.is_ascii_alphanumeric()));
    assert_eq!(code_location, format!("/api/v1/links/{code}"));
    assert_eq!(body["short_url"], format!("{}/{code}", server.base));
    assert_eq!(body["long_url"], "https://example.com/a?b=c#d");
    let created = body["created_at"].as_str().unwrap();
    let expires = body["expires_at"].as_str().unwrap();
    assert!(is_rfc3339_utc(created) && is_rfc3339_utc(expires), "{body}");
    // Default lifetime: 1825 days, i.e. five years less a day or two of leap years.
    let year = |s: &str| s[..4].parse::<i32>().unwrap();
    assert_eq!(year(expires) - year(created), 5);

    let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    assert_eq!(resp.headers()["location"], "https://example.com/a?b=c#d");
    assert_eq!(resp.headers()["cache-control"], "private, max-age=60");
    let resp = c
        .head(server.url(&format!("/{code}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    assert_eq!(resp.headers()["location"], "https://example.com/a?b=c#d");
    assert!(resp.bytes().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_alias_is_put_if_absent() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let body = json!({"long_url": "https://example.com/one", "custom_alias": "Spring-Sale"});
    let resp = create(&c, &server, body, None).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created: Value = resp.json().await.unwrap();
    assert_eq!(created["short_code"], "Spring-Sale");

    let again = json!({"long_url": "https://example.com/two", "custom_alias": "Spring-Sale"});
    let resp = create(&c, &server, again, None).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(error_code(resp).await, "alias_taken");
    // The first link is untouched; aliases are case-sensitive like codes.
    let resp = c.get(server.url("/Spring-Sale")).send().await.unwrap();
    assert_eq!(resp.headers()["location"], "https://example.com/one");
    let resp = c.get(server.url("/spring-sale")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_input_gets_400_with_the_error_shape() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &["--anon-creates-per-hour", "1000"]);
    let c = client();
    let long = format!("https://example.com/{}", "a".repeat(2048));
    let own = format!("{}/abcdefg", server.base);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"long_url": "ftp://example.com/"}), "invalid_url"),
        (json!({"long_url": "javascript:alert(1)"}), "invalid_url"),
        (json!({"long_url": "example.com"}), "invalid_url"),
        (json!({"long_url": "https://"}), "invalid_url"),
        (
            json!({"long_url": "https://user:pw@example.com/"}),
            "invalid_url",
        ),
        (json!({"long_url": long}), "invalid_url"),
        (json!({"long_url": own}), "invalid_url"),
        (
            json!({"long_url": "https://example.com", "custom_alias": "abc"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "a".repeat(31)}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "has space"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "under_score"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "healthz"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "API"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "metrics"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "custom_alias": "bullshit-deals"}),
            "invalid_alias",
        ),
        (
            json!({"long_url": "https://example.com", "expires_in_days": 0}),
            "invalid_expiry",
        ),
        (
            json!({"long_url": "https://example.com", "expires_in_days": 3651}),
            "invalid_expiry",
        ),
        (
            json!({"long_url": "https://example.com", "expires_in_days": -5}),
            "invalid_expiry",
        ),
        (
            json!({"long_url": "https://example.com", "expires_in_days": "ten"}),
            "invalid_body",
        ),
        (json!({"long_url": 42}), "invalid_body"),
        (json!({"url": "https://example.com"}), "invalid_body"),
        (
            json!({"long_url": "https://example.com", "custom_alais": "typo"}),
            "invalid_body",
        ),
        (json!(["https://example.com"]), "invalid_body"),
    ];
    for (body, code) in cases {
        let resp = create(&c, &server, body.clone(), None).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_code(resp).await, code, "{body}");
    }
    let resp = c
        .post(server.url("/api/v1/links"))
        .header("content-type", "application/json")
        .body("{\"long_url\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(resp).await, "invalid_body");

    let resp = c
        .post(server.url("/api/v1/links"))
        .header("content-type", "text/plain")
        .body("https://example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(error_code(resp).await, "unsupported_media_type");

    let huge = json!({"long_url": "https://example.com", "pad": "x".repeat(64 * 1024)});
    let resp = create(&c, &server, huge, None).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(resp).await, "payload_too_large");

    // Nothing above created a link.
    let admin = token(dir.path(), "root", true);
    for code in ["abc", "under_score", "healthz"] {
        let resp = c
            .get(server.url(&format!("/api/v1/links/{code}")))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn idn_hosts_are_stored_as_punycode() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://bücher.example/straße"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["long_url"],
        "https://xn--bcher-kva.example/stra%C3%9Fe"
    );
    let code = body["short_code"].as_str().unwrap();
    let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
    assert_eq!(
        resp.headers()["location"],
        "https://xn--bcher-kva.example/stra%C3%9Fe"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn framework_errors_have_the_error_shape() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    // `/` is the web app's door.
    let root = c.get(server.url("/")).send().await.unwrap();
    assert_eq!(root.status(), StatusCode::SEE_OTHER);
    assert_eq!(root.headers()["location"], "/_/");
    for path in ["/nope/deeper", "/api/v1", "/api/v1/links/abcd/other", "/x"] {
        let resp = c.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(error_code(resp).await, "not_found", "{path}");
    }
    let resp = c.get(server.url("/Zz9Zz9Z")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(resp).await, "not_found");

    let resp = c.put(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_code(resp).await, "method_not_allowed");
    let resp = c.put(server.url("/api/v1/links")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_code(resp).await, "method_not_allowed");
    let resp = c.post(server.url("/abcdefg")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test(flavor = "multi_thread")]
async fn owner_and_admin_rules_for_metadata_analytics_and_delete() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let alice = token(dir.path(), "alice", false);
    let bob = token(dir.path(), "bob", false);
    let admin = token(dir.path(), "ops", true);

    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/a"}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["ratelimit-limit"], "1000");
    let code = resp.json::<Value>().await.unwrap()["short_code"]
        .as_str()
        .unwrap()
        .to_owned();
    let anon = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/b"}),
        None,
    )
    .await;
    let anon_code = anon.json::<Value>().await.unwrap()["short_code"]
        .as_str()
        .unwrap()
        .to_owned();

    let get = |path: String, tok: Option<String>| {
        let c = c.clone();
        let url = server.url(&path);
        async move {
            let mut r = c.get(url);
            if let Some(t) = tok {
                r = r.bearer_auth(t);
            }
            r.send().await.unwrap()
        }
    };
    for path in [
        format!("/api/v1/links/{code}"),
        format!("/api/v1/links/{code}/analytics"),
    ] {
        let resp = get(path.clone(), None).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        assert_eq!(error_code(resp).await, "authentication_required");
        let resp = get(path.clone(), Some("shk_not-a-token".into())).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(error_code(resp).await, "invalid_token");
        let resp = get(path.clone(), Some(bob.clone())).await;
        assert_eq!(
            resp.status(),
            StatusCode::NOT_FOUND,
            "bob must not see alice's {path}"
        );
        assert_eq!(
            get(path.clone(), Some(alice.clone())).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            get(path.clone(), Some(admin.clone())).await.status(),
            StatusCode::OK
        );
    }
    // Anonymous links belong to nobody: only admins see them.
    let anon_path = format!("/api/v1/links/{anon_code}");
    assert_eq!(
        get(anon_path.clone(), Some(alice.clone())).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(anon_path, Some(admin.clone())).await.status(),
        StatusCode::OK
    );

    let resp = c
        .get(server.url(&format!("/api/v1/links/{code}")))
        .header("authorization", "Basic YWxpY2U6cHc=")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    let info: Value = get(format!("/api/v1/links/{code}"), Some(alice.clone()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["owner"], "alice");
    assert_eq!(info["status"], "active");
    assert_eq!(info["custom_alias"], false);
    assert_eq!(info["long_url"], "https://example.com/a");
    assert_eq!(info["short_url"], format!("{}/{code}", server.base));

    let delete = |tok: Option<String>| {
        let c = c.clone();
        let url = server.url(&format!("/api/v1/links/{code}"));
        async move {
            let mut r = c.delete(url);
            if let Some(t) = tok {
                r = r.bearer_auth(t);
            }
            r.send().await.unwrap()
        }
    };
    assert_eq!(delete(None).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        delete(Some(bob.clone())).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        c.get(server.url(&format!("/{code}")))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FOUND
    );
    assert_eq!(
        delete(Some(alice.clone())).await.status(),
        StatusCode::NO_CONTENT
    );
    let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::GONE);
    assert_eq!(error_code(resp).await, "gone");
    assert_eq!(
        c.head(server.url(&format!("/{code}")))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::GONE
    );
    // Deleting again is idempotent, and an admin may delete anyone's link.
    assert_eq!(
        delete(Some(admin.clone())).await.status(),
        StatusCode::NO_CONTENT
    );
    let info: Value = get(format!("/api/v1/links/{code}"), Some(alice))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["status"], "deleted");
    let resp = c
        .delete(server.url("/api/v1/links/Nope123"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn analytics_count_people_per_utc_day_and_bots_apart() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &["--click-flush-ms", "100"]);
    let c = client();
    let alice = token(dir.path(), "alice", false);
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/", "custom_alias": "clicky"}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    for _ in 0..25 {
        assert_eq!(
            c.get(server.url("/clicky")).send().await.unwrap().status(),
            StatusCode::FOUND
        );
    }
    for _ in 0..3 {
        assert_eq!(
            c.head(server.url("/clicky")).send().await.unwrap().status(),
            StatusCode::FOUND
        );
    }
    let analytics = || async {
        c.get(server.url("/api/v1/links/clicky/analytics"))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    eventually("28 clicks to be flushed", || async {
        let a = analytics().await;
        a["total_clicks"] == 25 && a["bot_clicks"] == 3
    })
    .await;
    let a = analytics().await;
    assert_eq!(a["short_code"], "clicky");
    let days = a["daily_clicks"].as_array().unwrap();
    assert_eq!(days.len(), 30);
    let today = time::OffsetDateTime::now_utc().date();
    let today = format!(
        "{:04}-{:02}-{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    assert_eq!(days[29]["date"], today.as_str());
    assert_eq!(days[29]["clicks"], 25);
    assert!(days[..29].iter().all(|d| d["clicks"] == 0));
    assert!(
        days.windows(2)
            .all(|w| w[0]["date"].as_str() < w[1]["date"].as_str())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_creation_can_be_switched_off_and_bad_tokens_never_fall_back() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &["--no-anonymous"]);
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(resp).await, "authentication_required");
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/"}),
        Some("shk_wrong"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(resp).await, "invalid_token");
    let alice = token(dir.path(), "alice", false);
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/"}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread")]
async fn creation_is_rate_limited_per_ip_and_per_user() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &[
            "--anon-creates-per-hour",
            "3",
            "--user-creates-per-hour",
            "2",
        ],
    );
    let c = client();
    for i in 0..3 {
        let resp = create(
            &c,
            &server,
            json!({"long_url": format!("https://example.com/{i}")}),
            None,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/x"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=1200).contains(&retry), "Retry-After {retry}");
    assert_eq!(error_code(resp).await, "rate_limited");

    let alice = token(dir.path(), "alice", false);
    let admin = token(dir.path(), "ops", true);
    for _ in 0..2 {
        let resp = create(
            &c,
            &server,
            json!({"long_url": "https://example.com/u"}),
            Some(&alice),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/u"}),
        Some(&alice),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));
    // Admins are not limited.
    for _ in 0..5 {
        let resp = create(
            &c,
            &server,
            json!({"long_url": "https://example.com/a"}),
            Some(&admin),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_for_is_only_trusted_when_asked() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &["--anon-creates-per-hour", "1", "--trust-forwarded-for"],
    );
    let c = client();
    // Behind a trusted proxy the last X-Forwarded-For entry is the client: two budgets.
    assert_eq!(
        creates_from_two_addresses(&c, &server, "198.51.100.9, ").await,
        [StatusCode::CREATED, StatusCode::CREATED]
    );
    // Otherwise the header is the client's own claim and is ignored: one budget.
    let dir2 = TempDir::new().unwrap();
    let untrusting = Shortener::start(dir2.path(), &["--anon-creates-per-hour", "1"]);
    assert_eq!(
        creates_from_two_addresses(&c, &untrusting, "").await,
        [StatusCode::CREATED, StatusCode::TOO_MANY_REQUESTS]
    );
}

/// One anonymous create claiming each of two client addresses in `X-Forwarded-For`
/// (after `prefix`, the entries a client itself may have put there).
async fn creates_from_two_addresses(
    c: &reqwest::Client,
    server: &Shortener,
    prefix: &str,
) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for ip in ["203.0.113.1", "203.0.113.2"] {
        let resp = c
            .post(server.url("/api/v1/links"))
            .header("x-forwarded-for", format!("{prefix}{ip}"))
            .json(&json!({"long_url": "https://example.com/"}))
            .send()
            .await
            .unwrap();
        out.push(resp.status());
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_links_answer_404() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let resp = create(&c, &server, json!({"long_url": "https://example.com/", "custom_alias": "short-lived", "expires_in_days": 1}), None).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    // Let a day pass in the store itself: the server reads expiry from there.
    let db = rusqlite::Connection::open(dir.path().join("shortener.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let changed = db
        .execute(
            "UPDATE links SET expires_at = strftime('%s','now') - 1 WHERE code = 'short-lived'",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let resp = c.get(server.url("/short-lived")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(resp).await, "not_found");
    let admin = token(dir.path(), "ops", true);
    let info: Value = c
        .get(server.url("/api/v1/links/short-lived"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["status"], "expired");
}

#[tokio::test(flavor = "multi_thread")]
async fn blocklist_is_enforced_and_reloaded() {
    let dir = TempDir::new().unwrap();
    let list = dir.path().join("blocked.txt");
    std::fs::write(&list, "# spam\nspam.example\n").unwrap();
    let server = Shortener::start(
        &dir.path().join("data"),
        &[
            "--blocklist",
            list.to_str().unwrap(),
            "--anon-creates-per-hour",
            "1000",
        ],
    );
    let c = client();
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://www.spam.example/win"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "url_blocked");
    // The refusal names the feed, not the entry.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("blocked.txt") && !message.contains("spam"),
        "{message}"
    );
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://phish.example/"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let code = resp.json::<Value>().await.unwrap()["short_code"]
        .as_str()
        .unwrap()
        .to_owned();

    std::fs::write(&list, "spam.example\nphish.example\n").unwrap();
    server
        .process
        .signal(nix::sys::signal::Signal::SIGHUP)
        .unwrap();
    eventually("the new blocklist to apply", || async {
        create(
            &c,
            &server,
            json!({"long_url": "https://phish.example/"}),
            None,
        )
        .await
        .status()
            == StatusCode::BAD_REQUEST
    })
    .await;
    // The sweep after the reload disabled the link made before it.
    eventually("the sweep to disable the earlier link", || async {
        c.get(server.url(&format!("/{code}")))
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::GONE
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn operations_endpoints() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let health: Value = c
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let ready = c.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);

    create(
        &c,
        &server,
        json!({"long_url": "https://example.com/", "custom_alias": "metered"}),
        None,
    )
    .await;
    c.get(server.url("/metered")).send().await.unwrap();
    c.get(server.url("/unknown1")).send().await.unwrap();
    let resp = c.get(server.url("/metrics")).send().await.unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = resp.text().await.unwrap();
    for needle in [
        "shortener_redirects_total{outcome=\"found\"} 1",
        "shortener_redirects_total{outcome=\"not_found\"} 1",
        "shortener_link_creates_total{outcome=\"created\"} 1",
        "shortener_click_events_dropped_total 0",
        "shortener_click_queue_depth",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }

    let doc: Value = c
        .get(server.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/links",
        "/api/v1/links/{code}",
        "/api/v1/links/{code}/analytics",
        "/api/v1/links/{code}/disable",
        "/api/v1/links/{code}/enable",
        "/api/v1/audit",
        "/api/v1/links/{code}/reports",
        "/api/v1/reports",
        "/api/v1/reports/{id}/resolve",
        "/api/v1/challenge",
        "/{code}",
    ] {
        assert!(paths.contains_key(p), "OpenAPI lacks {p}");
    }
    assert!(doc["paths"]["/api/v1/links/{code}"]["delete"].is_object());
    // Every status the handlers answer is documented.
    let audit = &doc["paths"]["/api/v1/audit"]["get"]["responses"];
    for status in ["200", "400", "401", "403", "503"] {
        assert!(audit[status].is_object(), "audit lacks {status}");
    }
    let enable = &doc["paths"]["/api/v1/links/{code}/enable"]["post"]["responses"];
    for status in ["200", "401", "403", "404", "409", "503"] {
        assert!(enable[status].is_object(), "enable lacks {status}");
    }
    let creates = &doc["paths"]["/api/v1/links"]["post"]["responses"];
    for status in ["201", "400", "401", "409", "413", "415", "428", "429"] {
        assert!(creates[status].is_object(), "create lacks {status}");
    }
    let file = &doc["paths"]["/api/v1/links/{code}/reports"]["post"]["responses"];
    for status in ["202", "400", "404", "429"] {
        assert!(file[status].is_object(), "reports lack {status}");
    }
    let limit = doc["paths"]["/api/v1/audit"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(limit["schema"]["maximum"], 500);
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}
