//! The web app in headless Chromium against the real binary: an anonymous create through the
//! CAPTCHA, sign in, create, see it listed, edit the destination and follow the short URL
//! to the new one, see the chart move after clicks, and an admin disabling a reported link.
//! A screenshot of each page goes to `target/webapp-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Shortener, client, token};
use reqwest::StatusCode;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::Browser;

fn screenshot_path(name: &str) -> PathBuf {
    // CARGO_TARGET_TMPDIR is target/tmp; the screenshots sit next to it.
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("webapp-screenshots")
        .join(format!("{name}.png"))
}

/// Checks what a keyboard or screen-reader user depends on, then writes the screenshot: every
/// control has a label, no positive `tabindex` reorders the focus, the page has one `h1`.
async fn look(browser: &Browser, name: &str) {
    let unlabelled = browser
        .script(
            "return [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
               .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                            && !(e.tagName === 'BUTTON' && e.textContent.trim()))
               .map(e => e.outerHTML)",
        )
        .await;
    assert_eq!(unlabelled, json!([]), "{name}: controls without a label");
    let reordered = browser
        .script("return [...document.querySelectorAll('[tabindex]')].filter(e => e.tabIndex > 0).map(e => e.outerHTML)")
        .await;
    assert_eq!(
        reordered,
        json!([]),
        "{name}: focus order changed by tabindex"
    );
    assert_eq!(
        browser
            .script("return document.querySelectorAll('h1').length")
            .await,
        1,
        "{name}"
    );
    browser.screenshot(&screenshot_path(name)).await;
}

/// Loads `url` and waits until the page has loaded.
async fn open(browser: &Browser, url: &str) {
    browser.goto(url).await;
    browser
        .wait_for("return document.readyState === 'complete'")
        .await;
}

