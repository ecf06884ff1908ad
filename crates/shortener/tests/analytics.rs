//! Analytics beyond daily totals, end to end on the real binary: unique visitors and the
//! breakdowns on the embedded store, on PostgreSQL and in the scale-out mode (clicks through
//! the Redis stream), two serving processes each, every visitor clicking on both; the CSV
//! export; a country database written here; bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair};
use common::{
    Shortener, client, error_code, eventually, new_link, one_line_failure, run, today_utc,
    write_geoip,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::net::IpAddr;
use tempfile::TempDir;

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";
/// People per network below; each clicks on both servers.
const PER_NETWORK: u8 = 20;

/// A visitor: address (sent as X-Forwarded-For), User-Agent, Referer.
fn visitors() -> Vec<(IpAddr, &'static str, Option<&'static str>)> {
    (0..PER_NETWORK)
        .flat_map(|i| {
            let referer = (i % 4 == 0).then_some("https://www.news.example/story");
            [
                (IpAddr::from([81, 2, 69, i]), FIREFOX, referer),
                (IpAddr::from([175, 16, 199, i]), IPHONE, None),
            ]
        })
        .collect()
}

async fn click(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    (ip, ua, referer): (IpAddr, &str, Option<&str>),
) {
    let mut request = c
        .get(server.url(&format!("/{code}")))
        .header("x-forwarded-for", ip.to_string())
        .header("user-agent", ua);
    if let Some(referer) = referer {
        request = request.header("referer", referer);
    }
    assert_eq!(request.send().await.unwrap().status(), StatusCode::FOUND);
}

async fn get(
    c: &reqwest::Client,
    server: &Shortener,
    path: &str,
    token: &str,
) -> reqwest::Response {
    c.get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn analytics(c: &reqwest::Client, server: &Shortener, query: &str, token: &str) -> Value {
    analytics_of(c, server, "people", query, token).await
}

async fn analytics_of(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    query: &str,
    token: &str,
) -> Value {
    let resp = get(
        c,
        server,
        &format!("/api/v1/links/{code}/analytics{query}"),
        token,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK, "{code}{query}");
    resp.json().await.unwrap()
}

fn entries(list: &Value) -> Vec<(String, u64)> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a breakdown: {list}"))
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["clicks"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    expected.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// Every visitor clicks once on each server, bots a few times; then each person counts once
/// in unique visitors and every click once in the breakdowns, whichever server answers.
async fn people_are_counted_once(a: &Shortener, b: &Shortener, store: &[&str], geoip: bool) {
    let c = client();
    let alice = common::token_in(store, "alice", false);
    let bob = common::token_in(store, "bob", false);
    new_link(&c, a, "people", &alice).await;
    let people = visitors();
    for &visitor in &people {
        click(&c, a, "people", visitor).await;
        click(&c, b, "people", visitor).await;
    }
    for _ in 0..3 {
        let resp = c
            .get(b.url("/people"))
            .header("user-agent", "curl/8.5.0")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FOUND);
    }
    let clicks = 2 * people.len() as u64;
    eventually("every click in analytics", || async {
        let a = analytics(&c, b, "", &alice).await;
        a["total_clicks"] == clicks && a["bot_clicks"] == 3
    })
    .await;
    // One more click by a known visitor, folded after everything above: it must not add a
    // visitor, and nothing above may have counted twice in the meantime.
    click(&c, a, "people", people[0]).await;
    let clicks = clicks + 1;
    eventually("the last click", || async {
        analytics(&c, a, "", &alice).await["total_clicks"] == clicks
    })
    .await;

    let mut names = "referrers,browsers,os,devices".to_owned();
    if geoip {
        names.push_str(",countries");
    }
    let report = analytics(&c, a, &format!("?breakdown={names},os"), &alice).await;
    // An estimate: two of the 40 keys may share a register (about 5 % of runs, the visitor key
    // being new in each store), so it is within 2 of the truth; every other view of the same
    // registers must then say exactly the same number.
    let visitors = report["unique_visitors"].as_u64().unwrap();
    assert!(
        visitors.abs_diff(people.len() as u64) <= 2,
        "{visitors} unique visitors for {}: {report}",
        people.len()
    );
    let days = report["daily_clicks"].as_array().unwrap();
    assert_eq!(days.len(), 30);
    let today = &days[29];
    assert_eq!(today["date"], today_utc().as_str());
    assert_eq!(
        (
            &today["clicks"],
            &today["bot_clicks"],
            &today["unique_visitors"]
        ),
        (&json!(clicks), &json!(3), &json!(visitors))
    );
    assert_eq!(days[0]["unique_visitors"], 0);
    // people[0] is a Firefox user on 81.2.69.0 with the news referrer.
    let firefox = u64::from(PER_NETWORK) * 2 + 1;
    let iphone = u64::from(PER_NETWORK) * 2;
    let news = u64::from(PER_NETWORK / 4) * 2 + 1;
    assert_eq!(
        entries(&report["referrers"]),
        pairs(&[("direct", clicks - news), ("news.example", news)])
    );
    assert_eq!(
        entries(&report["browsers"]),
        pairs(&[("Firefox", firefox), ("Safari", iphone)])
    );
    assert_eq!(
        entries(&report["os"]),
        pairs(&[("Linux", firefox), ("iPhone", iphone)])
    );
    assert_eq!(
        entries(&report["devices"]),
        pairs(&[("desktop", firefox), ("mobile", iphone)])
    );
    if geoip {
        assert_eq!(
            entries(&report["countries"]),
            pairs(&[("GB", firefox), ("CN", iphone)])
        );
    } else {
        assert!(report.get("countries").is_none());
        let resp = get(
            &c,
            a,
            "/api/v1/links/people/analytics?breakdown=countries",
            &alice,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_code(resp).await, "breakdown_unavailable");
    }
    // Without breakdown=, none of them.
    let plain = analytics(&c, b, "", &alice).await;
    assert!(plain.get("referrers").is_none() && plain.get("browsers").is_none());
    assert_eq!(plain["unique_visitors"], visitors);

    // The CSV export: same numbers, same access rule.
    let resp = get(&c, b, "/api/v1/links/people/analytics.csv", &alice).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let csv = resp.text().await.unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 31);
    assert_eq!(lines[0], "date,clicks,bot_clicks,unique_visitors");
    assert_eq!(lines[30], format!("{},{clicks},3,{visitors}", today_utc()));
    for (path, status) in [
        ("/api/v1/links/people/analytics.csv", StatusCode::NOT_FOUND),
        ("/api/v1/links/people/analytics", StatusCode::NOT_FOUND),
    ] {
        assert_eq!(get(&c, a, path, &bob).await.status(), status, "{path}");
    }
    let resp = c
        .get(a.url("/api/v1/links/people/analytics.csv"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    // Bad input: a clear 400 with the error shape.
    for query in [
        "?breakdown=colours",
        "?breakdown=",
        "?breakdown=os,,browsers",
        "?breakdown=OS",
        "?breakdowns=os",
    ] {
        let resp = get(
            &c,
            a,
            &format!("/api/v1/links/people/analytics{query}"),
            &alice,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(error_code(resp).await, "invalid_query", "{query}");
    }
}

/// 25 referrers in two batches, one per server (so the store merges a stored day with a new
/// fold): the 20 most frequent keep their names, the rest is `other`, and the sum is every
/// click by people, exactly; bots (with a referrer of their own) stay out of the breakdown.
/// A stored fold keeps only its own top 20, so a batch split by a flush could rank a
/// referrer's first click with the singles: each batch is sent at once, just after a flush
/// (a click on another link seen counted).
async fn a_breakdown_keeps_its_top_20_and_an_exact_total(
    a: &Shortener,
    b: &Shortener,
    store: &[&str],
) {
    let c = client();
    let alice = common::token_in(store, "alice", false);
    new_link(&c, a, "many-refs", &alice).await;
    new_link(&c, a, "many-refs-tick", &alice).await;
    // r05…r24 twice a batch, r00…r04 once: the top 20 is certain, ties aside.
    let referers: Vec<String> = (0..25u8)
        .flat_map(|i| {
            let times = if i < 5 { 1 } else { 2 };
            std::iter::repeat_n(format!("https://r{i:02}.example/page"), times)
        })
        .collect();
    let per_batch = referers.len() as u64;
    for (batch, server) in [a, b].into_iter().enumerate() {
        let ticks = batch as u64 + 1;
        click(
            &c,
            server,
            "many-refs-tick",
            (IpAddr::from([81, 2, 70, 1]), FIREFOX, None),
        )
        .await;
        eventually("a flush", || async {
            analytics_of(&c, a, "many-refs-tick", "", &alice).await["total_clicks"] == ticks
        })
        .await;
        futures_util::future::join_all(referers.iter().enumerate().map(|(n, referer)| {
            let ip = IpAddr::from([81, 2, 69, n as u8]);
            click(&c, server, "many-refs", (ip, FIREFOX, Some(referer)))
        }))
        .await;
        let resp = c
            .get(server.url("/many-refs"))
            .header("user-agent", "curl/8.5.0")
            .header("referer", "https://bot-ref.example/")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FOUND);
        let counted = per_batch * (batch as u64 + 1);
        eventually("the batch counted", || async {
            let r = analytics_of(&c, a, "many-refs", "", &alice).await;
            r["total_clicks"] == counted && r["bot_clicks"] == batch as u64 + 1
        })
        .await;
    }
    let report = analytics_of(&c, b, "many-refs", "?breakdown=referrers", &alice).await;
    let mut expected: Vec<(String, u64)> =
        (5..25).map(|i| (format!("r{i:02}.example"), 4)).collect();
    expected.push(("other".to_owned(), 10));
    assert_eq!(entries(&report["referrers"]), expected);
    assert_eq!(
        report["total_clicks"].as_u64().unwrap(),
        expected.iter().map(|(_, n)| n).sum::<u64>()
    );
}

/// Two processes on `kind` taking client addresses from X-Forwarded-For, with a country
/// database when `countries`.
async fn on(kind: Kind, countries: bool) {
    let dir = TempDir::new().unwrap();
    let geoip = write_geoip(dir.path());
    let mut flags = vec!["--trust-forwarded-for"];
    if countries {
        flags.extend(["--geoip", &geoip]);
    }
    let pair = Pair::start_in(dir, kind, &flags).await;
    people_are_counted_once(&pair.a, &pair.b, &pair.store(), countries).await;
    a_breakdown_keeps_its_top_20_and_an_exact_total(&pair.a, &pair.b, &pair.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_people_are_counted_once_with_countries() {
    on(Kind::Embedded, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_people_are_counted_once() {
    on(Kind::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_scale_out_people_are_counted_once_through_the_stream() {
    on(Kind::ScaleOut, true).await;
}

#[test]
fn a_geoip_file_that_is_not_a_database_stops_the_start_in_one_line() {
    let dir = TempDir::new().unwrap();
    let fake = dir.path().join("fake.mmdb");
    std::fs::write(&fake, "GB,81.2.69.0/24\n").unwrap();
    let data = dir.path().to_str().unwrap();
    let out = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--geoip",
            fake.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    let line = one_line_failure(&out);
    assert!(
        line.contains("--geoip") && line.contains("not a MaxMind DB"),
        "{line}"
    );
}
