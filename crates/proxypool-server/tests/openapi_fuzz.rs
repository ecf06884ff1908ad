//! The API against its own OpenAPI document: the document validates, its examples hold, and
//! schemathesis finds no undocumented status, no answer off its schema, no 5xx but the
//! documented 503 and no 400 for schema-valid input, over every operation the document lists
//! (bounded by `OPENAPI_FUZZ_SECONDS`; see crates/testkit/src/schemathesis.rs).

#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use std::path::Path;
use tempfile::TempDir;
use testkit::ApiFuzz;

#[test]
fn every_operation_keeps_to_the_document() {
    let dir = TempDir::new().unwrap();
    // With an auth file, so the document's 401s and its Basic scheme are exercised too.
    let auth = dir.path().join("auth.txt");
    std::fs::write(&auth, "fuzz:fuzz-pass\n").unwrap();
    // Addresses nothing listens on: leases need no traffic, and the run adds its own.
    let upstreams = [
        "http://127.0.0.1:9".to_owned(),
        "http://127.0.0.2:9".to_owned(),
    ];
    // Thousands of generated addresses come and go: their decisions would flood the log.
    let server = Server::start_logging(
        dir.path(),
        &upstreams,
        "",
        &["--auth-file", auth.to_str().unwrap()],
        "warn",
    );
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
}
