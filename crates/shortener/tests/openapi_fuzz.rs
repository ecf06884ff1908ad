//! The API against its own OpenAPI document: the document validates, its examples hold, and
//! schemathesis finds no undocumented status, no answer off its schema, no 5xx but the
//! documented 503 and no 400 for schema-valid input, over every operation the document lists
//! (bounded by `OPENAPI_FUZZ_SECONDS`; see crates/testkit/src/schemathesis.rs). The run's HAR
//! report shows that it reached the success path of every operation on a link: the
//! document's links from a create give the stateful sequences real codes.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Shortener, token, write_geoip};
use std::collections::{BTreeMap, BTreeSet};
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
    let server = Shortener::start(&data, &["--geoip", &geoip]);
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
    // The run reached the success path of every operation on a link and of a report's
    // resolution (through the document's links from a create), not only their refusals.
    let mut statuses: BTreeMap<(String, String), BTreeSet<u16>> = BTreeMap::new();
    for e in fuzz.exchanges().unwrap() {
        let key = (e.method, template(&e.path));
        statuses.entry(key).or_default().insert(e.status);
    }
    // (Methods a path does not have, all 405, left out.)
    for ((method, path), seen) in statuses.iter().filter(|(_, s)| s.iter().any(|&s| s != 405)) {
        println!("{method} {path}: {seen:?}");
    }
    let unreached: Vec<_> = [
        ("GET", "/api/v1/links/{code}"),
        ("PATCH", "/api/v1/links/{code}"),
        ("DELETE", "/api/v1/links/{code}"),
        ("GET", "/api/v1/links/{code}/analytics"),
        ("GET", "/api/v1/links/{code}/analytics.csv"),
        ("GET", "/api/v1/links/{code}/qr"),
        ("POST", "/api/v1/links/{code}/disable"),
        ("POST", "/api/v1/links/{code}/enable"),
        ("POST", "/api/v1/links/{code}/reports"),
        ("POST", "/api/v1/reports/{id}/resolve"),
        ("GET", "/{code}"),
    ]
    .into_iter()
    .filter(|(method, path)| {
        let key = ((*method).to_owned(), (*path).to_owned());
        !statuses
            .get(&key)
            .is_some_and(|seen| seen.iter().any(|s| (200..400).contains(s)))
    })
    .collect();
    assert!(
        unreached.is_empty(),
        "never answered 2xx/3xx in the run: {unreached:?}"
    );
}

/// The document's path of a request's path: codes and report ids as their parameters.
fn template(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "api", "v1", "links", _, rest @ ..] => {
            let mut out = "/api/v1/links/{code}".to_owned();
            for part in rest {
                out.push('/');
                out.push_str(part);
            }
            out
        }
        ["", "api", "v1", "reports", _, action] => format!("/api/v1/reports/{{id}}/{action}"),
        ["", "api", ..] => path.to_owned(),
        ["", _] => "/{code}".to_owned(),
        _ => path.to_owned(),
    }
}
