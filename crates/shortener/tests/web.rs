//! The web app over plain HTTP against the real binary: security headers and cookie flags,
//! CSRF refusal, escaping of attacker-controlled text, sessions that end when their token
//! is revoked (on every process), rate-limited sign-in, "My links" searched and paged
//! without script, and bad form input that changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair, cli, new_token};
use common::web::WebVisitor;
use common::{NOTICED_WITHIN, Shortener, client, create, get_json, token};
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};
use tempfile::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_send_a_strict_policy_and_cookies_stay_in_their_lane() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();

    let root = c.get(server.url("/")).send().await.unwrap();
    assert!(root.status().is_redirection());
    assert_eq!(root.headers()["location"], "/_/");

    let home = c.get(server.url("/_/")).send().await.unwrap();
    assert_eq!(home.status(), StatusCode::OK);
    let csp = home.headers()["content-security-policy"].to_str().unwrap();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(home.headers()["x-content-type-options"], "nosniff");
    let set = home.headers()["set-cookie"].to_str().unwrap().to_owned();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/_/"] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let body = home.text().await.unwrap();
    assert!(!body.contains("<script>"), "no inline script: {body}");
    assert!(!body.contains("style="), "no inline style: {body}");

    // Behind a TLS proxy the cookies are Secure.
    let behind = c
        .get(server.url("/_/"))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let set = behind.headers()["set-cookie"].to_str().unwrap();
    assert!(set.contains("; Secure"), "{set}");

    // The session cookie has the same flags.
    let alice = token(dir.path(), "alice", false);
    let mut web = WebVisitor::new(&server);
    web.sign_in(&alice).await;
    let session = web
        .last_set_cookies
        .iter()
        .find(|c| c.starts_with("shortener_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/_/", "Max-Age="] {
        assert!(session.contains(flag), "{session}");
    }
    assert!(
        !session.contains(&alice),
        "the token never goes into a cookie"
    );

    // Assets are embedded; unknown pages are HTML 404s under the same policy.
    let css = c.get(server.url("/_/assets/app.css")).send().await.unwrap();
    assert_eq!(css.headers()["content-type"], "text/css; charset=utf-8");
    let missing = c.get(server.url("/_/nothing/here")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(missing.headers().contains_key("content-security-policy"));
    // `_` is the router's, never a code to redirect.
    let bare = c.get(server.url("/_")).send().await.unwrap();
    assert!(bare.status().is_redirection());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_without_their_csrf_token_change_nothing() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let alice = token(dir.path(), "alice", false);
    let c = client();
    let mut web = WebVisitor::new(&server);
    web.sign_in(&alice).await;

    for csrf in ["", "0000", "deadbeef".repeat(8).as_str()] {
        let (status, _, body) = web
            .post(
                "/_/links",
                &[("csrf", csrf), ("long_url", "https://example.com/csrf")],
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("expired"), "{body}");
    }
    let links = get_json(&c, &server, "/api/v1/links", &alice).await;
    assert_eq!(links["links"], json!([]), "nothing was created");

    // An edit with another visitor's token (their own cookie, someone else's form).
    let created = create(
        &c,
        &server,
        json!({"long_url": "https://example.com/old", "custom_alias": "csrf-target"}),
        Some(&alice),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let mut other = WebVisitor::new(&server);
    other.get("/_/").await;
    let foreign = other.csrf.clone().unwrap();
    let (status, _, _) = web
        .post(
            "/_/links/csrf-target/destination",
            &[("csrf", &foreign), ("long_url", "https://evil.example/")],
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let link = get_json(&c, &server, "/api/v1/links/csrf-target", &alice).await;
    assert_eq!(link["long_url"], "https://example.com/old");

    // Signing in and out need it too: a forged sign-in sets no session.
    let mut fresh = WebVisitor::new(&server);
    let (status, _, _) = fresh.post("/_/signin", &[("token", &alice)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!fresh.cookies.contains_key("shortener_session"));
    let (status, _, _) = web.post("/_/signout", &[("csrf", "")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        web.get("/_/links").await.0,
        StatusCode::OK,
        "still signed in"
    );
    let (status, location, _) = web.post("/_/signout", &[]).await;
    assert_eq!(
        (status, location.as_deref()),
        (StatusCode::SEE_OTHER, Some("/_/"))
    );
    assert_eq!(
        web.get("/_/links").await.0,
        StatusCode::SEE_OTHER,
        "signed out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker_controlled_text_is_escaped_everywhere_it_is_shown() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let alice = token(dir.path(), "alice", false);
    let admin = token(dir.path(), "root", true);
    let c = client();
    let evil = r#"https://example.com/"><script>alert(1)</script>"#;
    let created = create(
        &c,
        &server,
        json!({"long_url": evil, "custom_alias": "evil-link"}),
        Some(&alice),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let report = c
        .post(server.url("/api/v1/links/evil-link/reports"))
        .json(&json!({"category": "phishing",
                      "comment": "\"><script>alert(2)</script><img src=x onerror=alert(3)>"}))
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), StatusCode::ACCEPTED);

    let mut web = WebVisitor::new(&server);
    web.sign_in(&alice).await;
    let mut pages = vec![
        web.get("/_/links").await.1,
        web.get("/_/links/evil-link").await.1,
        web.get("/_/links?q=%22%3E%3Cscript%3Ealert(4)%3C/script%3E")
            .await
            .1,
    ];
    // A refused form shows what was typed, escaped.
    let (status, _, body) = web
        .post(
            "/_/links",
            &[("long_url", r#"javascript:"><script>alert(5)</script>"#)],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    pages.push(body);
    let (status, _, body) = web
        .post(
            "/_/links/evil-link/disable",
            &[("reason", r#""><script>alert(6)</script>"#)],
        )
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    pages.push(web.get("/_/links/evil-link").await.1);
    let mut root = WebVisitor::new(&server);
    root.sign_in(&admin).await;
    let (status, queue) = root.get("/_/admin").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        queue.contains("&lt;script&gt;alert(2)&lt;/script&gt;"),
        "{queue}"
    );
    pages.push(queue);

    for page in &pages {
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<img src=x"), "{page}");
        // Only our own external scripts.
        assert_eq!(
            page.matches("<script").count(),
            page.matches("<script src=\"/_/assets/").count(),
            "{page}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_a_session_works_on_every_process_until_its_token_is_revoked() {
    let pair = Pair::start(Kind::Embedded, &[]).await;
    session_across(&pair.a, &pair.b, &pair.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_session_works_on_every_instance_until_its_token_is_revoked() {
    let pair = Pair::start(Kind::Postgres, &[]).await;
    session_across(&pair.a, &pair.b, &pair.store()).await;
}

/// A session made on `a` works on `b` (one store, one key); a revoke ends it on both at once.
async fn session_across(a: &Shortener, b: &Shortener, store: &[&str]) {
    let (alice, id) = new_token(store, &["--user", "alice"]);
    let mut on_a = WebVisitor::new(a);
    on_a.sign_in(&alice).await;
    assert_eq!(on_a.get("/_/links").await.0, StatusCode::OK);
    // The same cookies on another process over the same store.
    let mut on_b = WebVisitor::new(b);
    on_b.cookies = on_a.cookies.clone();
    let (status, body) = on_b.get("/_/links").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("Signed in as"), "{body}");

    cli(&["token", "revoke", &id], store);
    // Tokens are cached for half a second at most: refused on both soon after.
    for web in [&mut on_a, &mut on_b] {
        let since = Instant::now();
        loop {
            let (status, _) = web.get("/_/links").await;
            if status == StatusCode::SEE_OTHER {
                break;
            }
            assert_eq!(status, StatusCode::OK);
            assert!(
                since.elapsed() < NOTICED_WITHIN,
                "revoked session still accepted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!web.cookies.contains_key("shortener_session"), "cleared");
    }
    // A forged session cookie is no session either.
    let mut forged = WebVisitor::new(a);
    forged.cookies.insert(
        "shortener_session".into(),
        format!("{}.9999999999.{}", "ab".repeat(32), "cd".repeat(32)),
    );
    assert_eq!(forged.get("/_/links").await.0, StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_attempts_are_limited_per_address() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let alice = token(dir.path(), "alice", false);
    let mut web = WebVisitor::new(&server);
    web.get("/_/signin").await;
    for _ in 0..30 {
        let (status, _, body) = web.post("/_/signin", &[("token", "shk_wrong")]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.contains("not valid"), "{body}");
    }
    let (status, _, body) = web.post("/_/signin", &[("token", &alice)]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("Too many sign-in attempts"), "{body}");
    assert!(!web.cookies.contains_key("shortener_session"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_form_input_gets_a_clear_error_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let alice = token(dir.path(), "alice", false);
    let c = client();
    let mut web = WebVisitor::new(&server);
    web.sign_in(&alice).await;
    for (fields, status, says) in [
        (
            vec![("long_url", "not a url")],
            StatusCode::BAD_REQUEST,
            "URL",
        ),
        (
            vec![
                ("long_url", "https://example.com/"),
                ("custom_alias", "a/b"),
            ],
            StatusCode::BAD_REQUEST,
            "alias",
        ),
        (
            vec![
                ("long_url", "https://example.com/"),
                ("expires_in_days", "soon"),
            ],
            StatusCode::BAD_REQUEST,
            "whole number of days",
        ),
        (
            vec![
                ("long_url", "https://example.com/"),
                ("expires_in_days", "99999"),
            ],
            StatusCode::BAD_REQUEST,
            "between 1 and 3650",
        ),
    ] {
        let (got, _, body) = web.post("/_/links", &fields).await;
        assert_eq!(got, status, "{fields:?}: {body}");
        assert!(body.contains("role=\"alert\""), "{body}");
        assert!(body.contains(says), "{fields:?}: {body}");
        // What was typed is still in the form.
        assert!(
            body.contains(&format!("value=\"{}\"", fields[0].1)),
            "{body}"
        );
    }
    assert_eq!(
        get_json(&c, &server, "/api/v1/links", &alice).await["links"],
        json!([])
    );

    let (status, location, _) = web
        .post(
            "/_/links",
            &[
                ("long_url", "https://example.com/keep"),
                ("custom_alias", "keep-me"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().starts_with("/_/?created=keep-me&sig="));
    let (status, _, body) = web
        .post(
            "/_/links",
            &[
                ("long_url", "https://example.com/"),
                ("custom_alias", "keep-me"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("already taken"), "{body}");
    let (status, _, body) = web
        .post(
            "/_/links/keep-me/destination",
            &[("long_url", "ftp://example.com/")],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("role=\"alert\""), "{body}");
    let (status, _, _) = web
        .post("/_/links/keep-me/disable", &[("reason", "  ")])
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let link = get_json(&c, &server, "/api/v1/links/keep-me", &alice).await;
    assert_eq!(link["long_url"], "https://example.com/keep");
    assert_eq!(link["status"], "active");
    // Another user's link is not there at all.
    let bob = token(dir.path(), "bob", false);
    let mut other = WebVisitor::new(&server);
    other.sign_in(&bob).await;
    assert_eq!(other.get("/_/links/keep-me").await.0, StatusCode::NOT_FOUND);
    let (status, _, _) = other
        .post(
            "/_/links/keep-me/destination",
            &[("long_url", "https://bob.example/")],
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Bad query strings: an error on the page, not a crash.
    let (status, body) = web.get("/_/links?cursor=garbage").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("cursor"), "{body}");
    // A cursor of the right form this deployment did not give out: the API's 422 and its
    // message (a random key accepts it once in 8 million).
    let (status, body) = web
        .get("/_/links?cursor=0000000000000000_0000000000000000")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.contains("start again from the first page"), "{body}");
}

/// The codes listed on a "My links" page, in order, and its "Older links" href.
fn listed(body: &str) -> (Vec<String>, Option<String>) {
    let codes = body
        .split("<tr data-code=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_owned())
        .collect();
    let next = body
        .split("rel=\"next\" href=\"")
        .nth(1)
        .map(|rest| rest.split('"').next().unwrap().replace("&amp;", "&"));
    (codes, next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_links_search_filter_and_pages_work_without_script() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let c = client();
    let alice = token(dir.path(), "alice", false);
    let mut made = Vec::new();
    for i in 0..25 {
        let body = json!({"long_url": format!("https://example.com/paged/{i}")});
        let resp = create(&c, &server, body, Some(&alice)).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        let v: serde_json::Value = resp.json().await.unwrap();
        made.push(v["short_code"].as_str().unwrap().to_owned());
    }
    let other = json!({"long_url": "https://example.org/elsewhere"});
    assert_eq!(
        create(&c, &server, other, Some(&alice)).await.status(),
        StatusCode::CREATED
    );
    let mut web = WebVisitor::new(&server);
    web.sign_in(&alice).await;

    // The search keeps to its matches, 20 a page; the next page carries the search along
    // and ends the list: every match once.
    let (status, body) = web.get("/_/links?q=paged&status=active").await;
    assert_eq!(status, StatusCode::OK);
    let (first, next) = listed(&body);
    let next = next.expect("a next page");
    assert!(
        next.contains("q=paged") && next.contains("status=active"),
        "{next}"
    );
    let (status, body) = web.get(&next).await;
    assert_eq!(status, StatusCode::OK);
    let (second, none) = listed(&body);
    assert_eq!(none, None, "the last page has no next");
    assert!(body.contains("← Newest"), "{body}");
    assert_eq!(first.len(), 20);
    let mut seen = [first, second].concat();
    seen.sort();
    seen.dedup();
    made.sort();
    assert_eq!(seen, made);

    // A status filter with no match says so.
    let (status, body) = web.get("/_/links?q=paged&status=disabled").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        listed(&body).0.is_empty() && body.contains("No links match."),
        "{body}"
    );
}
