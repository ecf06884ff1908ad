//! The command line as a user meets it: flags, environment, config file, mistakes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{BIN, Shortener, client, one_line_failure, run};
use std::process::Command;
use tempfile::TempDir;

#[test]
fn bad_flags_fail_with_one_line() {
    let line = one_line_failure(&run(&["serve", "--frobnicate"], &[]));
    assert!(line.contains("--frobnicate"), "{line}");
    let line = one_line_failure(&run(&["serve", "--listen", "not-an-address"], &[]));
    assert!(line.contains("not-an-address"), "{line}");
    let line = one_line_failure(&run(&["serve"], &[("SHORTENER_LISTEN", "nope:99999")]));
    assert!(line.contains("nope:99999"), "{line}");
    let line = one_line_failure(&run(&["serve", "--anon-creates-per-hour", "0"], &[]));
    assert!(line.contains("anon-creates-per-hour"), "{line}");
    let line = one_line_failure(&run(&["serve", "--base-url", "ftp://x"], &[]));
    assert!(line.contains("base-url"), "{line}");
    one_line_failure(&run(
        &[
            "token",
            "create",
            "--user",
            "has space",
            "--data-dir",
            "/tmp/none",
        ],
        &[],
    ));
    one_line_failure(&run(&["token", "create"], &[]));
    one_line_failure(&run(&["launch"], &[]));
}

#[test]
fn bad_config_files_fail_with_one_line_naming_the_problem() {
    let dir = TempDir::new().unwrap();
    let cfg = dir.path().join("shortener.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\nanon_creates_per_hour = \"lots\"\n",
    )
    .unwrap();
    let line = one_line_failure(&run(&["serve", "--config", cfg.to_str().unwrap()], &[]));
    assert!(line.contains("line 2"), "{line}");
    std::fs::write(&cfg, "lisen = \"127.0.0.1:0\"\n").unwrap();
    let line = one_line_failure(&run(&["serve", "--config", cfg.to_str().unwrap()], &[]));
    assert!(line.contains("lisen"), "{line}");
    let line = one_line_failure(&run(&["serve", "--config", "/does/not/exist.toml"], &[]));
    assert!(line.contains("/does/not/exist.toml"), "{line}");
}

#[test]
fn an_unusable_data_dir_or_port_fails_with_one_line() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let line = one_line_failure(&run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            file.to_str().unwrap(),
        ],
        &[],
    ));
    assert!(line.contains("a-file"), "{line}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let data = dir.path().join("data");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--listen",
            &addr,
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    ));
    assert!(line.contains(&addr), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_come_from_file_then_env_then_flags() {
    let dir = TempDir::new().unwrap();
    let cfg = dir.path().join("shortener.toml");
    std::fs::write(
        &cfg,
        "base_url = \"https://from-file.example/\"\nredirect_max_age = 5\nanon_creates_per_hour = 7\n",
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .args(["--redirect-max-age", "9", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("SHORTENER_ANON_CREATES_PER_HOUR", "8")
        .env("SHORTENER_LOG", "warn");
    let mut process = testkit::Process::spawn("shortener", cmd).unwrap();
    let line = process
        .wait_for_line("listening on ", std::time::Duration::from_secs(60))
        .unwrap();
    let base = line.trim_start_matches("listening on ").to_owned();
    let c = client();
    let resp = c
        .post(format!("{base}/api/v1/links"))
        .json(&serde_json::json!({"long_url": "https://example.com/", "custom_alias": "layered"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    // Env beats file.
    assert_eq!(resp.headers()["ratelimit-limit"], "8");
    let body: serde_json::Value = resp.json().await.unwrap();
    // File applies where nothing else is set (trailing slash trimmed).
    assert_eq!(body["short_url"], "https://from-file.example/layered");
    // Flag beats file.
    let resp = c.get(format!("{base}/layered")).send().await.unwrap();
    assert_eq!(resp.headers()["cache-control"], "private, max-age=9");
}

#[test]
fn token_create_prints_the_token_alone_on_the_last_line() {
    let dir = TempDir::new().unwrap();
    let out = run(
        &[
            "token",
            "create",
            "--user",
            "alice",
            "--admin",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    assert!(
        last.starts_with("shk_") && last.len() == 52 && !last.contains(' '),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_created_while_serving_works_at_once() {
    let dir = TempDir::new().unwrap();
    let server = Shortener::start(dir.path(), &[]);
    let t = common::token(dir.path(), "late", false);
    let resp = client()
        .post(server.url("/api/v1/links"))
        .bearer_auth(t)
        .json(&serde_json::json!({"long_url": "https://example.com/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
}

#[test]
fn migrate_on_the_embedded_store_creates_it_and_says_so() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    for _ in 0..2 {
        let out = run(&["migrate", "--data-dir", data.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(stdout.contains("schema version "), "{stdout}");
    }
    assert!(data.join("shortener.db").exists());
}

#[test]
fn a_bad_or_unreachable_redis_fails_with_one_line() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let line = one_line_failure(&run(
        &[
            "serve",
            "--data-dir",
            data,
            "--redis",
            "http://127.0.0.1:6379",
        ],
        &[],
    ));
    assert!(line.contains("invalid --redis"), "{line}");
    let line = one_line_failure(&run(
        &["serve", "--data-dir", data, "--listen", "127.0.0.1:0"],
        &[("SHORTENER_REDIS", "redis+cluster://")],
    ));
    assert!(line.contains("invalid --redis"), "{line}");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--data-dir",
            data,
            "--redis",
            "redis://127.0.0.1:6379",
        ],
        &[],
    ));
    assert!(line.contains("--redis needs --database"), "{line}");
    let line = one_line_failure(&run(
        &[
            "serve",
            "--redis",
            "redis://user:hunter2@127.0.0.1:6379,http://x",
        ],
        &[],
    ));
    assert!(
        !line.contains("hunter2"),
        "credentials stay out of messages: {line}"
    );
    let line = one_line_failure(&run(&["aggregate", "--data-dir", data], &[]));
    assert!(line.contains("aggregate needs --redis"), "{line}");
    let line = one_line_failure(&run(
        &[
            "token",
            "create",
            "--user",
            "x",
            "--data-dir",
            data,
            "--redis",
            "redis://",
        ],
        &[],
    ));
    assert!(line.contains("invalid --redis"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_redis_fails_the_start_with_one_line() {
    let db = common::pg::TestDb::migrated().await;
    // Nothing listens on port 1.
    for subcommand in [&["serve", "--listen", "127.0.0.1:0"][..], &["aggregate"]] {
        let mut args = subcommand.to_vec();
        args.extend(["--database", &db.url, "--redis", "redis://127.0.0.1:1"]);
        let line = one_line_failure(&run(&args, &[]));
        assert!(line.contains("cannot reach Redis at 127.0.0.1:1"), "{line}");
    }
}
