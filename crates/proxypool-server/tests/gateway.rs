//! The gateway against real proxies: tinyproxy instances leaving from 127.0.0.2–4, dante
//! leaving from 127.0.0.5, and a target that echoes the source address.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dante, FAST_POOL, Server, Target, Tinyproxy, get, get_via_connect};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const SITE_A: &str = "127.0.20.1";
const SITE_B: &str = "127.0.20.2";

struct Lab {
    _dir: tempfile::TempDir,
    tinyproxies: Vec<Tinyproxy>,
    _dante: Dante,
    target: Target,
    server: Server,
}

fn lab(config: &str) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let tinyproxies: Vec<Tinyproxy> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|ip| Tinyproxy::start(dir.path(), ip))
        .collect();
    let dante = Dante::start(dir.path(), "127.0.0.5");
    let target = Target::start(&[SITE_A, SITE_B]);
    let mut upstreams: Vec<String> = tinyproxies.iter().map(Tinyproxy::url).collect();
    upstreams.push(dante.url());
    let server = Server::start(dir.path(), &upstreams, config, &[]);
    Lab {
        _dir: dir,
        tinyproxies,
        _dante: dante,
        target,
        server,
    }
}

async fn exit_of(lab: &Lab, user: &str) -> (u16, Option<String>, String) {
    let client = lab.server.client(Some(user));
    let (status, error, body) = get(&client, &lab.target.url(SITE_A, "/")).await;
    (status, error, body.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_same_exit_and_sessions_spread() {
    let lab = lab("");
    // One session, 50 requests, plain HTTP and CONNECT alternating: one exit address.
    let mut exits = HashSet::new();
    for i in 0..50 {
        let body = if i % 2 == 0 {
            let (status, _, body) = exit_of(&lab, "alice-session-one").await;
            assert_eq!(status, 200, "{body}");
            body
        } else {
            let (status, body) = get_via_connect(
                lab.server.gateway,
                Some("alice-session-one"),
                SITE_A,
                lab.target.port,
                "/",
            )
            .await;
            assert!(status.contains(" 200"), "{status}: {body}");
            body.trim().to_owned()
        };
        exits.insert(body);
    }
    assert_eq!(exits.len(), 1, "one session left from {exits:?}");

    // Twenty sessions spread over the upstreams (the four exit addresses).
    let mut per_exit: HashMap<String, usize> = HashMap::new();
    for s in 0..20 {
        let (status, _, exit) = exit_of(&lab, &format!("alice-session-s{s}")).await;
        assert_eq!(status, 200);
        *per_exit.entry(exit).or_default() += 1;
    }
    assert!(per_exit.len() >= 3, "20 sessions on {per_exit:?}");
    assert!(
        per_exit.values().all(|n| *n <= 8),
        "one exit took too many sessions: {per_exit:?}"
    );
    assert!(per_exit.contains_key("127.0.0.5") || per_exit.len() == 3);

    // Keyless requests rotate and also work through SOCKS5 (dante).
    let client = lab.server.client(None);
    let mut keyless = HashSet::new();
    for _ in 0..40 {
        let (status, _, body) = get(&client, &lab.target.url(SITE_B, "/")).await;
        assert_eq!(status, 200);
        keyless.insert(body.trim().to_owned());
    }
    assert!(keyless.len() >= 3, "keyless exits {keyless:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_upstream_breaks_its_sessions_and_returns_after_quarantine() {
    let mut lab = lab(FAST_POOL);
    // Sessions until two of them sit on the first tinyproxy (exit 127.0.0.2).
    let victim_exit = lab.tinyproxies[0].bind.clone();
    let victim_url = lab.tinyproxies[0].url();
    let mut on_victim = Vec::new();
    for s in 0..60 {
        let user = format!("bob-session-{s}");
        let (status, _, exit) = exit_of(&lab, &user).await;
        assert_eq!(status, 200);
        if exit == victim_exit {
            on_victim.push(user);
        }
        if on_victim.len() == 2 {
            break;
        }
    }
    assert_eq!(
        on_victim.len(),
        2,
        "no two sessions landed on {victim_exit}"
    );

    lab.tinyproxies[0].stop();
    // The first session keeps asking: upstream failures, then session-broken once the pool
    // has quarantined the address. Never a silent move to another exit.
    let mut broken = false;
    for _ in 0..10 {
        let (status, error, body) = exit_of(&lab, &on_victim[0]).await;
        assert_ne!(status, 200, "session moved silently to {body}");
        assert_eq!(status, 502, "{error:?} {body}");
        if error.as_deref() == Some("session-broken") {
            assert!(body.contains("broken"), "{body}");
            broken = true;
            break;
        }
        assert_eq!(error.as_deref(), Some("upstream-failed"));
    }
    assert!(broken, "the session was never reported broken");
    assert_eq!(lab.server.state_of(&victim_url).await, "quarantined");
    // The other session on it is told too, at its next request.
    let (status, error, _) = exit_of(&lab, &on_victim[1]).await;
    assert_eq!((status, error.as_deref()), (502, Some("session-broken")));
    // A broken session starts over elsewhere; new sessions avoid the quarantined address.
    let (status, _, exit) = exit_of(&lab, &on_victim[0]).await;
    assert_eq!(status, 200);
    assert_ne!(exit, victim_exit);
    for s in 0..20 {
        let (status, _, exit) = exit_of(&lab, &format!("carol-session-{s}")).await;
        assert_eq!(status, 200);
        assert_ne!(
            exit, victim_exit,
            "a new session was placed on the quarantined address"
        );
    }

    // Back up: when its wait ends the pool offers it half-open (probing); keyless traffic
    // that succeeds through it brings it back to healthy.
    lab.tinyproxies[0].restart();
    let client = lab.server.client(None);
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut served_again = false;
    loop {
        let (status, _, body) = get(&client, &lab.target.url(SITE_B, "/")).await;
        assert_eq!(status, 200, "{body}");
        served_again |= body.trim() == victim_exit;
        if served_again && lab.server.state_of(&victim_url).await == "healthy" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted upstream never returned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snapshot = lab.server.api_get("/v1/snapshot").await;
    let steps: Vec<(String, String)> = snapshot["snapshot"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["subject"]["address"] == victim_url.as_str())
        .map(|d| {
            (
                d["from"].as_str().unwrap().into(),
                d["to"].as_str().unwrap().into(),
            )
        })
        .collect();
    for step in [("quarantined", "probing"), ("probing", "healthy")] {
        assert!(
            steps.iter().any(|(f, t)| (f.as_str(), t.as_str()) == step),
            "{step:?} missing from {steps:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captchas_on_one_site_never_quarantine_addresses_for_others() {
    let lab = lab("");
    let client = lab.server.client(None);
    // Site A answers every address with a captcha page; site B serves everyone.
    for _ in 0..60 {
        let (status, _, body) = get(&client, &lab.target.url(SITE_A, "/?do=captcha")).await;
        assert_eq!(status, 200);
        assert!(body.contains("g-recaptcha"));
        let (status, _, _) = get(&client, &lab.target.url(SITE_B, "/")).await;
        assert_eq!(status, 200);
    }
    let addresses = lab.server.api_get("/v1/addresses").await;
    for a in addresses.as_array().unwrap() {
        assert!(
            a["state"] == "healthy" || a["state"] == "degraded",
            "captchas of one site put an address out of service: {a}"
        );
        assert_eq!(a["quarantine_entries"], 0, "{a}");
    }
    let matrix = lab.server.api_get("/v1/matrix").await;
    let site_a = matrix["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["site"] == SITE_A)
        .unwrap();
    assert_eq!(site_a["degraded"], true, "{site_a}");
    let cells = matrix["cells"].as_array().unwrap();
    let b_cells: Vec<_> = cells.iter().filter(|c| c["site"] == SITE_B).collect();
    assert_eq!(b_cells.len(), 4, "{b_cells:?}");
    for c in b_cells {
        assert_eq!(c["success_rate"], 1.0, "{c}");
    }
    let a_captchas: u64 = cells
        .iter()
        .filter(|c| c["site"] == SITE_A)
        .map(|c| c["captchas"].as_u64().unwrap())
        .sum();
    assert_eq!(a_captchas, 60);

    // 403 and 429 (with Retry-After) for one source only are recorded as a block and a rate
    // limit of that address.
    let only = "127.0.0.3";
    for answer in [403, 429] {
        let url = lab.target.url(SITE_B, &format!("/?do={answer}&for={only}"));
        let mut seen = false;
        for _ in 0..60 {
            if get(&client, &url).await.0 == answer {
                seen = true;
                break;
            }
        }
        assert!(seen, "no request of 60 left from {only}");
    }
    let cells = lab.server.api_get("/v1/matrix").await;
    let c = cells["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["site"] == SITE_B && c["address"] == lab.tinyproxies[1].url().as_str())
        .unwrap()
        .clone();
    assert!(c["failures"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["rate_limited"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["cooling_until_ms"].is_u64(), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_and_credentials_stay_behind() {
    // A single SOCKS5 upstream: the target sees exactly what the gateway sent.
    let dir = tempfile::tempdir().unwrap();
    let dante = Dante::start(dir.path(), "127.0.0.5");
    let target = Target::start(&[SITE_A]);
    let server = Server::start(dir.path(), &[dante.url()], "", &[]);
    let client = server.client(Some("dave"));
    let r = client
        .get(target.url(SITE_A, "/headers"))
        .header("connection", "x-private")
        .header("x-private", "1")
        .header("x-kept", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let names = r.text().await.unwrap();
    assert!(names.contains("x-kept"), "{names}");
    for gone in [
        "proxy-authorization",
        "x-private",
        "connection",
        "proxy-connection",
    ] {
        assert!(
            !names.lines().any(|n| n == gone),
            "{gone} reached the target: {names}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_file_is_reread_and_bad_lines_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let t1 = Tinyproxy::start(dir.path(), "127.0.0.2");
    let t2 = Tinyproxy::start(dir.path(), "127.0.0.3");
    let server = Server::start(dir.path(), &[t1.url()], "upstreams_poll_ms = 100\n", &[]);
    assert_eq!(
        server
            .api_get("/v1/addresses")
            .await
            .as_array()
            .unwrap()
            .len(),
        1
    );
    std::fs::write(
        &server.upstreams,
        format!("# two now\n{}\nnot a proxy\n{}\n", t1.url(), t2.url()),
    )
    .unwrap();
    server
        .process
        .signal(nix::sys::signal::Signal::SIGHUP)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = server.api_get("/v1/addresses").await;
        if rows.as_array().unwrap().len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "reload not seen: {rows}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Removing a line removes the address (the change alone is enough, no signal).
    std::fs::write(&server.upstreams, format!("{}\n", t2.url())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = server.api_get("/v1/addresses").await;
        let rows = rows.as_array().unwrap();
        if rows.len() == 1 && rows[0]["address"] == t2.url().as_str() {
            break;
        }
        assert!(Instant::now() < deadline, "reload not seen: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request the upstream refuses (wrong credentials "…wrong…"): `502 upstream-failed`, and
/// the answer does not show the upstream's password.
async fn refused_by_upstream_without_leaking_its_password(server: &Server, url: &str) {
    let (status, error, body) = get(&server.client(None), url).await;
    assert_eq!(
        (status, error.as_deref()),
        (502, Some("upstream-failed")),
        "{body}"
    );
    assert!(
        !body.contains("wrong"),
        "the upstream's password leaked: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_upstreams_with_credentials_and_remote_names() {
    let dir = tempfile::tempdir().unwrap();
    let socks = common::Socks5Auth::start("127.0.0.6", "sam", "p@ss word");
    let target = Target::start(&["127.0.0.1"]);
    // socks5h: the proxy resolves `localhost`; the password is percent-encoded in the URL.
    let good = socks.url("sam", "p%40ss%20word", "socks5h");
    let server = Server::start(dir.path(), std::slice::from_ref(&good), "", &[]);
    let url = format!("http://localhost:{}/", target.port);
    let (status, _, body) = get(&server.client(None), &url).await;
    assert_eq!((status, body.trim()), (200, "127.0.0.6"));
    let (status, body) = get_via_connect(
        server.gateway,
        Some("ivy-session-1"),
        "localhost",
        target.port,
        "/",
    )
    .await;
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(body.trim(), "127.0.0.6");

    // The same proxy with a wrong password: an upstream failure, reported as such.
    let http = reqwest::Client::new();
    let added: serde_json::Value = http
        .post(format!("{}/v1/addresses", server.api))
        .json(&serde_json::json!({"address": socks.url("sam", "wrong", "socks5")}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = server.api_get("/v1/addresses").await;
    let good_id = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] != added["id"])
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deleted = http
        .delete(format!("{}/v1/addresses/{good_id}", server.api))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    refused_by_upstream_without_leaking_its_password(&server, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dante_with_username_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let dante = Dante::start_with_login(dir.path(), "127.0.0.7");
    let target = Target::start(&["127.0.0.1"]);
    let server = Server::start(dir.path(), &[dante.url()], "", &[]);
    let url = target.url("127.0.0.1", "/");
    let (status, _, body) = get(&server.client(None), &url).await;
    assert_eq!((status, body.trim()), (200, "127.0.0.7"));
    let (status, body) = get_via_connect(server.gateway, None, "127.0.0.1", target.port, "/").await;
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(body.trim(), "127.0.0.7");

    // A wrong password: dante refuses, the gateway says the upstream failed.
    let good_id = server.api_get("/v1/addresses").await[0]["id"].clone();
    std::fs::write(&server.upstreams, dante.url_as("wrong") + "\n").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows = server.api_get("/v1/addresses").await;
        if rows.as_array().unwrap().len() == 1 && rows[0]["id"] != good_id {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "file not reloaded: {rows}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    refused_by_upstream_without_leaking_its_password(&server, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_through_both_kinds_of_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let tinyproxy = Tinyproxy::start(dir.path(), "127.0.0.2");
    let dante = Dante::start(dir.path(), "127.0.0.5");
    let target = Target::start(&[SITE_A]);
    let server = Server::start(dir.path(), &[tinyproxy.url(), dante.url()], "", &[]);
    let client = server.client(None);
    let size = 4 * 1024 * 1024;
    for _ in 0..4 {
        let (status, _, body) = get(&client, &target.url(SITE_A, &format!("/bytes/{size}"))).await;
        assert_eq!((status, body.len()), (200, size));
        assert!(body.bytes().all(|b| b == b'a'));
    }
    let rows = server.api_get("/v1/addresses").await;
    let leases: u64 = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["successes"].as_u64().unwrap())
        .sum();
    assert_eq!(leases, 4, "{rows}");
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["active_leases"] == 0),
        "{rows}"
    );
}

/// The probes' HTTP check goes through SOCKS5 upstreams too (dante with its username method),
/// so a server with `probe_urls` keeps them in service; a wrong password fails the check with
/// the SOCKS reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_checks_go_through_socks5_upstreams() {
    use proxypool::probe::{Check, CheckError, HttpGet};
    let dir = tempfile::tempdir().unwrap();
    let dante = Dante::start_with_login(dir.path(), "127.0.0.7");
    let target = Target::start(&["127.0.0.1"]);
    let control = url::Url::parse(&target.url("127.0.0.1", "/")).unwrap();
    let proxy = proxypool::ProxyAddress::parse(&dante.url()).unwrap();
    HttpGet::new(control.clone())
        .body_marker("127.0.0.7")
        .check(&proxy)
        .await
        .unwrap();
    let remote_dns = dante.url().replacen("socks5://", "socks5h://", 1);
    let proxy = proxypool::ProxyAddress::parse(&remote_dns).unwrap();
    HttpGet::new(control.clone()).check(&proxy).await.unwrap();
    let wrong = proxypool::ProxyAddress::parse(&dante.url_as("wrong")).unwrap();
    let err = HttpGet::new(control).check(&wrong).await.unwrap_err();
    assert!(matches!(err, CheckError::Socks(_)), "{err}");
    assert!(!err.to_string().contains("wrong"), "{err}");
}
