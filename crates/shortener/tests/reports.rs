//! Abuse reports end to end: the real binary on the embedded store and on PostgreSQL, two
//! processes on one store: report → automatic disable → 410 on the other process, the queue,
//! resolving, exemptions, limits and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pair::{Kind, Pair};
use common::{
    Shortener, client, create, error_code, eventually, follow, get_json, metric, token_in,
    until_status,
};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

/// Serving flags of both processes: client addresses from X-Forwarded-For, so one test
/// client can report from many addresses.
const FLAGS: [&str; 5] = [
    "--trust-forwarded-for",
    "--auto-disable-reports",
    "3",
    "--reports-per-hour",
    "4",
];

async fn report(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    ip: &str,
    body: Value,
) -> reqwest::Response {
    c.post(server.url(&format!("/api/v1/links/{code}/reports")))
        .header("x-forwarded-for", ip)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn phishing(c: &reqwest::Client, server: &Shortener, code: &str, ip: &str) {
    let resp = report(c, server, code, ip, json!({"category": "phishing"})).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED, "report from {ip}");
}

async fn queue(c: &reqwest::Client, server: &Shortener, query: &str, admin: &str) -> Vec<Value> {
    let page = get_json(c, server, &format!("/api/v1/reports{query}"), admin).await;
    page["reports"].as_array().unwrap().clone()
}

