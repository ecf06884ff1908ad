//! The API against its own OpenAPI document: the document validates, its examples hold, and
//! schemathesis finds no undocumented status, no answer off its schema, no 5xx but the
//! documented 503 and no 400 for schema-valid input, over every operation the document lists
//! (bounded by `OPENAPI_FUZZ_SECONDS`; see crates/testkit/src/schemathesis.rs). The run's HAR
//! report shows that it reached the success path of every operation on a link: the
//! document's links from a create give the stateful sequences real codes.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Shortener, token, write_geoip};
use std::path::Path;
use tempfile::TempDir;
use testkit::ApiFuzz;

#[test]
fn every_operation_keeps_to_the_document() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    // An admin token reaches every operation and every link the run creates; anonymous
    // requests are generated too (the document allows them where the service does).
    let admin = token(&data, "fuzz-admin", true);
    // With a country database, every breakdown the document lists is one the server has.
    let geoip = write_geoip(dir.path());
    // Every generated request comes from one address: at the default 10 reports an hour, the
    // coverage and fuzzing phases' reports (refused ones count) can spend the budget before
    // the stateful phase files one it can resolve (a run failed so).
    let server = Shortener::start(&data, &["--geoip", &geoip, "--reports-per-hour", "1000000"]);
    let fuzz = ApiFuzz {
        document_url: server.url("/api/v1/openapi.json"),
        base_url: server.base.clone(),
        config: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis.toml"),
        args: vec!["-H".into(), format!("Authorization: Bearer {admin}")],
        work_dir: dir.path().to_owned(),
    };
    match fuzz.run() {
        Ok(report) => println!("{report}"),
        Err(report) => panic!("{report}"),
    }
    // The run reached the success path of every operation the document's links lead to
    // (every operation on a link, a link's enable and a report's resolution: from a create,
    // a disable and a report), not only their refusals.
    match fuzz.links_reached() {
        Ok(report) => println!("{report}"),
        Err(report) => panic!("{report}"),
    }
}
