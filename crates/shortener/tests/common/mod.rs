//! Starts the real `shortener` binary on loopback with its data in a temporary directory.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testkit::Process;

pub mod load;
pub mod pair;
pub mod pg;
pub mod records;
pub mod web;

/// Guard against a server that never comes up; not a performance bound.
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub const BIN: &str = env!("CARGO_BIN_EXE_shortener");

/// A running `shortener serve`.
pub struct Shortener {
    pub process: Process,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub addr: String,
    pub data_dir: PathBuf,
}

impl Shortener {
    /// Starts a server on a free port over `data_dir`, with extra flags.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_on(data_dir, "127.0.0.1:0", extra)
    }

    pub fn start_on(data_dir: &Path, listen: &str, extra: &[&str]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            .args(extra)
            // A developer's own setting must not send the tests to their database.
            .env_remove("SHORTENER_DATABASE")
            .env("SHORTENER_LOG", "warn");
        let mut process = Process::spawn("shortener", cmd).unwrap();
        let line = process
            .wait_for_line("listening on ", START_TIMEOUT)
            .unwrap();
        let base = line.trim_start_matches("listening on ").to_owned();
        let addr = base.trim_start_matches("http://").to_owned();
        Self {
            process,
            base,
            addr,
            data_dir: data_dir.to_owned(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// What a person's browser sends; requests without a User-Agent count as bots.
pub const BROWSER: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0";

/// An HTTP client that does not follow redirects and looks like a browser.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(BROWSER)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// Runs `shortener token create` and returns the token from the last line of stdout.
pub fn token(data_dir: &Path, user: &str, admin: bool) -> String {
    token_in(&["--data-dir", data_dir.to_str().unwrap()], user, admin)
}

/// `shortener token create` on the store `store` names; the token and its public id.
pub fn token_with_id(store: &[&str], user: &str) -> (String, String) {
    let out = run(&[&["token", "create", "--user", user], store].concat(), &[]);
    assert!(out.status.success(), "{out:?}");
    let out = String::from_utf8(out.stdout).unwrap();
    let id = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap();
    (out.lines().last().unwrap().to_owned(), id.to_owned())
}

/// `shortener token create` on the store that `store_flags` name (`--database URL`, say).
pub fn token_in(store_flags: &[&str], user: &str, admin: bool) -> String {
    let admin: &[&str] = if admin { &["--admin"] } else { &[] };
    pair::new_token(store_flags, &[&["--user", user], admin].concat()).0
}

/// Creates a link and returns the parsed 201 body.
pub async fn create(
    client: &reqwest::Client,
    server: &Shortener,
    body: serde_json::Value,
    token: Option<&str>,
) -> reqwest::Response {
    let mut req = client.post(server.url("/api/v1/links")).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

/// Creates `alias` for `token`, sending to `https://example.com/{alias}`; it must succeed.
pub async fn new_link(c: &reqwest::Client, server: &Shortener, alias: &str, token: &str) {
    let resp = create(
        c,
        server,
        serde_json::json!({"long_url": format!("https://example.com/{alias}"), "custom_alias": alias}),
        Some(token),
    )
    .await;
    assert_eq!(resp.status(), reqwest::StatusCode::CREATED, "{alias}");
}

/// The status `GET /{code}` answers on `server`.
pub async fn follow(c: &reqwest::Client, server: &Shortener, code: &str) -> reqwest::StatusCode {
    c.get(server.url(&format!("/{code}")))
        .send()
        .await
        .unwrap()
        .status()
}

/// A change made by one process reaches another within this long: the issue's "about a
/// second" (0.5 s polling) with room for a machine busy with builds.
pub const NOTICED_WITHIN: Duration = Duration::from_secs(3);

/// Follows `code` until it answers `status`; returns how long that took.
pub async fn until_status(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    status: reqwest::StatusCode,
) -> Duration {
    let since = Instant::now();
    loop {
        let got = follow(c, server, code).await;
        if got == status {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < NOTICED_WITHIN,
            "{code} still answers {got} instead of {status} after {NOTICED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET path` with a bearer token: asserts 200 and returns the JSON body.
pub async fn get_json(
    c: &reqwest::Client,
    server: &Shortener,
    path: &str,
    token: &str,
) -> serde_json::Value {
    let resp = c
        .get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK, "GET {path}");
    resp.json().await.unwrap()
}

/// `GET /readyz`: its status (200 ready or degraded, 503 not ready) and JSON body.
pub async fn readiness(
    c: &reqwest::Client,
    server: &Shortener,
) -> (reqwest::StatusCode, serde_json::Value) {
    let resp = c.get(server.url("/readyz")).send().await.unwrap();
    (resp.status(), resp.json().await.unwrap())
}

/// Asserts the spec's error shape and returns the error code.
pub async fn error_code(resp: reqwest::Response) -> String {
    let body: serde_json::Value = resp.json().await.expect("error body is JSON");
    let err = body.get("error").expect("body has an `error` object");
    assert!(
        err["message"].is_string(),
        "error.message is a string: {body}"
    );
    err["code"]
        .as_str()
        .expect("error.code is a string")
        .to_owned()
}

/// The value of one un-labelled metric (or one exact `name{labels}` series).
pub async fn metric(c: &reqwest::Client, server: &Shortener, series: &str) -> f64 {
    let text = c
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// `GET /{code}` analytics with a token.
pub async fn analytics(
    c: &reqwest::Client,
    server: &Shortener,
    code: &str,
    token: &str,
) -> serde_json::Value {
    let resp = c
        .get(server.url(&format!("/api/v1/links/{code}/analytics")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    resp.json().await.unwrap()
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today_utc() -> String {
    let d = time::OffsetDateTime::now_utc().date();
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

/// Polls `cond` until it holds; the limit only guards against a hang.
pub async fn eventually<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll(what, Duration::from_secs(30), cond).await;
}

/// Polls `cond` until it holds, failing past [`NOTICED_WITHIN`]: for a change that must
/// reach another process within the "about a second".
pub async fn noticed<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll(what, NOTICED_WITHIN, cond).await;
}

async fn poll<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the binary with `args` (and extra environment), away from a developer's database.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("SHORTENER_LOG", "warn")
        .env_remove("SHORTENER_DATABASE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// A failed command: non-zero exit and exactly one line on stderr, which is returned.
pub fn one_line_failure(out: &Output) -> String {
    assert!(!out.status.success(), "should fail: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got:\n{stderr}");
    assert!(lines[0].starts_with("error"), "{stderr}");
    lines[0].to_owned()
}

/// A country database: 81.2.69.0/24 is GB, 175.16.199.0/24 is CN, nothing else.
pub fn write_geoip(dir: &Path) -> String {
    use mmdb_writer::{Value, Writer};
    let country = |iso: &str| {
        Value::map([(
            "country",
            Value::map([("iso_code", Value::String(iso.to_owned()))]),
        )])
    };
    let mut writer = Writer::new("GeoLite2-Country");
    for (first, last, iso) in [
        ([81, 2, 69, 0], [81, 2, 69, 255], "GB"),
        ([175, 16, 199, 0], [175, 16, 199, 255], "CN"),
    ] {
        writer
            .insert_range(
                std::net::IpAddr::from(first),
                std::net::IpAddr::from(last),
                &country(iso),
            )
            .unwrap();
    }
    let path = dir.join("countries.mmdb");
    std::fs::write(&path, writer.to_bytes().unwrap()).unwrap();
    path.to_str().unwrap().to_owned()
}
