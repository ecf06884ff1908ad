//! The gateway's request line and `Proxy-Authorization` from raw sockets: random methods,
//! targets, versions and credential bytes each get an HTTP answer (or a closed connection for
//! what is not HTTP at all), never a 500, and the gateway keeps serving. 64 cases in the
//! suite; `PROPTEST_CASES=5000 cargo test -p proxypool-server --test gateway_request_lines`
//! is the long run.

#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine;
use common::{Server, Target, Tinyproxy};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::io::Write;
use std::net::Shutdown;
use testkit::raw_http::{connect, read_to_close};

const SITE: &str = "127.0.23.1";

fn request_line() -> impl Strategy<Value = String> {
    let method = prop_oneof![
        Just("GET"),
        Just("CONNECT"),
        Just("POST"),
        Just("get"),
        Just("BREW"),
        Just(""),
    ];
    let target = prop_oneof![
        Just(format!("http://{SITE}:1/")),
        Just(format!("{SITE}:443")),
        Just("/relative".to_owned()),
        Just("https://example.com/".to_owned()),
        Just("http://[::1]:99999/".to_owned()),
        Just("*".to_owned()),
        "[ -~]{0,40}",
        "\\PC{0,10}",
    ];
    let version = prop_oneof![
        Just("HTTP/1.1"),
        Just("HTTP/1.0"),
        Just("HTTP/2.0"),
        Just("HTTP/1.1 extra"),
        Just(""),
    ];
    (method, target, version).prop_map(|(m, t, v)| format!("{m} {t} {v}"))
}

fn authorization() -> impl Strategy<Value = Option<Vec<u8>>> {
    let credentials = prop_oneof![
        "[a-z]{1,6}(-session-[a-z0-9]{1,6}(-ttl-[0-9]{1,25})?)?:[a-z]{0,8}".prop_map(|c| format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(c)
        )
        .into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..40),
        "Basic [A-Za-z0-9+/=]{0,30}".prop_map(String::into_bytes),
    ];
    proptest::option::of(credentials)
}

#[test]
fn random_request_lines_get_an_answer_and_the_gateway_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.txt");
    std::fs::write(&auth, "alice:pw\n").unwrap();
    let proxy = Tinyproxy::start(dir.path(), "127.0.0.2");
    let target = Target::start(&[SITE]);
    let server = Server::start(
        dir.path(),
        &[proxy.url()],
        "",
        &["--auth-file", auth.to_str().unwrap()],
    );
    let gateway = server.gateway.to_string();

    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config::with_cases(cases));
    runner
        .run(&(request_line(), authorization()), |(line, auth)| {
            let mut stream = connect(&gateway);
            let mut request = format!("{line}\r\nHost: {SITE}\r\n").into_bytes();
            if let Some(auth) = auth {
                request.extend_from_slice(b"Proxy-Authorization: ");
                request.extend_from_slice(&auth);
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"\r\n");
            // The gateway may answer and close before reading it all.
            let _ = stream.write_all(&request);
            let _ = stream.shutdown(Shutdown::Write);
            let answer = read_to_close(&mut stream);
            if !answer.is_empty() {
                prop_assert!(answer.starts_with("HTTP/1."), "{:?} -> {:?}", line, answer);
                prop_assert!(
                    !answer.starts_with("HTTP/1.1 500"),
                    "{:?} -> {:?}",
                    line,
                    answer
                );
            }
            Ok(())
        })
        .unwrap();

    // Still serving, with credentials.
    let mut stream = connect(&gateway);
    let token = base64::engine::general_purpose::STANDARD.encode("alice:pw");
    let url = target.url(SITE, "/");
    let request = format!(
        "GET {url} HTTP/1.1\r\nHost: {SITE}\r\nProxy-Authorization: Basic {token}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let answer = read_to_close(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
