//! `shortener import FILE` on the real binary: good files, refused lines with their numbers,
//! aliases taken in the file or in the store, a kill -9 in the middle and the resume after
//! it, on the embedded store and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::{BIN, Shortener, client, one_line_failure, run};
use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tempfile::TempDir;

fn import(store: &[&str], file: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["import", file.to_str().unwrap(), "--user", "alice"];
    args.extend_from_slice(store);
    args.extend_from_slice(extra);
    run(&args, &[])
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "import failed: {out:?}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `created` audit rows of the store, as (code, actor, destination).
fn created_rows(store: &[&str]) -> Vec<(String, String, String)> {
    let mut args = vec![
        "audit", "--action", "created", "--json", "--limit", "100000",
    ];
    args.extend_from_slice(store);
    let out = run(&args, &[]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["code"].as_str().unwrap().to_owned(),
                v["actor"].as_str().unwrap().to_owned(),
                v["new_url"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_good_file_stores_every_line_owned_and_audited() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let store = ["--data-dir", data.to_str().unwrap()];
    let file = dir.path().join("links.csv");
    std::fs::write(
        &file,
        "long_url,custom_alias,expires_at\n\
         https://example.com/generated\n\
         https://example.com/promo,promo-2026\n\
         \n\
         \"https://example.com/q?a=1,2\",,2030-01-01T00:00:00Z\r\n\
         https://example.com/both,both-ways,2030-06-01T00:00:00+02:00\n",
    )
    .unwrap();
    let stdout = ok(&import(&store, &file, &[]));
    assert!(stdout.contains("imported 4 links"), "{stdout}");
    assert!(stdout.contains("refused 0 lines"), "{stdout}");

    let rows = created_rows(&store);
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|(_, actor, _)| actor == "alice"));
    let by_url = |url: &str| rows.iter().find(|r| r.2 == url).unwrap().0.clone();
    assert_eq!(by_url("https://example.com/promo"), "promo-2026");
    let generated = by_url("https://example.com/generated");
    assert_eq!(generated.len(), 7);

    let server = Shortener::start(&data, &[]);
    let c = client();
    for (code, url) in [
        (generated.as_str(), "https://example.com/generated"),
        ("promo-2026", "https://example.com/promo"),
        ("both-ways", "https://example.com/both"),
    ] {
        let resp = c.get(server.url(&format!("/{code}"))).send().await.unwrap();
        assert_eq!(resp.status(), 302, "{code}");
        assert_eq!(resp.headers()["location"], url);
    }
    let token = common::token(&data, "alice", false);
    let info: serde_json::Value = c
        .get(server.url("/api/v1/links/both-ways"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["owner"], "alice");
    assert_eq!(info["expires_at"], "2030-05-31T22:00:00Z");

    // A finished import run again stores nothing twice.
    let stdout = ok(&import(&store, &file, &[]));
    assert!(stdout.contains("imported 0 links"), "{stdout}");
    assert_eq!(created_rows(&store).len(), 4);
}

#[tokio::test]
async fn bad_lines_are_refused_by_line_number_and_the_rest_is_stored() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let store = ["--data-dir", data.to_str().unwrap()];
    let feed = dir.path().join("phishing.txt");
    std::fs::write(&feed, "# a feed\nbad.example\n").unwrap();
    let first = dir.path().join("first.csv");
    std::fs::write(&first, "https://example.com/held,held-alias\n").unwrap();
    ok(&import(&store, &first, &[]));

    let file = dir.path().join("links.jsonl");
    let lines = [
        r#"{"long_url": "https://example.com/1"}"#,
        r#"{"long_url": "ftp://example.com/2"}"#,
        r#"{"long_url": "https://login.bad.example/3"}"#,
        r#"{"long_url": "https://example.com/4", "custom_alias": "api"}"#,
        r#"{"long_url": "https://example.com/5", "expires_at": "2001-01-01T00:00:00Z"}"#,
        r#"{"long_url": "https://example.com/6", "custom_alias": "twice"}"#,
        r#"{"long_url": "https://example.com/7", "custom_alias": "twice"}"#,
        r#"{"long_url": "https://example.com/8", "custom_alias": "held-alias"}"#,
        r#"not json"#,
        r#"{"long_url": "https://short.example/10"}"#,
        r#"{"long_url": "https://example.com/11", "custom_alias": "fine-alias"}"#,
    ];
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = import(
        &store,
        &file,
        &[
            "--threat-feed",
            feed.to_str().unwrap(),
            "--base-url",
            "https://short.example",
        ],
    );
    let stdout = ok(&out);
    assert!(stdout.contains("imported 3 links"), "{stdout}");
    assert!(stdout.contains("refused 8 lines"), "{stdout}");
    let refused: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.starts_with("line "))
        .map(|l| l.split(':').take(2).collect::<Vec<_>>().join(":"))
        .collect();
    assert_eq!(
        refused,
        [
            "line 2: invalid_url",
            "line 3: url_blocked",
            "line 4: invalid_alias",
            "line 5: invalid_expiry",
            "line 7: alias_taken",
            "line 8: alias_taken",
            "line 9: invalid_line",
            "line 10: invalid_url",
        ]
    );
    assert!(stderr(&out).contains("phishing.txt"), "{}", stderr(&out));
    let rows = created_rows(&store);
    let urls: HashSet<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        urls,
        HashSet::from([
            "https://example.com/held",
            "https://example.com/1",
            "https://example.com/6",
            "https://example.com/11",
        ])
    );
}

