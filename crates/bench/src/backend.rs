//! Where the benchmarked shortener keeps its state: the embedded store, or (scale-out)
//! a database of its own on PostgreSQL and a throwaway Redis.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use testkit::RedisServer;

/// A database created for one benchmark run, dropped afterwards.
#[derive(Debug)]
pub(crate) struct BenchDb {
    admin_url: String,
    name: String,
    url: String,
}

fn psql(url: &str, sql: &str) -> anyhow::Result<String> {
    let out = Command::new("psql")
        .args(["-w", url, "-qAtc", sql])
        .output()
        .context("cannot run psql (install postgresql-client)")?;
    if !out.status.success() {
        bail!(
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

impl BenchDb {
    fn create(admin_url: &str) -> anyhow::Result<Self> {
        let name = format!("shortener_bench_{}", std::process::id());
        psql(admin_url, &format!("CREATE DATABASE {name}"))?;
        let (base, _) = admin_url
            .rsplit_once('/')
            .context("the admin URL has no database path")?;
        Ok(Self {
            admin_url: admin_url.to_owned(),
            url: format!("{base}/{name}"),
            name,
        })
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        if let Err(e) = psql(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        ) {
            eprintln!("could not drop the bench database {}: {e}", self.name);
        }
    }
}

/// The state behind the shortener under test.
#[derive(Debug)]
pub(crate) enum Backend {
    Embedded { data: PathBuf },
    Scaleout { db: BenchDb, redis: RedisServer },
}

impl Backend {
    pub(crate) fn embedded(work: &Path) -> Self {
        Self::Embedded {
            data: work.join("data"),
        }
    }

    /// A fresh migrated database on the PostgreSQL at `admin_url` and a Redis of its own.
    pub(crate) fn scaleout(work: &Path, admin_url: &str, bin_dir: &Path) -> anyhow::Result<Self> {
        let db = BenchDb::create(admin_url)?;
        let out = Command::new(bin_dir.join("shortener"))
            .args(["migrate", "--database", &db.url])
            .env("SHORTENER_LOG", "warn")
            .output()?;
        if !out.status.success() {
            bail!("migrate failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let redis = RedisServer::start(work).context("cannot start redis-server")?;
        Ok(Self::Scaleout { db, redis })
    }

    /// Flags naming this state, for `serve` and `token create`.
    pub(crate) fn flags(&self) -> Vec<String> {
        match self {
            Self::Embedded { data } => vec!["--data-dir".into(), data.display().to_string()],
            Self::Scaleout { db, redis } => vec![
                "--database".into(),
                db.url.clone(),
                "--redis".into(),
                redis.url(),
            ],
        }
    }

    /// Flags naming only the store (what `import` needs).
    pub(crate) fn store_flags(&self) -> Vec<String> {
        match self {
            Self::Embedded { data } => vec!["--data-dir".into(), data.display().to_string()],
            Self::Scaleout { db, .. } => vec!["--database".into(), db.url.clone()],
        }
    }

    pub(crate) fn count_links(&self) -> anyhow::Result<usize> {
        match self {
            Self::Embedded { data } => {
                let conn = rusqlite::Connection::open(data.join("shortener.db"))?;
                let n: i64 = conn.query_row("SELECT count(*) FROM links", [], |r| r.get(0))?;
                Ok(usize::try_from(n)?)
            }
            Self::Scaleout { db, .. } => Ok(psql(&db.url, "SELECT count(*) FROM links")?
                .trim()
                .parse()?),
        }
    }

    pub(crate) fn read_codes(&self) -> anyhow::Result<Vec<String>> {
        match self {
            Self::Embedded { data } => {
                let conn = rusqlite::Connection::open(data.join("shortener.db"))?;
                let mut stmt = conn.prepare("SELECT code FROM links")?;
                let codes = stmt
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(codes)
            }
            Self::Scaleout { db, .. } => Ok(psql(&db.url, "SELECT code FROM links")?
                .lines()
                .map(str::to_owned)
                .collect()),
        }
    }

    /// The processes that do the store's work for the shortener, by name (scale-out: the
    /// PostgreSQL backends connected to its database, and its Redis); none for the embedded
    /// store, whose work runs in the shortener's own threads.
    pub(crate) fn store_pids(&self) -> anyhow::Result<Vec<(&'static str, Vec<u32>)>> {
        match self {
            Self::Embedded { .. } => Ok(Vec::new()),
            Self::Scaleout { db, redis } => {
                // Through the admin database, so that this query's own backend is not counted.
                let backends = psql(
                    &db.admin_url,
                    &format!(
                        "SELECT pid FROM pg_stat_activity WHERE datname = '{}'",
                        db.name
                    ),
                )?;
                let backends = backends
                    .lines()
                    .map(|l| l.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(vec![
                    ("PostgreSQL backends", backends),
                    ("Redis", redis.pid().into_iter().collect()),
                ])
            }
        }
    }

    /// Issue 18's bar for durable creates per second (64 clients) on this state.
    pub(crate) fn creates_bar(&self) -> f64 {
        match self {
            Self::Embedded { .. } => 15_000.0,
            Self::Scaleout { .. } => 6_000.0,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Embedded { .. } => "embedded (SQLite)",
            Self::Scaleout { .. } => "scale-out (PostgreSQL + Redis)",
        }
    }
}
