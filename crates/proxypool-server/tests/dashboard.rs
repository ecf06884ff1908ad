//! The dashboard in headless Chromium, driven through chromedriver's WebDriver protocol: the
//! page renders real data from a running server. The screenshot is kept under
//! `target/tmp/proxypool-dashboard.png`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, Target, Tinyproxy, get};
use serde_json::json;
use std::time::{Duration, Instant};
use testkit::Browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_real_data_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let mut tinyproxies: Vec<Tinyproxy> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|ip| Tinyproxy::start(dir.path(), ip))
        .collect();
    let target = Target::start(&["127.0.20.1", "127.0.20.2"]);
    let upstreams: Vec<String> = tinyproxies.iter().map(Tinyproxy::url).collect();
    let server = Server::start(dir.path(), &upstreams, common::FAST_POOL, &[]);

    // Traffic: a healthy site, a site that shows one address captchas, a stopped upstream.
    let client = server.client(None);
    for _ in 0..30 {
        get(&client, &target.url("127.0.20.1", "/")).await;
        get(
            &client,
            &target.url("127.0.20.2", "/?do=captcha&for=127.0.0.3"),
        )
        .await;
    }
    tinyproxies[2].stop();
    // Both sites: once the stopped upstream is avoided for one (its failures there look like
    // that pair's problem at first), traffic to the other still reaches it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.state_of(&tinyproxies[2].url()).await != "quarantined" {
        assert!(
            Instant::now() < deadline,
            "the stopped upstream was never quarantined"
        );
        get(&client, &target.url("127.0.20.1", "/")).await;
        get(&client, &target.url("127.0.20.2", "/")).await;
    }
    for s in 0..5 {
        get(
            &server.client(Some(&format!("gina-session-{s}"))),
            &target.url("127.0.20.1", "/"),
        )
        .await;
    }

    let browser = Browser::start(1500, 1100).await;
    browser
        .call(
            reqwest::Method::POST,
            "/url",
            Some(json!({"url": format!("{}/", server.api)})),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let v = browser
            .script("return document.body.dataset.loaded === '1' ? document.body.innerText : null")
            .await;
        if let Some(text) = v.as_str() {
            break text.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard never rendered: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for url in &upstreams {
        assert!(
            text.contains(url.as_str()),
            "{url} missing from the page:\n{text}"
        );
    }
    assert!(text.contains("quarantined"), "{text}");
    assert!(text.contains("127.0.20.2"), "site column missing:\n{text}");
    let rows = browser
        .script("return document.querySelectorAll('#addresses tbody tr').length")
        .await;
    assert_eq!(rows, 3);
    let sites = browser
        .script("return [...document.querySelectorAll('#matrix thead th')].slice(1).map(th => th.textContent)")
        .await;
    let cells = browser
        .script("return document.querySelectorAll('#matrix td.cell').length")
        .await;
    assert_eq!(
        cells.as_u64().unwrap(),
        3 * sites.as_array().unwrap().len() as u64,
        "one cell per address × site {sites}"
    );
    // The stopped upstream's episode: quarantined, or probing if its 5 s wait (FAST_POOL) ended
    // while the browser started (both count against the cap).
    let open = browser
        .script(
            "return ['quarantined', 'probing'].map(s => \
             document.querySelector(`.count[data-state=${s}] b`)?.textContent ?? '0')",
        )
        .await;
    let open: Vec<u64> = open
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        open.iter().sum::<u64>(),
        1,
        "quarantined, probing: {open:?}"
    );
    let history = browser
        .script("return [...document.querySelectorAll('td.history')].map(td => td.title).join('|')")
        .await;
    assert!(
        history.as_str().unwrap().contains("failures"),
        "no quarantine history with its reason: {history}"
    );
    let transitions = browser
        .script("return document.querySelectorAll('#decisions tbody tr').length")
        .await;
    assert!(transitions.as_u64().unwrap() >= 4, "{transitions}");

    let png = browser
        .call(reqwest::Method::GET, "/screenshot", None)
        .await;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().unwrap())
        .unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("proxypool-dashboard.png");
    std::fs::write(&path, &bytes).unwrap();
    eprintln!("dashboard screenshot: {}", path.display());
    assert!(bytes.starts_with(b"\x89PNG"));
}
