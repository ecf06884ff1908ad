//! The API against its own OpenAPI document: the document validates, its examples hold, and
//! schemathesis finds no undocumented status, no answer off its schema, no 5xx but the
//! documented 503 and no 400 for schema-valid input, over every operation the document lists
//! (bounded by `OPENAPI_FUZZ_SECONDS`; see crates/testkit/src/schemathesis.rs).
//!
//! Feedback is recorded only for a session the gateway has bound to an upstream: the run
//! starts with a working upstream (tinyproxy) and a gateway request under the session the
//! document's feedback example names, so the example reaches the success path (204); the
//! run's HAR report shows that schemathesis reached it too, and the success path of every
//! operation the document's links lead to (a release of an acquired lease).

#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine;
use common::{Server, Target, Tinyproxy};
use std::io::Write;
use std::path::Path;
use tempfile::TempDir;
use testkit::ApiFuzz;
use testkit::raw_http::{self, read_to_close};

const SITE: &str = "127.0.22.1";

/// A plain request through the gateway as `user`; its status line.
fn through_gateway(server: &Server, target: &Target, user: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:alice-pass"));
    let mut stream = raw_http::connect(&server.gateway.to_string());
    let url = target.url(SITE, "/");
    write!(
        stream,
        "GET {url} HTTP/1.1\r\nHost: {SITE}\r\nProxy-Authorization: Basic {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    read_to_close(&mut stream)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `request` (`METHOD /path`) to the API as the fuzz user, with a JSON body; the status line
/// and the body.
fn api_call(server: &Server, request: &str, body: &str) -> (String, String) {
    let token = base64::engine::general_purpose::STANDARD.encode("fuzz:fuzz-pass");
    let mut stream = raw_http::connect(server.api.trim_start_matches("http://"));
    write!(
        stream,
        "{request} HTTP/1.1\r\nHost: t\r\nAuthorization: Basic {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let answer = read_to_close(&mut stream);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

#[test]
fn every_operation_keeps_to_the_document() {
    let dir = TempDir::new().unwrap();
    // With an auth file, so the document's 401s and its Basic scheme are exercised too.
    let auth = dir.path().join("auth.txt");
    std::fs::write(&auth, "fuzz:fuzz-pass\nalice:alice-pass\n").unwrap();
    // One working upstream for the session below; the run adds (and removes) its own.
    let proxy = Tinyproxy::start(dir.path(), "127.0.0.2");
    let target = Target::start(&[SITE]);
    let upstreams = [proxy.url()];
    // Thousands of generated addresses come and go: their decisions would flood the log.
    let server = Server::start_logging(
        dir.path(),
        &upstreams,
        "",
        &["--auth-file", auth.to_str().unwrap()],
        "warn",
    );
    let (_, document) = api_call(&server, "GET /v1/openapi.json", "");
    let document: serde_json::Value = serde_json::from_str(&document).unwrap();
    let example = &document["components"]["schemas"]["FeedbackRequest"]["example"];
    let session = example["session"].as_str().unwrap();
    assert_eq!(
        through_gateway(&server, &target, session),
        "HTTP/1.1 200 OK"
    );
    // The example is recorded as it stands: the success path is in reach of the run.
    let (status, body) = api_call(&server, "POST /v1/feedback", &example.to_string());
    assert_eq!(status, "HTTP/1.1 204 No Content", "{example}: {body}");
    let fuzz = ApiFuzz {
        document_url: format!("{}/v1/openapi.json", server.api),
        base_url: server.api.clone(),
        config: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis.toml"),
        args: vec!["-a".into(), "fuzz:fuzz-pass".into()],
        work_dir: dir.path().to_owned(),
    };
    match fuzz.run() {
        Ok(report) => println!("{report}"),
        Err(report) => panic!("{report}"),
    }
    // The run itself reached feedback's success path, not only its refusals.
    let exchanges = fuzz.exchanges().unwrap();
    let feedback: Vec<u16> = exchanges
        .iter()
        .filter(|e| e.method == "POST" && e.path == "/v1/feedback")
        .map(|e| e.status)
        .collect();
    let recorded = feedback.iter().filter(|&&s| s == 204).count();
    println!(
        "feedback: {} calls, {recorded} recorded (204)",
        feedback.len()
    );
    assert!(
        recorded > 0,
        "no recorded feedback in the run ({} feedback calls, statuses {:?})",
        feedback.len(),
        feedback.iter().collect::<std::collections::BTreeSet<_>>()
    );
    // The document's links (an acquire's lease to its release, an added address to its
    // removal) reached their targets' success paths.
    match fuzz.links_reached() {
        Ok(report) => println!("{report}"),
        Err(report) => panic!("{report}"),
    }
}
