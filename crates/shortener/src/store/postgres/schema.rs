//! Versioned schema of the PostgreSQL store, tracked in the `schema_migrations` table.
//!
//! Applied only by `shortener migrate`; `serve` and `token create` check the version and refuse
//! to start on a missing, older or newer schema (see ARCHITECTURE.md for why).

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Error};

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only: never edit one
/// that has shipped. Plain PostgreSQL DDL that CockroachDB also accepts (no sequences, no
/// advisory locks, no `SERIAL`).
const MIGRATIONS: &[&str] = &[
    // v1: links, daily clicks, tokens, the id counter and the secret key of codes. The same
    // tables as the embedded store's v1, with PostgreSQL types.
    "
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value BYTEA NOT NULL
    );

    CREATE TABLE id_counter (
        id      INT4 PRIMARY KEY CHECK (id = 0),
        next_id INT8 NOT NULL
    );
    INSERT INTO id_counter (id, next_id) VALUES (0, 0);

    CREATE TABLE links (
        code         TEXT PRIMARY KEY,
        long_url     TEXT NOT NULL,
        owner        TEXT,
        custom_alias BOOL NOT NULL,
        created_at   INT8 NOT NULL,
        expires_at   INT8 NOT NULL,
        disabled_at  INT8,
        clicks       INT8 NOT NULL DEFAULT 0,
        bot_clicks   INT8 NOT NULL DEFAULT 0,
        created_ip   TEXT
    );
    CREATE INDEX links_owner ON links (owner);

    CREATE TABLE daily_clicks (
        code       TEXT NOT NULL,
        day        INT4 NOT NULL,
        clicks     INT8 NOT NULL DEFAULT 0,
        bot_clicks INT8 NOT NULL DEFAULT 0,
        PRIMARY KEY (code, day)
    );
    CREATE INDEX daily_clicks_day ON daily_clicks (day);

    CREATE TABLE tokens (
        hash       BYTEA PRIMARY KEY,
        user_name  TEXT NOT NULL,
        admin      BOOL NOT NULL,
        created_at INT8 NOT NULL
    );
    ",
    // v2: ids of click batches already applied (the scale-out click stream may deliver a
    // batch twice; it must count once), as in the embedded store's v2.
    "
    CREATE TABLE applied_click_batches (
        id  TEXT PRIMARY KEY,
        day INT4 NOT NULL
    );
    CREATE INDEX applied_click_batches_day ON applied_click_batches (day);
    ",
];

/// Schema version this binary reads and writes.
pub const CURRENT_VERSION: i32 = MIGRATIONS.len() as i32;

const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INT4 PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// The schema version of the database: 0 when it has none.
pub(crate) async fn version(client: &Client) -> Result<i32, Error> {
    match client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await
    {
        Ok(row) => row.try_get(0),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(0),
        Err(e) => Err(e),
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Migrated {
    /// The schema is current; this many migrations were applied by this call.
    Current { applied: usize },
    /// The database is ahead of this binary; nothing was touched.
    TooNew { found: i32 },
}

/// Applies the missing migrations, each in its own transaction. Safe to run from several
/// processes at once: each migration first claims its row in `schema_migrations`, so a second
/// runner waits on that row and then skips the migration instead of applying it twice.
pub(crate) async fn migrate(client: &mut Client) -> Result<Migrated, Error> {
    // Two concurrent `CREATE TABLE IF NOT EXISTS` can both miss the table, and the later one
    // then fails on the catalog (its row type "already exists", or the catalog's unique
    // index) — possibly before the first one has committed. So retry until the statement
    // succeeds: once the winner commits, `IF NOT EXISTS` sees its table.
    let mut attempts = 0;
    while let Err(e) = client.batch_execute(CREATE_MIGRATIONS_TABLE).await {
        let raced = matches!(
            e.code(),
            Some(
                &SqlState::UNIQUE_VIOLATION
                    | &SqlState::DUPLICATE_TABLE
                    | &SqlState::DUPLICATE_OBJECT
            )
        );
        attempts += 1;
        if !raced || attempts >= 50 {
            return Err(e);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let found = version(client).await?;
    if found > CURRENT_VERSION {
        return Ok(Migrated::TooNew { found });
    }
    let mut applied = 0;
    for (index, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(found).unwrap_or(0))
    {
        let target = i32::try_from(index + 1).unwrap_or(i32::MAX);
        let tx = client.transaction().await?;
        let claimed = tx
            .execute(
                "INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&target],
            )
            .await?;
        if claimed == 1 {
            tx.batch_execute(sql).await?;
            tx.commit().await?;
            applied += 1;
            tracing::info!(version = target, "applied PostgreSQL schema migration");
        } else {
            tx.rollback().await?;
        }
    }
    Ok(Migrated::Current { applied })
}
