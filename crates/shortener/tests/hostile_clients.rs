//! Clients that misbehave are cut off by the limits of `--max-connections`,
//! `--max-requests-per-connection`, `--max-header-bytes`, `--header-timeout` and
//! `--request-timeout`, while a well-behaved client keeps being served alongside.

#![allow(clippy::unwrap_used)]

mod common;

use common::Shortener;
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
