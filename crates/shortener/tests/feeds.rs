//! Threat feeds end to end: a reload sweeping 10 000 links while redirects run (embedded
//! store), and one sweep for two processes on one store (the embedded file, PostgreSQL, and
//! PostgreSQL + Redis), and garbage lines skipped and logged by number.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair};
use common::{Shortener, client, create, eventually, follow, get_json, metric, token_in};
use futures_util::StreamExt;
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tempfile::TempDir;

const DISABLED: &str = "shortener_threat_sweep_disabled_total";
const SWEPT: &str = "shortener_threat_sweep_duration_seconds_count";
const LEFT: &str = "shortener_threat_sweeps_left_total";

/// Creates `n` links, every other one to a subdomain of `evil.example`; returns the codes
/// as (evil, good).
async fn links(server: &Shortener, token: &str, n: usize) -> (Vec<String>, Vec<String>) {
    let c = client();
    let made: Vec<(bool, String)> = futures_util::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            async move {
                let evil = i % 2 == 0;
                let url = if evil {
                    format!("https://www{}.evil.example/{i}", i % 7)
                } else {
                    format!("https://good.example/{i}")
                };
                let resp = create(&c, server, json!({ "long_url": url }), Some(token)).await;
                assert_eq!(resp.status(), StatusCode::CREATED);
                let body: Value = resp.json().await.unwrap();
                (evil, body["short_code"].as_str().unwrap().to_owned())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let (evil, good): (Vec<_>, Vec<_>) = made.into_iter().partition(|(evil, _)| *evil);
    (
        evil.into_iter().map(|(_, c)| c).collect(),
        good.into_iter().map(|(_, c)| c).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_sweeps_ten_thousand_links_while_redirects_run() {
    let dir = TempDir::new().unwrap();
    let feed = dir.path().join("urlhaus.txt");
    // Garbage lines are skipped (and logged with their numbers), never fatal.
    std::fs::write(&feed, "# nothing yet\n%%% not an entry\nhttp://\n").unwrap();
    let data = dir.path().join("data");
    let server = Shortener::start(&data, &["--threat-feed", feed.to_str().unwrap()]);
    let admin = token_in(&["--data-dir", data.to_str().unwrap()], "ops", true);
    let (evil, good) = links(&server, &admin, 10_000).await;
    let c = client();
    let listed = create(
        &c,
        &server,
        json!({"long_url": "https://good.example/listed"}),
        Some(&admin),
    )
    .await;
    assert_eq!(listed.status(), StatusCode::CREATED);
    let listed = listed.json::<Value>().await.unwrap()["short_code"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(metric(&c, &server, DISABLED).await, 0.0);

    // Redirects of good links run throughout the sweep; every one must be a 302.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let redirects: Vec<_> = (0..4)
        .map(|w| {
            let (c, url, stop, served) = (
                c.clone(),
                server.url(&format!("/{}", good[w])),
                stop.clone(),
                served.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let status = c.get(&url).send().await.unwrap().status();
                    assert_eq!(status, StatusCode::FOUND);
                    served.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    std::fs::write(
        &feed,
        "# domains, hosts-file lines and URLs\n0.0.0.0 evil.example\n\
         https://good.example/listed\nnot a line we know\n",
    )
    .unwrap();
    server.process.signal(Signal::SIGHUP).unwrap();
    let expected = (evil.len() + 1) as f64;
    eventually("the sweep to disable every matching link", || async {
        metric(&c, &server, DISABLED).await >= expected
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for r in redirects {
        r.await.unwrap();
    }
    assert!(served.load(Ordering::Relaxed) > 0);
    assert_eq!(metric(&c, &server, DISABLED).await, expected);

    assert_eq!(follow(&c, &server, &listed).await, StatusCode::GONE);
    for code in evil.iter().take(50) {
        assert_eq!(follow(&c, &server, code).await, StatusCode::GONE, "{code}");
    }
    for code in good.iter().take(50) {
        assert_eq!(follow(&c, &server, code).await, StatusCode::FOUND, "{code}");
    }
    let trail = get_json(
        &c,
        &server,
        "/api/v1/audit?actor=threat-feed&limit=1",
        &admin,
    )
    .await;
    let entry = &trail["entries"][0];
    assert_eq!(entry["action"], "disabled");
    assert_eq!(entry["detail"], "destination on threat feed urlhaus.txt");
    // New creates of matching destinations are refused, naming the feed.
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://x.evil.example/"}),
        Some(&admin),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "url_blocked");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("urlhaus.txt")
    );
    assert!(metric(&c, &server, "shortener_threat_feed_entries").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_one_embedded_file_one_process_sweeps() {
    one_sweep_disables_each_match_once(Kind::Embedded, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_one_postgres_without_redis_one_instance_sweeps() {
    one_sweep_disables_each_match_once(Kind::Postgres, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_one_sweep_disables_each_match_once() {
    one_sweep_disables_each_match_once(Kind::ScaleOut, 2_000).await;
}

/// Both processes reload one feed: exactly one sweeps (the other leaves it, whether the
/// sweep still runs or is done), and each of `n` links' matches is disabled once.
async fn one_sweep_disables_each_match_once(kind: Kind, n: usize) {
    let dir = TempDir::new().unwrap();
    let feed = dir.path().join("openphish.txt");
    std::fs::write(&feed, "# empty\n").unwrap();
    let flags = [
        "--threat-feed",
        feed.to_str().unwrap(),
        // 32 creates in flight on a shared 2-core machine: the default 250 ms store deadline
        // would turn commit queues into 503s, which this test of the sweep is not about.
        "--store-timeout-ms",
        "10000",
    ];
    let pair = Pair::start_in(dir, kind, &flags).await;
    let (a, b) = (&pair.a, &pair.b);
    let admin = token_in(&pair.store(), "ops", true);
    let (evil, good) = links(a, &admin, n).await;
    let c = client();

    std::fs::write(&feed, "evil.example\n").unwrap();
    a.process.signal(Signal::SIGHUP).unwrap();
    b.process.signal(Signal::SIGHUP).unwrap();
    let total = || async { metric(&c, a, DISABLED).await + metric(&c, b, DISABLED).await };
    eventually("the sweep to disable every matching link", || async {
        total().await >= evil.len() as f64
    })
    .await;
    // Each process's own attempt on the new feed, swept or left to the other.
    let attempts = |s| {
        let c = &c;
        async move { metric(c, s, SWEPT).await + metric(c, s, LEFT).await }
    };
    eventually("both processes to have tried to sweep", || async {
        attempts(a).await >= 1.0 && attempts(b).await >= 1.0
    })
    .await;
    assert_eq!(metric(&c, a, SWEPT).await + metric(&c, b, SWEPT).await, 1.0);
    assert_eq!(total().await, evil.len() as f64);
    let mut rows = 0;
    let mut cursor = String::new();
    loop {
        let page = get_json(
            &c,
            b,
            &format!("/api/v1/audit?actor=threat-feed&limit=500{cursor}"),
            &admin,
        )
        .await;
        rows += page["entries"].as_array().unwrap().len();
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(rows, evil.len());
    for server in [a, b] {
        assert_eq!(follow(&c, server, &evil[0]).await, StatusCode::GONE);
        assert_eq!(follow(&c, server, &good[0]).await, StatusCode::FOUND);
    }
}

/// A feed with garbage lines starts the server: each skipped line is logged with its number
/// and the feed's name, and the good entries are in force.
#[tokio::test(flavor = "multi_thread")]
async fn garbage_lines_are_skipped_and_logged_by_number() {
    let dir = TempDir::new().unwrap();
    let feed = dir.path().join("mixed.txt");
    std::fs::write(
        &feed,
        "# a feed\nbad.example\n%%% junk\nhttp://\nok.example extra words\n",
    )
    .unwrap();
    let log = dir.path().join("serve.log");
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--threat-feed")
        .arg(&feed)
        .env("SHORTENER_LOG", "warn")
        .stderr(std::fs::File::create(&log).unwrap());
    let mut process = testkit::Process::spawn("shortener", cmd).unwrap();
    process
        .wait_for_line("listening on ", std::time::Duration::from_secs(60))
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let skipped: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("skipped a feed line"))
        .collect();
    assert_eq!(skipped.len(), 3, "{text}");
    for (entry, line) in skipped.iter().zip(["line=3", "line=4", "line=5"]) {
        assert!(
            entry.contains(line) && entry.contains("mixed.txt"),
            "{entry}"
        );
    }
    process.terminate().unwrap();
}

/// A feed file that changes is re-read without a signal (its modification time is watched).
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_feed_file_is_re_read_without_a_signal() {
    let dir = TempDir::new().unwrap();
    let feed = dir.path().join("openphish.txt");
    std::fs::write(&feed, "# empty\n").unwrap();
    let server = Shortener::start(
        &dir.path().join("data"),
        &["--threat-feed", feed.to_str().unwrap()],
    );
    let c = client();
    assert_eq!(
        metric(&c, &server, "shortener_threat_feed_entries").await,
        0.0
    );
    std::fs::write(&feed, "evil.example\nhttp://ok.example/phish.php\n").unwrap();
    eventually("the changed feed to be re-read", || async {
        metric(&c, &server, "shortener_threat_feed_entries").await == 2.0
    })
    .await;
    let resp = create(
        &c,
        &server,
        json!({"long_url": "https://a.evil.example/"}),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}
