//! Gateway clients that misbehave are cut off by `--max-connections`,
//! `--max-requests-per-connection`, `--max-header-bytes`, `--header-timeout` and
//! `--request-timeout`, while a well-behaved client keeps being served alongside.

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