#[tokio::test]
async fn a_killed_import_resumes_after_its_last_batch_without_doubles() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let store = ["--data-dir", data.to_str().unwrap()];
    let file = dir.path().join("links.csv");
    let n = 60_000;
    let text: String = (0..n)
        .map(|i| {
            if i % 10 == 0 {
                format!("https://example.com/{i},alias-{i}\n")
            } else {
                format!("https://example.com/{i}\n")
            }
        })
        .collect();
    std::fs::write(&file, text).unwrap();

    // Small batches: one fsync each, so the import is still running when it is killed.
    let mut child = Command::new(BIN)
        .args([
            "import",
            file.to_str().unwrap(),
            "--user",
            "alice",
            "--batch",
            "50",
        ])
        .args(store)
        .env("SHORTENER_LOG", "warn")
        .env_remove("SHORTENER_DATABASE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while created_rows(&store).len() < 500 {
        assert!(Instant::now() < deadline, "the import never got going");
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the import finished before it was killed"
    );
    let before = created_rows(&store).len();
    assert!(before < n, "{before}");

    let out = import(&store, &file, &[]);
    let stdout = ok(&out);
    assert!(stdout.contains("resuming after line"), "{stdout}");
    let rows = created_rows(&store);
    assert_eq!(rows.len(), n, "every line stored exactly once");
    let urls: HashSet<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(urls.len(), n);
    let codes: HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(codes.len(), n);
    assert!(codes.contains("alias-59990"));

    // A different file at the same path is not taken for the rest of the old one.
    std::fs::write(&file, "https://example.com/new\n").unwrap();
    let line = one_line_failure(&import(&store, &file, &[]));
    assert!(line.contains("--restart"), "{line}");
    let stdout = ok(&import(&store, &file, &["--restart"]));
    assert!(stdout.contains("imported 1 links"), "{stdout}");
}

#[tokio::test]
async fn postgres_imports_in_multi_row_batches_with_audit_rows() {
    let db = TestDb::migrated().await;
    let store = ["--database", db.url.as_str()];
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("links.csv");
    let mut text = String::from("https://example.com/alias,pg-alias\n");
    for i in 0..2_500 {
        text.push_str(&format!("https://example.com/{i}\n"));
    }
    text.push_str("https://example.com/again,pg-alias\n");
    std::fs::write(&file, &text).unwrap();
    // Batches of 500, 1 000 and the remaining 1 002 lines (the first ones are smaller).
    let out = import(&store, &file, &["--batch", "4000"]);
    let stdout = ok(&out);
    assert!(stdout.contains("imported 2501 links"), "{stdout}");
    assert!(
        stderr(&out).contains("line 2502: alias_taken"),
        "{}",
        stderr(&out)
    );

    let client = db.client().await;
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM links").await, 2501);
    assert_eq!(
        count("SELECT count(*) FROM audit WHERE action = 'created' AND actor = 'alice'").await,
        2501
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM links l WHERE NOT EXISTS \
             (SELECT 1 FROM audit a WHERE a.code = l.code)"
        )
        .await,
        0
    );
    // Every link noted once, in notes of at most 1 000 codes (a poller reads whole notes).
    let sizes: Vec<i32> = client
        .query(
            "SELECT cardinality(codes) FROM link_changes ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(sizes, [1, 500, 1_000, 1_000]);
    // Statistics and the visibility map are up to date when the import ends (autovacuum
    // would be late, or never run where it is off).
    assert!(
        stdout.contains("VACUUM (ANALYZE) links, audit: "),
        "{stdout}"
    );
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    for (table, rows) in [("links", 2501.0), ("audit", 2501.0)] {
        let row = client
            .query_one(
                "SELECT relallvisible, relpages, reltuples FROM pg_class WHERE relname = $1",
                &[&table],
            )
            .await
            .unwrap();
        let (visible, pages, tuples): (i32, i32, f32) = (row.get(0), row.get(1), row.get(2));
        assert!(
            pages > 0 && visible == pages,
            "{table}: {visible} of {pages} pages all-visible"
        );
        assert_eq!(tuples, rows, "{table}");
    }
    assert_eq!(
        count(
            "SELECT count(DISTINCT code) FROM (SELECT unnest(codes) AS code FROM link_changes) n"
        )
        .await,
        2501
    );
    // The same file again: already imported, nothing stored twice.
    let stdout = ok(&import(&store, &file, &[]));
    assert!(stdout.contains("imported 0 links"), "{stdout}");
    assert_eq!(count("SELECT count(*) FROM links").await, 2501);
}

#[tokio::test]
async fn postgres_import_by_a_role_that_does_not_own_the_tables_stores_and_warns() {
    let mut db = TestDb::migrated().await;
    let url = db.non_owner().await;
    let store = ["--database", url.as_str()];
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("links.csv");
    std::fs::write(&file, "https://example.com/1\nhttps://example.com/2\n").unwrap();
    let out = import(&store, &file, &[]);
    let stdout = ok(&out);
    assert!(stdout.contains("imported 2 links"), "{stdout}");
    assert!(!stdout.contains("VACUUM"), "{stdout}");
    assert!(
        stderr(&out).contains("warning: the links are stored")
            && stderr(&out).contains(
                "`VACUUM (ANALYZE) links, audit` did not run: this role does not own audit and links"
            ),
        "{}",
        stderr(&out)
    );
    let count: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM links", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 2);
}
