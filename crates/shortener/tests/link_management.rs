//! Listing and editing links: the real binary on the embedded store, on PostgreSQL, and in
//! the scale-out mode with Redis; two serving processes each, so an edit made through one
//! must reach the other's caches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::cli;
use common::pair::{Kind, Pair};
use common::{
    NOTICED_WITHIN, Shortener, client, error_code, follow, get_json, new_link, token_in,
    until_status,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// A feed every server of these tests refuses destinations from.
fn feed(dir: &Path) -> String {
    let feed = dir.join("feed.txt");
    std::fs::write(&feed, "evil.example\n").unwrap();
    feed.to_str().unwrap().to_owned()
}

async fn list(c: &reqwest::Client, server: &Shortener, query: &str, token: &str) -> Value {
    get_json(c, server, &format!("/api/v1/links{query}"), token).await
}

fn codes(page: &Value) -> Vec<String> {
    page["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["short_code"].as_str().unwrap().to_owned())
        .collect()
}

/// A list request refused with 400; its error code.
async fn bad_list(c: &reqwest::Client, server: &Shortener, query: &str, token: &str) -> String {
    refused_list(c, server, query, token, StatusCode::BAD_REQUEST).await
}

/// A list request refused with `status`; its error code.
async fn refused_list(
    c: &reqwest::Client,
    server: &Shortener,
    query: &str,
    token: &str,
    status: StatusCode,
) -> String {
    let resp = c
        .get(server.url(&format!("/api/v1/links{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), status, "{query}");
    error_code(resp).await
}

async fn patch(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    token: &str,
    body: Value,
) -> reqwest::Response {
    c.patch(server.url(&format!("/api/v1/links/{code}")))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Where `GET /{code}` sends people on `server` (None unless it answers 302).
async fn destination(c: &reqwest::Client, server: &Shortener, code: &str) -> Option<String> {
    let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
    (resp.status() == StatusCode::FOUND)
        .then(|| resp.headers()["location"].to_str().unwrap().to_owned())
}

/// Follows `code` on `server` until it redirects to `url`, then for longer than a change poll
/// and a background L2 fill take: once there, it never goes back to an older destination.
async fn until_destination(c: &reqwest::Client, server: &Shortener, code: &str, url: &str) {
    let since = Instant::now();
    loop {
        let got = destination(c, server, code).await;
        if got.as_deref() == Some(url) {
            let reached = Instant::now();
            while reached.elapsed() < Duration::from_millis(700) {
                let again = destination(c, server, code).await;
                assert_eq!(again.as_deref(), Some(url), "{code} went back");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return;
        }
        assert!(
            since.elapsed() < NOTICED_WITHIN,
            "{code} still sends to {got:?} instead of {url} after {NOTICED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Listing on one store: pages, filters, visibility and bad parameters.
async fn listing(a: &Shortener, b: &Shortener, store: &[&str]) {
    let c = client();
    let admin = token_in(store, "root", true);
    let alice = token_in(store, "alice", false);
    let bob = token_in(store, "bob", false);
    for alias in ["list-a1", "list-a2", "list-a3"] {
        new_link(&c, a, alias, &alice).await;
    }
    new_link(&c, b, "list-b1", &bob).await;

    // Newest first (ties within a second by creation order), two at a time; a link created
    // between the pages lands before the cursor: no duplicate, no gap.
    let first = list(&c, a, "?limit=2", &alice).await;
    assert_eq!(codes(&first), ["list-a3", "list-a2"]);
    assert_eq!(first["links"][0]["owner"], "alice");
    assert_eq!(first["links"][0]["status"], "active");
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    // Both processes hide the creation order under the store's one key.
    assert_eq!(
        list(&c, b, "?limit=2", &alice).await["next_cursor"].as_str(),
        Some(cursor.as_str())
    );
    new_link(&c, a, "list-a4", &alice).await;
    let second = list(&c, b, &format!("?limit=2&cursor={cursor}"), &alice).await;
    assert_eq!(codes(&second), ["list-a1"]);
    assert_eq!(second["next_cursor"], Value::Null);
    assert_eq!(
        codes(&list(&c, a, "", &alice).await),
        ["list-a4", "list-a3", "list-a2", "list-a1"]
    );

    // Filters.
    assert_eq!(codes(&list(&c, a, "?q=a2", &alice).await), ["list-a2"]);
    assert_eq!(
        codes(&list(&c, a, "?q=example.com/list-a1", &alice).await),
        ["list-a1"]
    );
    assert!(codes(&list(&c, a, "?q=list-b", &alice).await).is_empty());
    let resp = c
        .post(a.url("/api/v1/links/list-a3/disable"))
        .bearer_auth(&alice)
        .json(&json!({"reason": "paused"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        codes(&list(&c, a, "?status=disabled", &alice).await),
        ["list-a3"]
    );
    assert_eq!(
        codes(&list(&c, a, "?status=active&limit=100", &alice).await),
        ["list-a4", "list-a2", "list-a1"]
    );
    assert!(codes(&list(&c, a, "?status=expired", &alice).await).is_empty());
    assert!(codes(&list(&c, a, "?created_after=2999-01-01T00:00:00Z", &alice).await).is_empty());
    assert_eq!(
        codes(
            &list(
                &c,
                a,
                "?created_before=2999-01-01T00:00:00%2B01:00&q=a1",
                &alice
            )
            .await
        ),
        ["list-a1"]
    );
    assert!(codes(&list(&c, a, "?created_before=2000-01-01T00:00:00Z", &alice).await).is_empty());

    // Deleted links are never listed.
    let resp = c
        .delete(a.url("/api/v1/links/list-a2"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        codes(&list(&c, b, "", &alice).await),
        ["list-a4", "list-a3", "list-a1"]
    );

    // Who sees what: a user their own, an admin everyone's or one owner's.
    assert_eq!(codes(&list(&c, a, "", &bob).await), ["list-b1"]);
    assert_eq!(codes(&list(&c, a, "?owner=bob", &admin).await), ["list-b1"]);
    let everyone = codes(&list(&c, a, "?limit=100", &admin).await);
    assert!(everyone.contains(&"list-b1".to_owned()) && everyone.contains(&"list-a4".to_owned()));
    assert_eq!(codes(&list(&c, a, "?owner=bob", &bob).await), ["list-b1"]);
    assert_eq!(bad_list(&c, a, "?owner=alice", &bob).await, "invalid_query");

    // Bad parameters: 400 with the error shape.
    for query in [
        "?limit=0",
        "?limit=101",
        "?limit=ten",
        "?status=deleted",
        "?created_after=yesterday",
        "?sort=oldest",
        "?q=a%00b",
        "?owner=%00",
    ] {
        assert_eq!(
            bad_list(&c, a, query, &alice).await,
            "invalid_query",
            "{query}"
        );
    }
    // The form of the version before (a dot between the parts) is refused, whatever the digits.
    let dotted = cursor.replace('_', ".");
    for cursor in ["garbage!", "AAAA", "AAAAAAAAAAA_____", &dotted] {
        assert_eq!(
            bad_list(&c, a, &format!("?cursor={cursor}"), &alice).await,
            "invalid_cursor"
        );
    }
    // A cursor of the right form whose hidden part this deployment did not give out (altered
    // here, as one of another deployment would read): 422, not a page from somewhere else.
    let (at, hidden) = cursor.split_once('_').unwrap();
    let altered = format!("{at}_{:016x}", u64::from_str_radix(hidden, 16).unwrap() ^ 1);
    let query = format!("?cursor={altered}");
    let status = StatusCode::UNPROCESSABLE_ENTITY;
    assert_eq!(
        refused_list(&c, a, &query, &alice, status).await,
        "invalid_cursor"
    );
    let resp = c.get(a.url("/api/v1/links")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

/// Paging through more links than a page while another task creates links: every link that
/// existed before the first page shows exactly once.
async fn paging_while_creating(a: &Shortener, store: &[&str]) {
    let c = client();
    let carol = token_in(store, "carol", false);
    let mut before = Vec::new();
    for i in 0..25 {
        let alias = format!("page-{i:02}");
        new_link(&c, a, &alias, &carol).await;
        before.push(alias);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut hidden = Vec::new();
    let mut extra = 0;
    loop {
        let query = match &cursor {
            Some(cursor) => format!("?limit=4&cursor={cursor}"),
            None => "?limit=4".to_owned(),
        };
        let page = list(&c, a, &query, &carol).await;
        seen.extend(codes(&page));
        new_link(&c, a, &format!("late-{extra:02}"), &carol).await;
        extra += 1;
        match page["next_cursor"].as_str() {
            Some(next) => {
                let (at, place) = next.split_once('_').unwrap();
                assert_eq!((at.len(), place.len()), (16, 16), "{next}");
                hidden.push(u64::from_str_radix(place, 16).unwrap());
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    // Pages four links apart: were the creation order shown as it is, these would be a few
    // apart; hidden, they tell nothing of it.
    assert!(
        hidden.windows(2).all(|w| w[0].abs_diff(w[1]) > 1 << 32),
        "{hidden:x?}"
    );
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a duplicate in {seen:?}");
    for alias in &before {
        assert!(seen.contains(alias), "{alias} missing from {seen:?}");
    }
}

/// Editing on one store: the destination moves on both processes, the trail records it,
/// bad edits change nothing.
async fn editing(a: &Shortener, b: &Shortener, store: &[&str]) {
    let c = client();
    let admin = token_in(store, "root", true);
    let alice = token_in(store, "alice", false);
    let bob = token_in(store, "bob", false);
    new_link(&c, a, "edit-me", &alice).await;
    let old = "https://example.com/edit-me";
    // Both processes have it cached.
    assert_eq!(destination(&c, a, "edit-me").await.as_deref(), Some(old));
    assert_eq!(destination(&c, b, "edit-me").await.as_deref(), Some(old));

    let resp = patch(
        &c,
        a,
        "edit-me",
        &alice,
        json!({"long_url": "https://example.org/new"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let link: Value = resp.json().await.unwrap();
    assert_eq!(link["long_url"], "https://example.org/new");
    assert_eq!(link["version"], 2);
    until_destination(&c, a, "edit-me", "https://example.org/new").await;
    until_destination(&c, b, "edit-me", "https://example.org/new").await;
    // And back again, edited by an admin through the other process.
    let resp = patch(&c, b, "edit-me", &admin, json!({"long_url": old})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    until_destination(&c, a, "edit-me", old).await;
    until_destination(&c, b, "edit-me", old).await;

    let trail = get_json(&c, a, "/api/v1/audit?code=edit-me&action=edited", &admin).await;
    let rows = trail["entries"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (&rows[0]["actor"], &rows[0]["old_url"], &rows[0]["new_url"]),
        (
            &json!("root"),
            &json!("https://example.org/new"),
            &json!(old)
        )
    );
    assert_eq!(
        (&rows[1]["actor"], &rows[1]["old_url"], &rows[1]["new_url"]),
        (
            &json!("alice"),
            &json!(old),
            &json!("https://example.org/new")
        )
    );

    // Expiry: a date, or days from now; a past date expires nothing.
    let resp = patch(
        &c,
        a,
        "edit-me",
        &alice,
        json!({"expires_at": "2030-01-02T03:04:05Z"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let link: Value = resp.json().await.unwrap();
    assert_eq!(link["expires_at"], "2030-01-02T03:04:05Z");
    assert_eq!(link["version"], 4);
    let trail = get_json(&c, a, "/api/v1/audit?code=edit-me&limit=1", &admin).await;
    let detail = trail["entries"][0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("expires_at ") && detail.ends_with(" -> 2030-01-02T03:04:05Z"),
        "{detail}"
    );
    let resp = patch(&c, a, "edit-me", &alice, json!({"expires_in_days": 7})).await;
    assert_eq!(resp.status(), StatusCode::OK);

    // Refusals: nothing changes.
    for (body, code) in [
        (json!({}), "invalid_body"),
        (
            json!({"destination": "https://example.net/"}),
            "invalid_body",
        ),
        (json!({"long_url": "ftp://example.net/"}), "invalid_url"),
        (json!({"long_url": "https://evil.example/x"}), "url_blocked"),
        (
            json!({"expires_at": "2030-01-01T00:00:00Z", "expires_in_days": 3}),
            "invalid_expiry",
        ),
        (json!({"expires_in_days": 0}), "invalid_expiry"),
        (json!({"expires_in_days": 3651}), "invalid_expiry"),
        (json!({"expires_at": "next week"}), "invalid_expiry"),
    ] {
        let resp = patch(&c, a, "edit-me", &alice, body.clone()).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_code(resp).await, code, "{body}");
    }
    // Well-formed instants the clock rules out: 422, as the document says.
    for at in ["2001-01-01T00:00:00Z", "2999-01-01T00:00:00+02:00"] {
        let body = json!({ "expires_at": at });
        let resp = patch(&c, a, "edit-me", &alice, body.clone()).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(error_code(resp).await, "invalid_expiry", "{body}");
    }
    let resp = patch(
        &c,
        a,
        "edit-me",
        &bob,
        json!({"long_url": "https://example.net/"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(resp).await, "not_found");
    let resp = patch(
        &c,
        a,
        "nope-nope",
        &alice,
        json!({"long_url": "https://example.net/"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = c
        .patch(a.url("/api/v1/links/edit-me"))
        .bearer_auth(&alice)
        .body("long_url=x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let shown = get_json(&c, b, "/api/v1/links/edit-me", &alice).await;
    assert_eq!(
        (&shown["long_url"], &shown["version"]),
        (&json!(old), &json!(5))
    );
    assert_eq!(destination(&c, b, "edit-me").await.as_deref(), Some(old));

    // A deleted link stays deleted.
    let resp = c
        .delete(a.url("/api/v1/links/edit-me"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = patch(
        &c,
        b,
        "edit-me",
        &alice,
        json!({"long_url": "https://example.net/"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(error_code(resp).await, "link_deleted");
}

/// A code both processes found unknown, then created through one of them (and another by
/// the CLI, which reaches neither but through the store): both redirect within about a
/// second, though a 404 is remembered `--negative-cache-ttl` (default 60 s): only the
/// creates' change notes clear it in time.
async fn creating(a: &Shortener, b: &Shortener, store: &[&str], dir: &Path) {
    let c = client();
    let alice = token_in(store, "alice", false);
    for code in ["made-on-a", "made-by-cli"] {
        for server in [a, b] {
            assert_eq!(follow(&c, server, code).await, StatusCode::NOT_FOUND);
        }
    }
    new_link(&c, a, "made-on-a", &alice).await;
    let took = until_status(&c, b, "made-on-a", StatusCode::FOUND).await;
    eprintln!("a create on A redirected on B after {took:?}");
    let file = dir.join("made-by-cli.csv");
    std::fs::write(&file, "https://example.com/made-by-cli,made-by-cli\n").unwrap();
    cli(
        &["import", file.to_str().unwrap(), "--user", "alice"],
        store,
    );
    for server in [a, b] {
        let took = until_status(&c, server, "made-by-cli", StatusCode::FOUND).await;
        eprintln!("a create by the CLI redirected after {took:?}");
    }
}

/// Two serving processes on `kind`, refusing destinations on [`feed`].
async fn pair(kind: Kind) -> Pair {
    let dir = TempDir::new().unwrap();
    let feed = feed(dir.path());
    Pair::start_in(dir, kind, &["--threat-feed", &feed]).await
}

/// Listing, paging, editing and creating on one store.
async fn listed_and_edited(kind: Kind) {
    let pair = pair(kind).await;
    listing(&pair.a, &pair.b, &pair.store()).await;
    paging_while_creating(&pair.a, &pair.store()).await;
    editing(&pair.a, &pair.b, &pair.store()).await;
    creating(&pair.a, &pair.b, &pair.store(), pair.dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_links_are_listed_and_edited_across_processes() {
    listed_and_edited(Kind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_links_are_listed_and_edited_across_instances() {
    listed_and_edited(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_an_edit_reaches_every_instance_and_layer() {
    let pair = pair(Kind::ScaleOut).await;
    editing(&pair.a, &pair.b, &pair.store()).await;
}

/// Reads the QR code of a greyscale PNG; its size and text.
fn read_png_qr(bytes: &[u8]) -> (u32, String) {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut pixels = vec![0; decoder.output_buffer_size().unwrap()];
    let info = decoder.next_frame(&mut pixels).unwrap();
    assert_eq!(info.color_type, png::ColorType::Grayscale);
    assert_eq!(info.width, info.height);
    let width = info.width as usize;
    let mut image =
        rqrr::PreparedImage::prepare_from_greyscale(width, width, |x, y| pixels[y * width + x]);
    let grids = image.detect_grids();
    assert_eq!(grids.len(), 1);
    let (_, text) = grids[0].decode().unwrap();
    (info.width, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_has_a_qr_code_of_its_short_url() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let a = Shortener::start(dir.path(), &[]);
    let c = client();
    let alice = token_in(&["--data-dir", &data], "alice", false);
    let bob = token_in(&["--data-dir", &data], "bob", false);
    new_link(&c, &a, "qr-code", &alice).await;
    let get = |query: &str, token: &str| {
        c.get(a.url(&format!("/api/v1/links/qr-code/qr{query}")))
            .bearer_auth(token)
            .send()
    };

    let resp = get("?format=png&size=300", &alice).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "image/png");
    assert_eq!(resp.headers()["cache-control"], "private, max-age=86400");
    let (side, text) = read_png_qr(&resp.bytes().await.unwrap());
    assert!((300..400).contains(&side), "{side}");
    assert_eq!(text, a.url("/qr-code"));

    let resp = get("", &alice).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "image/svg+xml");
    let svg = resp.text().await.unwrap();
    assert!(svg.contains("<svg") && svg.contains("<path"), "{svg}");

    for query in [
        "?format=gif",
        "?size=63",
        "?size=1025",
        "?size=big",
        "?colour=red",
    ] {
        let resp = get(query, &alice).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(error_code(resp).await, "invalid_query", "{query}");
    }
    let resp = get("", &bob).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = c
        .get(a.url("/api/v1/links/qr-code/qr"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}
