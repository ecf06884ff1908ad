//! Gateway clients that misbehave are cut off by `--max-connections`,
//! `--max-requests-per-connection`, `--max-header-bytes`, `--header-timeout`,
//! `--request-timeout` and `--max-body-bytes`, while a well-behaved client keeps being served
//! alongside; the API port is served under the same limits with `--api-max-body-bytes`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, Target, Tinyproxy};
use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;
use testkit::raw_http::{self, GUARD, read_to_close};

const SITE: &str = "127.0.22.1";

struct Lab {
    server: Server,
    target: Target,
    _proxy: Tinyproxy,
    _dir: tempfile::TempDir,
}

fn start(extra: &[&str]) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Tinyproxy::start(dir.path(), "127.0.0.2");
    let target = Target::start(&[SITE]);
    let server = Server::start(dir.path(), &[proxy.url()], "", extra);
    Lab {
        server,
        target,
        _proxy: proxy,
        _dir: dir,
    }
}

impl Lab {
    fn connect(&self) -> TcpStream {
        raw_http::connect(&self.server.gateway.to_string())
    }

    /// A well-behaved plain request through the gateway, on its own connection.
    fn healthy(&self) -> bool {
        let mut stream = self.connect();
        let url = self.target.url(SITE, "/");
        let request = format!("GET {url} HTTP/1.1\r\nHost: {SITE}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        read_to_close(&mut stream).starts_with("HTTP/1.1 200")
    }
}

#[test]
fn slow_heads_idle_connections_and_slow_bodies_are_cut_off() {
    let lab = start(&["--header-timeout", "1", "--request-timeout", "2"]);
    let url = lab.target.url(SITE, "/");

    let mut slow = lab.connect();
    slow.write_all(format!("GET {url} HTTP/1.1\r\nHost: {SITE}\r\n").as_bytes())
        .unwrap();
    assert!(lab.healthy());
    let started = Instant::now();
    let got = read_to_close(&mut slow);
    assert!(!got.contains(" 200 "), "{got}");
    assert!(started.elapsed() < GUARD);

    let mut idle = lab.connect();
    idle.write_all(format!("GET {url} HTTP/1.1\r\nHost: {SITE}\r\n\r\n").as_bytes())
        .unwrap();
    let got = read_to_close(&mut idle);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");

    // The upstream waits for the rest of the body; the gateway gives up on the request.
    let mut trickle = lab.connect();
    trickle
        .write_all(
            format!("POST {url} HTTP/1.1\r\nHost: {SITE}\r\nContent-Length: 100\r\n\r\nabc")
                .as_bytes(),
        )
        .unwrap();
    assert!(lab.healthy());
    let got = read_to_close(&mut trickle);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request-timeout"), "{got}");
    assert!(lab.healthy());
}

#[test]
fn oversized_heads_long_connections_and_too_many_connections_are_refused() {
    let lab = start(&[
        "--max-header-bytes",
        "8192",
        "--max-requests-per-connection",
        "2",
        "--max-connections",
        "3",
    ]);
    let url = lab.target.url(SITE, "/");

    let mut big = lab.connect();
    let filler = "x".repeat(20_000);
    let request = format!("GET {url} HTTP/1.1\r\nHost: {SITE}\r\nX-Filler: {filler}\r\n\r\n");
    let _ = big.write_all(request.as_bytes());
    let got = read_to_close(&mut big);
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    assert!(lab.healthy());

    let mut long = lab.connect();
    let one = format!("GET {url} HTTP/1.1\r\nHost: {SITE}\r\n\r\n");
    long.write_all(one.repeat(3).as_bytes()).unwrap();
    let got = read_to_close(&mut long);
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");
    assert!(
        got.to_ascii_lowercase().contains("connection: close"),
        "{got}"
    );

    let held: Vec<TcpStream> = (0..3).map(|_| lab.connect()).collect();
    let mut extra = lab.connect();
    let _ = extra.write_all(one.as_bytes());
    assert_eq!(read_to_close(&mut extra), "");
    drop(held);
    let deadline = Instant::now() + GUARD;
    while !lab.healthy() {
        assert!(Instant::now() < deadline, "never served again");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn bodies_past_max_body_bytes_answer_413_and_close() {
    let lab = start(&["--max-body-bytes", "1024"]);
    let url = lab.target.url(SITE, "/body");
    let junk = vec![b'x'; 4096];

    // Declared too large: refused before an upstream is leased.
    let mut big = lab.connect();
    let mut request =
        format!("POST {url} HTTP/1.1\r\nHost: {SITE}\r\nContent-Length: 10000000\r\n\r\n")
            .into_bytes();
    request.extend_from_slice(&junk);
    big.write_all(&request).unwrap();
    assert!(lab.healthy());
    let got = read_to_close(&mut big);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("x-proxypool-error: body-too-large"),
        "{got}"
    );

    // Chunked: cut off on the way to the upstream once past the limit.
    let mut chunked = lab.connect();
    let mut request = format!(
        "POST {url} HTTP/1.1\r\nHost: {SITE}\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n"
    )
    .into_bytes();
    request.extend_from_slice(&junk);
    chunked.write_all(&request).unwrap();
    let got = read_to_close(&mut chunked);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(lab.healthy());

    // A body under the limit reaches the target in full.
    let mut small = lab.connect();
    let body = "y".repeat(1000);
    write!(
        small,
        "POST {url} HTTP/1.1\r\nHost: {SITE}\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{body}"
    )
    .unwrap();
    let got = read_to_close(&mut small);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("\n1000\n"), "{got}");
}

#[test]
fn the_api_port_cuts_off_slow_heads_slow_bodies_and_big_bodies() {
    let lab = start(&[
        "--header-timeout",
        "1",
        "--request-timeout",
        "2",
        "--api-max-body-bytes",
        "1024",
    ]);
    let api = lab.server.api.trim_start_matches("http://").to_owned();
    let healthy = || {
        let mut stream = raw_http::connect(&api);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_to_close(&mut stream).starts_with("HTTP/1.1 200")
    };

    let mut slow = raw_http::connect(&api);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    assert!(healthy());
    let got = read_to_close(&mut slow);
    assert!(!got.contains(" 200 "), "{got}");

    let mut trickle = raw_http::connect(&api);
    trickle
        .write_all(
            b"POST /v1/acquire HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .unwrap();
    assert!(healthy());
    let got = read_to_close(&mut trickle);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");

    let mut big = raw_http::connect(&api);
    let mut request = b"POST /v1/acquire HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n".to_vec();
    request.extend_from_slice(&[b' '; 4096]);
    big.write_all(&request).unwrap();
    let got = read_to_close(&mut big);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("payload_too_large"), "{got}");
    assert!(healthy());
}

#[test]
fn every_limit_is_named_in_help_with_its_environment_variable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxypool"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    testkit::assert_help_names(
        &help,
        &[
            ("--max-connections", "PROXYPOOL_MAX_CONNECTIONS", "10000"),
            (
                "--max-requests-per-connection",
                "PROXYPOOL_MAX_REQUESTS_PER_CONNECTION",
                "1000",
            ),
            ("--max-header-bytes", "PROXYPOOL_MAX_HEADER_BYTES", "16384"),
            ("--header-timeout", "PROXYPOOL_HEADER_TIMEOUT", "30"),
            ("--request-timeout", "PROXYPOOL_REQUEST_TIMEOUT", "60"),
            ("--max-body-bytes", "PROXYPOOL_MAX_BODY_BYTES", "16777216"),
            (
                "--api-max-body-bytes",
                "PROXYPOOL_API_MAX_BODY_BYTES",
                "16384",
            ),
        ],
    );
}
