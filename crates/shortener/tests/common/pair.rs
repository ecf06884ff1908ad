//! Two serving processes on one store — the embedded file, PostgreSQL, or PostgreSQL with
//! Redis — which is what every "a change on one is seen by the other" story runs on, and the
//! flags that name that store for the CLI.

use super::pg::TestDb;
use super::{Shortener, run};
use std::path::Path;
use tempfile::TempDir;
use testkit::RedisServer;

/// Where the two processes keep their links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One SQLite file under a shared `--data-dir`.
    Embedded,
    /// A fresh, migrated PostgreSQL database.
    Postgres,
    /// That database and a Redis of its own (`--redis`).
    ScaleOut,
}

/// Two `serve` processes on one store. Fields drop in order: the servers stop before their
/// Redis and database go, and the directory holding all of them goes last.
pub struct Pair {
    pub a: Shortener,
    pub b: Shortener,
    /// `--data-dir DIR` or `--database URL`.
    store: [String; 2],
    pub redis: Option<RedisServer>,
    pub db: Option<TestDb>,
    pub dir: TempDir,
}

impl Pair {
    /// Both processes started with `extra` flags besides the store's.
    pub async fn start(kind: Kind, extra: &[&str]) -> Self {
        Self::start_in(TempDir::new().unwrap(), kind, extra).await
    }

    /// [`Self::start`] in `dir`, for flags naming files the test wrote there first.
    pub async fn start_in(dir: TempDir, kind: Kind, extra: &[&str]) -> Self {
        let db = match kind {
            Kind::Embedded => None,
            Kind::Postgres | Kind::ScaleOut => Some(TestDb::migrated().await),
        };
        let redis = (kind == Kind::ScaleOut).then(|| RedisServer::start(dir.path()).unwrap());
        let store = match &db {
            None => ["--data-dir".to_owned(), path_str(dir.path())],
            Some(db) => ["--database".to_owned(), db.url.clone()],
        };
        let mut flags: Vec<String> = match kind {
            // `Shortener::start` gives the data dir itself.
            Kind::Embedded => Vec::new(),
            Kind::Postgres | Kind::ScaleOut => store.to_vec(),
        };
        if let Some(redis) = &redis {
            flags.extend(["--redis".to_owned(), redis.url()]);
        }
        flags.extend(extra.iter().map(|&f| f.to_owned()));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Self {
            a: Shortener::start(dir.path(), &flags),
            b: Shortener::start(dir.path(), &flags),
            store,
            redis,
            db,
            dir,
        }
    }

    /// The flags a CLI subcommand takes to reach the same store (never `--redis`: changes
    /// made from the CLI must reach the servers through the store alone).
    pub fn store(&self) -> [&str; 2] {
        [self.store[0].as_str(), self.store[1].as_str()]
    }
}

fn path_str(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// `shortener ARGS` on the store `store` names: asserts success and returns stdout.
pub fn cli(args: &[&str], store: &[&str]) -> String {
    let out = run(&[args, store].concat(), &[]);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `shortener token create ARGS` on `store`: the secret (the last line printed) and the
/// public id (the first line names it: `user token ID for USER …`).
pub fn new_token(store: &[&str], args: &[&str]) -> (String, String) {
    let out = cli(&[&["token", "create"], args].concat(), store);
    let id = out
        .lines()
        .next()
        .and_then(|first| first.split_whitespace().nth(2))
        .unwrap()
        .to_owned();
    (out.lines().last().unwrap().to_owned(), id)
}