async fn the_story(a: &Shortener, b: &Shortener, store: &[&str]) {
    let c = client();
    let admin = token_in(store, "root", true);
    let alice = token_in(store, "alice", false);
    let link = |alias: &str, url: &str| json!({"long_url": url, "custom_alias": alias});
    for (alias, url, token) in [
        ("bad-link", "https://example.com/bad", &alice),
        ("admins-own", "https://example.com/ops", &admin),
        ("trusted-one", "https://docs.trusted.example/x", &alice),
    ] {
        let resp = create(&c, a, link(alias, url), Some(token)).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
    }

    // Two distinct addresses (one of them twice): still redirects.
    phishing(&c, a, "bad-link", "198.51.100.1").await;
    phishing(&c, b, "bad-link", "198.51.100.1").await;
    phishing(&c, a, "bad-link", "198.51.100.2").await;
    assert_eq!(follow(&c, a, "bad-link").await, StatusCode::FOUND);
    assert_eq!(follow(&c, b, "bad-link").await, StatusCode::FOUND);
    // The third distinct address on `a`: disabled there at once, on `b` soon.
    phishing(&c, a, "bad-link", "198.51.100.3").await;
    assert_eq!(follow(&c, a, "bad-link").await, StatusCode::GONE);
    until_status(&c, b, "bad-link", StatusCode::GONE).await;
    let info = get_json(&c, b, "/api/v1/links/bad-link", &alice).await;
    assert_eq!(info["status"], "disabled");
    assert_eq!(info["disabled"]["by"], "auto-reports");
    assert!(
        info["disabled"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("pending review")
    );
    // The owner may not undo it.
    let resp = c
        .post(a.url("/api/v1/links/bad-link/enable"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    // The queue shows the reports with their link's state.
    let open = queue(&c, b, "?status=open", &admin).await;
    assert_eq!(open.len(), 4);
    assert!(
        open.iter()
            .all(|r| r["link_status"] == "disabled" && r["link_disabled_by"] == "auto-reports")
    );
    assert_eq!(open[0]["ip"], "198.51.100.3");
    // The trail holds the reports and the automatic disable.
    let trail = get_json(&c, a, "/api/v1/audit?code=bad-link", &admin).await;
    let actions: Vec<String> = trail["entries"]
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
        .collect();
    assert_eq!(
        actions,
        [
            "disabled by auto-reports",
            "reported by anonymous",
            "reported by anonymous",
            "reported by anonymous",
            "reported by anonymous",
            "created by alice"
        ]
    );

    // An admin enables it: earlier reports no longer count, so one more does not disable.
    let resp = c
        .post(a.url("/api/v1/links/bad-link/enable"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    until_status(&c, b, "bad-link", StatusCode::FOUND).await;
    phishing(&c, b, "bad-link", "198.51.100.4").await;
    phishing(&c, b, "bad-link", "198.51.100.5").await;
    assert_eq!(follow(&c, b, "bad-link").await, StatusCode::FOUND);
    phishing(&c, b, "bad-link", "198.51.100.6").await;
    assert_eq!(follow(&c, b, "bad-link").await, StatusCode::GONE);

    // Admins' links and trusted domains are never disabled automatically.
    for code in ["admins-own", "trusted-one"] {
        for i in 1..=4 {
            phishing(&c, a, code, &format!("203.0.113.{i}")).await;
        }
        assert_eq!(follow(&c, a, code).await, StatusCode::FOUND, "{code}");
    }

    // Reports per address per hour: the fifth from one address is refused.
    for _ in 0..4 {
        phishing(&c, a, "admins-own", "192.0.2.50").await;
    }
    let resp = report(
        &c,
        a,
        "admins-own",
        "192.0.2.50",
        json!({"category": "phishing"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));

    // Bad input: a clear 4xx and nothing stored.
    let before = queue(&c, a, "?limit=500", &admin).await.len();
    for (body, code) in [
        (json!({"category": "fraud"}), "invalid_category"),
        (
            json!({"category": "spam", "comment": "x".repeat(1001)}),
            "invalid_comment",
        ),
        (json!({"category": "spam", "extra": true}), "invalid_body"),
        (json!({}), "invalid_body"),
    ] {
        let resp = report(&c, a, "admins-own", "192.0.2.60", body).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_code(resp).await, code);
    }
    let resp = report(
        &c,
        a,
        "no-such-link",
        "192.0.2.61",
        json!({"category": "spam"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(queue(&c, a, "?limit=500", &admin).await.len(), before);
    let ok = report(
        &c,
        a,
        "admins-own",
        "192.0.2.62",
        json!({"category": "other", "comment": "x".repeat(1000)}),
    )
    .await;
    assert_eq!(ok.status(), StatusCode::ACCEPTED);
    let id = ok.json::<Value>().await.unwrap()["id"].as_i64().unwrap();

    // Resolving.
    let resolve = |id: String, token: String, body: Value| {
        let c = c.clone();
        let url = b.url(&format!("/api/v1/reports/{id}/resolve"));
        async move {
            c.post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let body = json!({"resolution": "not abusive"});
    assert_eq!(
        resolve(id.to_string(), alice.clone(), body.clone())
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        resolve(id.to_string(), admin.clone(), json!({"resolution": " "}))
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
    let resp = resolve(id.to_string(), admin.clone(), body.clone()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resolved: Value = resp.json().await.unwrap();
    assert_eq!(
        (
            resolved["status"].as_str(),
            resolved["resolved_by"].as_str()
        ),
        (Some("resolved"), Some("root"))
    );
    let resp = resolve(id.to_string(), admin.clone(), body.clone()).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(error_code(resp).await, "already_resolved");
    assert_eq!(
        resolve("999999".into(), admin.clone(), body.clone())
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        resolve("abc".into(), admin.clone(), body.clone())
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let done = queue(&c, a, "?status=resolved", &admin).await;
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["resolution"], "not abusive");
    assert_eq!(queue(&c, a, "?limit=500", &admin).await.len(), before);
    for bad in ["?status=closed", "?limit=501", "?cursor=!", "?colour=red"] {
        let resp = c
            .get(a.url(&format!("/api/v1/reports{bad}")))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let resp = c
        .get(a.url("/api/v1/reports"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

/// Two processes on `kind` with [`FLAGS`] and a trusted-domains file.
async fn on(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let trusted = dir.path().join("trusted.txt");
    std::fs::write(&trusted, "# our partners\ntrusted.example\n").unwrap();
    let trusted = trusted.to_str().unwrap().to_owned();
    let mut flags = FLAGS.to_vec();
    flags.extend(["--trusted-domains", &trusted]);
    let pair = Pair::start_in(dir, kind, &flags).await;
    the_story(&pair.a, &pair.b, &pair.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_disable_links_across_two_processes_on_the_embedded_store() {
    on(Kind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_disable_links_across_two_instances_on_postgres() {
    on(Kind::Postgres).await;
}

/// `--trusted-domains` follows its file (SIGHUP here; a change of the file's time too, as
/// the feeds do): a domain added protects its links from then on, one removed does not (and
/// the reports filed meanwhile count).
#[tokio::test(flavor = "multi_thread")]
async fn trusted_domains_are_re_read_like_the_feeds() {
    let dir = TempDir::new().unwrap();
    let (trusted, data) = (dir.path().join("trusted.txt"), dir.path().join("data"));
    std::fs::write(&trusted, "trusted.example\n").unwrap();
    let mut flags = FLAGS.to_vec();
    flags.extend(["--trusted-domains", trusted.to_str().unwrap()]);
    let server = Shortener::start(&data, &flags);
    let c = client();
    let alice = common::token(&data, "alice", false);
    let body = json!({"long_url": "https://www.partner.example/x", "custom_alias": "partner"});
    assert_eq!(
        create(&c, &server, body, Some(&alice)).await.status(),
        StatusCode::CREATED
    );
    let reread = |domains: f64| {
        let (c, server) = (&c, &server);
        async move {
            server.process.signal(Signal::SIGHUP).unwrap();
            eventually("the trusted domains to be re-read", || async {
                metric(c, server, "shortener_trusted_domains").await == domains
            })
            .await;
        }
    };
    assert_eq!(metric(&c, &server, "shortener_trusted_domains").await, 1.0);

    std::fs::write(&trusted, "trusted.example\npartner.example\n").unwrap();
    reread(2.0).await;
    for ip in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        phishing(&c, &server, "partner", ip).await;
    }
    assert_eq!(follow(&c, &server, "partner").await, StatusCode::FOUND);

    std::fs::write(&trusted, "trusted.example\n").unwrap();
    reread(1.0).await;
    phishing(&c, &server, "partner", "198.51.100.4").await;
    until_status(&c, &server, "partner", StatusCode::GONE).await;
}