/// Clicks `css` and waits until the browser has left `from`.
async fn submit(browser: &Browser, css: &str) {
    let from = browser.url().await;
    browser.click(css).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while browser.url().await == from {
        assert!(
            Instant::now() < deadline,
            "{css} did not navigate away from {from}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser
        .wait_for("return document.readyState === 'complete'")
        .await;
}

async fn text(browser: &Browser, css: &str) -> String {
    browser
        .script(&format!(
            "const e = document.querySelector({css:?}); return e ? e.textContent : null"
        ))
        .await
        .as_str()
        .unwrap_or_else(|| panic!("no {css}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_manage_their_links_in_a_browser() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(
        dir.path(),
        &[
            "--captcha",
            "always",
            "--captcha-max-number",
            "20000",
            "--click-flush-ms",
            "100",
        ],
    );
    let alice = token(dir.path(), "alice", false);
    let admin = token(dir.path(), "root", true);
    let c = client();
    let browser = Browser::start(1280, 900).await;

    // Anonymous, with the CAPTCHA solved by the page's script.
    open(&browser, &server.url("/")).await;
    assert!(browser.url().await.ends_with("/_/"));
    // The ALTCHA widget (its worker under the strict policy) solves the challenge on load.
    browser
        .wait_for("const i = document.querySelector('altcha-widget input[name=altcha]'); return !!(i && i.value)")
        .await;
    assert_eq!(
        browser
            .script("return document.querySelector('altcha-widget [data-state]').dataset.state")
            .await,
        "verified"
    );
    browser
        .fill("#long_url", "https://example.com/anonymous")
        .await;
    look(&browser, "1-create-anonymous").await;
    submit(&browser, "form.card button[type=submit]").await;
    let short = text(&browser, ".created .short a").await;
    assert!(short.starts_with(&server.base), "{short}");
    let anon = c.get(&short).send().await.unwrap();
    assert_eq!(anon.status(), StatusCode::FOUND);
    assert_eq!(anon.headers()["location"], "https://example.com/anonymous");

    // Sign in.
    open(&browser, &server.url("/_/signin")).await;
    browser.fill("#token", &alice).await;
    look(&browser, "2-sign-in").await;
    submit(&browser, "form.card button[type=submit]").await;
    assert!(browser.url().await.ends_with("/_/links"));
    assert!(text(&browser, ".who").await.contains("alice"));

    // Create: signed-in people are never asked for the CAPTCHA.
    open(&browser, &server.url("/_/")).await;
    assert_eq!(
        browser
            .script("return document.querySelectorAll('altcha-widget').length")
            .await,
        0
    );
    browser.fill("#long_url", "https://example.com/first").await;
    browser.fill("#custom_alias", "web-demo").await;
    browser.fill("#expires_in_days", "30").await;
    submit(&browser, "form.card button[type=submit]").await;
    assert_eq!(
        text(&browser, ".created .short a").await,
        server.url("/web-demo")
    );
    // The copy button is there once the script runs.
    assert_eq!(
        browser
            .script("return document.querySelector('button[data-copy]').hidden")
            .await,
        false
    );
    look(&browser, "3-created").await;
    // The same alias again: the error on the page, what was typed still there.
    open(&browser, &server.url("/_/")).await;
    browser.fill("#long_url", "https://example.com/again").await;
    browser.fill("#custom_alias", "web-demo").await;
    submit(&browser, "form.card button[type=submit]").await;
    assert!(
        text(&browser, "[role=alert]")
            .await
            .contains("already taken")
    );
    assert_eq!(
        browser
            .script("return document.querySelector('#long_url').value")
            .await,
        "https://example.com/again"
    );
    look(&browser, "3b-create-refused").await;

    // Listed, and found by search.
    for i in 0..3 {
        let made = common::create(
            &c,
            &server,
            json!({"long_url": format!("https://example.net/other/{i}")}),
            Some(&alice),
        )
        .await;
        assert_eq!(made.status(), StatusCode::CREATED);
    }
    open(&browser, &server.url("/_/links")).await;
    let codes = browser
        .script("return [...document.querySelectorAll('tr[data-code]')].map(r => r.dataset.code)")
        .await;
    assert_eq!(codes.as_array().unwrap().len(), 4, "{codes}");
    assert!(codes.as_array().unwrap().contains(&json!("web-demo")));
    look(&browser, "4-my-links").await;
    browser.fill("#q", "web-demo").await;
    submit(&browser, "form.search button[type=submit]").await;
    let codes = browser
        .script("return [...document.querySelectorAll('tr[data-code]')].map(r => r.dataset.code)")
        .await;
    assert_eq!(codes, json!(["web-demo"]));

    // The link's page: edit the destination, then the short URL leads there.
    submit(&browser, "tr[data-code=web-demo] td a").await;
    assert!(browser.url().await.ends_with("/_/links/web-demo"));
    let qr_ok = browser
        .wait_for("const i = document.querySelector('figure.qr img'); return i.complete && i.naturalWidth > 0")
        .await;
    assert_eq!(qr_ok, true);
    browser
        .fill("#long_url", "https://example.org/second")
        .await;
    submit(&browser, "form[action$='/destination'] button").await;
    assert!(
        text(&browser, ".notice")
            .await
            .contains("destination is changed")
    );
    assert_eq!(
        text(&browser, "#destination").await,
        "https://example.org/second"
    );
    let followed = c.get(server.url("/web-demo")).send().await.unwrap();
    assert_eq!(followed.headers()["location"], "https://example.org/second");

    // Clicks by people and by a bot move the chart (today is the last bar).
    for _ in 0..2 {
        c.get(server.url("/web-demo")).send().await.unwrap();
    }
    let bot = reqwest::Client::builder()
        .user_agent("Googlebot/2.1 (+http://www.google.com/bot.html)")
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for _ in 0..2 {
        bot.get(server.url("/web-demo")).send().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        open(&browser, &server.url("/_/links/web-demo")).await;
        let today = browser
            .script("const d = [...document.querySelectorAll('#chart g.day')].pop(); return [d.dataset.people, d.dataset.bots, d.dataset.visitors]")
            .await;
        // The three clicks by people came from one client: one unique visitor.
        if today == json!(["3", "2", "1"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the chart never showed the clicks: {today}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bars = browser
        .script("return document.querySelectorAll('#chart rect.people').length + document.querySelectorAll('#chart rect.bots').length")
        .await;
    assert_eq!(bars, 2, "one bar of each kind today");
    look(&browser, "5-link-page").await;
    // The CSV link downloads what the chart shows (fetched with the browser's session).
    let csv = browser
        .script("const r = new XMLHttpRequest(); r.open('GET', document.querySelector('a[href$=\"analytics.csv\"]').href, false); r.send(); return r.responseText")
        .await;
    assert!(
        csv.as_str()
            .unwrap()
            .starts_with("date,clicks,bot_clicks,unique_visitors\n"),
        "{csv}"
    );
    assert!(
        csv.as_str().unwrap().trim_end().ends_with(",3,2,1"),
        "{csv}"
    );
    // The breakdowns of those people: where they came from (no Referer: direct).
    assert_eq!(
        browser
            .script("return document.querySelector('#breakdown-referrers tbody td').textContent")
            .await,
        "direct"
    );

    // Someone reports it; an admin disables it from the queue.
    let report = c
        .post(server.url("/api/v1/links/web-demo/reports"))
        .json(&json!({"category": "spam", "comment": "looks like spam"}))
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), StatusCode::ACCEPTED);
    submit(&browser, "form[action='/_/signout'] button").await;
    open(&browser, &server.url("/_/signin")).await;
    browser.fill("#token", &admin).await;
    submit(&browser, "form.card button[type=submit]").await;
    open(&browser, &server.url("/_/admin")).await;
    let row = "tr[data-report]";
    assert!(text(&browser, row).await.contains("looks like spam"));
    look(&browser, "6-admin").await;
    browser
        .fill(
            &format!("{row} input[name=reason]"),
            "spam, confirmed by review",
        )
        .await;
    submit(&browser, &format!("{row} form[action$='/disable'] button")).await;
    assert!(text(&browser, ".notice").await.contains("disabled"));
    assert!(
        text(&browser, row)
            .await
            .contains("spam, confirmed by review")
    );
    assert_eq!(
        c.get(server.url("/web-demo"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::GONE
    );
    browser
        .fill(&format!("{row} input[name=resolution]"), "disabled")
        .await;
    submit(&browser, &format!("{row} form[action$='/resolve'] button")).await;
    assert!(text(&browser, ".notice").await.contains("resolved"));
    assert_eq!(
        browser
            .script("return document.querySelectorAll('tr[data-report]').length")
            .await,
        0,
        "the open queue is empty"
    );
    // The trail shows the disable with its reason.
    let trail = text(&browser, "table.audit tbody").await;
    assert!(
        trail.contains("disabled") && trail.contains("spam, confirmed by review"),
        "{trail}"
    );
    look(&browser, "7-admin-after").await;
    open(&browser, &server.url("/_/links/web-demo")).await;
    assert_eq!(text(&browser, "#link-status").await, "disabled");
    look(&browser, "8-link-disabled").await;
}
