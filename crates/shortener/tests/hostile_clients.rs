//! Clients that misbehave are cut off by the limits of `--max-connections`,
//! `--max-requests-per-connection`, `--max-header-bytes`, `--header-timeout`,
//! `--request-timeout` and `--max-body-bytes`, while a well-behaved client keeps being served
//! alongside; each limit also reads its environment variable.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Shortener, one_line_failure, run};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use testkit::raw_http::{self, GUARD, read_to_close};

fn connect(server: &Shortener) -> TcpStream {
    raw_http::connect(&server.addr)
}

/// One well-behaved request on its own connection.
fn healthy(server: &Shortener) -> bool {
    let mut stream = connect(server);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    read_to_close(&mut stream).starts_with("HTTP/1.1 200")
}

fn start(dir: &TempDir, extra: &[&str]) -> Shortener {
    Shortener::start(&dir.path().join("data"), extra)
}

#[test]
fn slow_heads_idle_connections_and_slow_bodies_are_cut_off() {
    let dir = TempDir::new().unwrap();
    let server = start(&dir, &["--header-timeout", "1", "--request-timeout", "2"]);

    // Slowloris: half a head, then nothing. Closed after the header timeout.
    let mut slow = connect(&server);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    assert!(healthy(&server));
    let started = Instant::now();
    let got = read_to_close(&mut slow);
    assert!(!got.contains("200 OK"), "{got}");
    assert!(started.elapsed() < GUARD);

    // Idle keep-alive: one answer, then the connection is closed.
    let mut idle = connect(&server);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let got = read_to_close(&mut idle);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");

    // A body that never arrives in full: 408 after the request timeout.
    let mut trickle = connect(&server);
    trickle
        .write_all(
            b"POST /api/v1/links HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"long_url\":",
        )
        .unwrap();
    assert!(healthy(&server));
    let got = read_to_close(&mut trickle);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");
    assert!(healthy(&server));
}

#[test]
fn oversized_heads_and_long_connections_are_refused() {
    let dir = TempDir::new().unwrap();
    let server = start(
        &dir,
        &[
            "--max-header-bytes",
            "8192",
            "--max-requests-per-connection",
            "2",
        ],
    );

    let mut big = connect(&server);
    let filler = "x".repeat(20_000);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: t\r\nX-Filler: {filler}\r\n\r\n");
    // The server may close before it has read everything.
    let _ = big.write_all(request.as_bytes());
    let got = read_to_close(&mut big);
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    assert!(healthy(&server));

    // The second request on a connection is its last.
    let mut long = connect(&server);
    long.write_all(
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .unwrap();
    let got = read_to_close(&mut long);
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");
    assert!(
        got.to_ascii_lowercase().contains("connection: close"),
        "{got}"
    );
}

#[test]
fn connections_past_the_cap_are_closed_until_one_ends() {
    let dir = TempDir::new().unwrap();
    let server = start(&dir, &["--max-connections", "3"]);
    let held: Vec<TcpStream> = (0..3).map(|_| connect(&server)).collect();
    // The server takes connections in order: a fourth is past the cap and closed at once.
    let mut extra = connect(&server);
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(read_to_close(&mut extra), "");
    drop(held);
    // Once they are gone, clients are served again (the server notices the closes shortly).
    let deadline = Instant::now() + GUARD;
    while !healthy(&server) {
        assert!(Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A create with a small body on its own connection: its status line.
fn small_create(server: &Shortener) -> String {
    let body = r#"{"long_url": "https://example.com/small"}"#;
    let mut stream = connect(server);
    write!(
        stream,
        "POST /api/v1/links HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let got = read_to_close(&mut stream);
    got.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn bodies_past_max_body_bytes_answer_413_and_close() {
    let dir = TempDir::new().unwrap();
    let server = start(&dir, &["--max-body-bytes", "1024"]);
    let junk = vec![b'x'; 4096];

    // Declared at 10 MB and streaming: cut off at the limit, the rest never read.
    let mut big = connect(&server);
    let mut request = b"POST /api/v1/links HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n".to_vec();
    request.extend_from_slice(&junk);
    big.write_all(&request).unwrap();
    assert!(healthy(&server));
    let got = read_to_close(&mut big);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("payload_too_large"), "{got}");

    // Chunked, no length stated: the same once the chunks pass the limit.
    let mut chunked = connect(&server);
    let mut request = b"POST /api/v1/links HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n".to_vec();
    request.extend_from_slice(&junk);
    chunked.write_all(&request).unwrap();
    let got = read_to_close(&mut chunked);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");

    // Bodies under the limit are served as before.
    assert_eq!(small_create(&server), "HTTP/1.1 201 Created");
    assert!(healthy(&server));
}

#[test]
fn every_limit_is_named_in_help_with_its_environment_variable() {
    let out = run(&["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&out.stdout);
    testkit::assert_help_names(
        &help,
        &[
            ("--max-connections", "SHORTENER_MAX_CONNECTIONS", "10000"),
            (
                "--max-requests-per-connection",
                "SHORTENER_MAX_REQUESTS_PER_CONNECTION",
                "1000",
            ),
            ("--max-header-bytes", "SHORTENER_MAX_HEADER_BYTES", "16384"),
            ("--header-timeout", "SHORTENER_HEADER_TIMEOUT", "30"),
            ("--request-timeout", "SHORTENER_REQUEST_TIMEOUT", "60"),
            ("--max-body-bytes", "SHORTENER_MAX_BODY_BYTES", "16384"),
        ],
    );
    // The environment is read: a bad value there is refused like a bad flag.
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--listen", "127.0.0.1:0"],
        &[("SHORTENER_MAX_BODY_BYTES", "0")],
    ));
    assert!(line.contains("--max-body-bytes"), "{line}");
}
