//! The scale-out store: PostgreSQL through a pool of connections (deadpool-postgres over
//! tokio-postgres), every statement prepared once per connection and cached.
//!
//! Many processes share one database: the id counter is leased with one atomic
//! `UPDATE … RETURNING`, aliases are put-if-absent with `INSERT … ON CONFLICT DO NOTHING`,
//! and a batch of clicks is one transaction. The SQL stays within what CockroachDB also
//! speaks; ARCHITECTURE.md lists the few places where that is not free.

mod changes;
mod clicks;
mod errors;
mod group_commit;
mod import;
mod schema;
mod url;

use super::{
    AUDIT_COLUMNS, CreatedRows, LINK_COLUMNS, PAGE_SEQ_INDEX, REPORT_SELECT, RawAudit, RawReport,
    SPENT_PRUNED_PER_SPEND, SqlValue, TARGET_COLUMNS, TOKEN_COLUMNS, audit_query_sql, disable_from,
    link_page_sql, report_page_sql, stored_people, stored_token_id, update_state_sql,
};
use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime, Transaction,
};
use shortener_core::audit::{AuditQuery, AuditRecord, AuditRow, Origin};
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::link::{Link, LinkChange, RedirectTarget};
use shortener_core::listing::{LinkQuery, PageOfLinks};
use shortener_core::report::{
    AutoDisable, NewReport, Report, ReportOutcome, ReportQuery, Resolution, ResolveOutcome,
};
use shortener_core::store::{
    ChangeNote, ChangeOutcome, DailyCount, FoundToken, ImportBatch, ImportOutcome, InsertOutcome,
    LinkStore, StoreError, TokenInfo, TokenRecord,
};
use shortener_core::token::{Principal, TOKEN_ID_BYTES, TokenHash, TokenId};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use changes::{NUMBERED_AT_ONCE, change_once, file_report, insert_audit, number_pending};
use errors::{classify, describe, describe_pool};
pub use schema::CURRENT_VERSION;
pub use url::{DatabaseUrl, DatabaseUrlError};

/// Default connections per process. Statements are short, so a few connections carry
/// thousands of requests per second, and many instances share the server's
/// `max_connections` (100 by default).
pub const DEFAULT_POOL_SIZE: usize = 16;
/// Limit on each TCP connect unless the URL sets `connect_timeout`. A refused connection (the
/// server is down, its host up) fails at once whatever this is; the limit bounds the wait on
/// a host that does not answer at all.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Added to the connect limit for the rest of a new connection (startup, authentication),
/// which tokio-postgres does not bound itself.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(750);
/// How long sent bytes may stay unacknowledged before the kernel drops the connection (Linux
/// `TCP_USER_TIMEOUT`), unless the URL sets `tcp_user_timeout`: a statement sent to a host that
/// vanished fails after this instead of after TCP's retransmissions (~15 minutes).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for a free connection when all are busy before it gets a 503.
const WAIT_TIMEOUT: Duration = Duration::from_secs(2);
/// Statement timeout of click batches, pruning and the feed sweep's scan on a pool whose
/// statements are bounded for the request path: background work, larger, retried later.
const BACKGROUND_STATEMENT_TIMEOUT: &str = "60s";

/// Why the PostgreSQL store could not be opened; each says what to do in one line.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No connection could be made.
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Unreachable { target: String, reason: String },
    /// Connected, but the schema is not the one this binary uses.
    #[error(
        "PostgreSQL at {target} has schema version {found}, this binary needs {CURRENT_VERSION}; run `shortener migrate --database …` first"
    )]
    SchemaBehind { target: String, found: i32 },
    /// The database was migrated by a newer binary.
    #[error(
        "PostgreSQL at {target} has schema version {found}, newer than this binary's {CURRENT_VERSION}; upgrade the binary"
    )]
    SchemaAhead { target: String, found: i32 },
    /// Connected, then a statement failed.
    #[error("PostgreSQL at {target}: {reason}")]
    Failed { target: String, reason: String },
}

/// What `migrate` left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateReport {
    /// Migrations this run applied (0: the schema was already current).
    pub applied: usize,
    /// The schema version now.
    pub version: i32,
}

/// Handle to the PostgreSQL store; cheap to clone, every clone shares one pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    target: String,
    /// Whether the connections carry a request-path `statement_timeout`, which background
    /// transactions then lift for themselves.
    bounded: bool,
    /// Creates waiting for their group's commit.
    creates: Arc<group_commit::Creates>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// What an import ends with (see `after_import`).
const IMPORT_VACUUM: &str = "VACUUM (ANALYZE) links, audit";

impl PgStore {
    /// Connects and checks that the schema is exactly the one this binary uses. It never
    /// changes the schema: that is `shortener migrate`'s job.
    pub async fn open(url: &DatabaseUrl, pool_size: usize) -> Result<Self, OpenError> {
        Self::open_bounded(url, pool_size, None).await
    }

    /// [`Self::open`], every statement of the pool's connections bounded by
    /// `statement_timeout` on the server (unless the URL's `options` set one), so that the
    /// server gives up on work nobody waits for any more.
    pub async fn open_bounded(
        url: &DatabaseUrl,
        pool_size: usize,
        statement_timeout: Option<Duration>,
    ) -> Result<Self, OpenError> {
        let store = Self::pool(url, pool_size, statement_timeout)?;
        let client = store.connection_for_start().await?;
        let found = schema::version(&client)
            .await
            .map_err(|e| store.failed(&e))?;
        match found {
            CURRENT_VERSION => Ok(store),
            found if found > CURRENT_VERSION => Err(OpenError::SchemaAhead {
                target: store.target.clone(),
                found,
            }),
            found => Err(OpenError::SchemaBehind {
                target: store.target.clone(),
                found,
            }),
        }
    }

    /// Brings the schema up to date (idempotent; safe from several processes at once).
    pub async fn migrate(url: &DatabaseUrl) -> Result<MigrateReport, OpenError> {
        let store = Self::pool(url, 1, None)?;
        let mut client = store.connection_for_start().await?;
        match schema::migrate(&mut client)
            .await
            .map_err(|e| store.failed(&e))?
        {
            schema::Migrated::Current { applied } => Ok(MigrateReport {
                applied,
                version: CURRENT_VERSION,
            }),
            schema::Migrated::TooNew { found } => Err(OpenError::SchemaAhead {
                target: store.target.clone(),
                found,
            }),
        }
    }

    fn pool(
        url: &DatabaseUrl,
        pool_size: usize,
        statement_timeout: Option<Duration>,
    ) -> Result<Self, OpenError> {
        let target = url.to_string();
        let mut config = (*url.config).clone();
        let options = config.get_options().unwrap_or("").to_owned();
        let bounded = statement_timeout.is_some() && !options.contains("statement_timeout");
        if let Some(timeout) = statement_timeout.filter(|_| bounded) {
            config.options(format!(
                "{options} -c statement_timeout={}",
                timeout.as_millis().max(1)
            ));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let connect_timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("shortener");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                // A closed connection is noticed without a round trip; a half-open one fails
                // its first statement, which maps to 503 like any other outage.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(WAIT_TIMEOUT))
            // A server that accepts but never answers holds a request this long at most.
            .create_timeout(Some(connect_timeout + HANDSHAKE_TIMEOUT))
            .recycle_timeout(Some(WAIT_TIMEOUT))
            .build()
            .map_err(|e| OpenError::Failed {
                target: target.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            pool,
            target,
            bounded,
            creates: Arc::new(group_commit::Creates::new(pool_size)),
        })
    }

    /// How far this server's log goes, in bytes: on a primary where it writes
    /// (`pg_current_wal_lsn`), on a standby what it has replayed (`pg_last_wal_replay_lsn`).
    /// A standby's lag is measured by comparing the two, never by replay timestamps, which
    /// grow on an idle primary.
    pub async fn wal_position(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                 ELSE pg_current_wal_lsn() END - '0/0'::pg_lsn)::BIGINT",
                &[],
            )
            .await
            .map_err(classify)?;
        Ok(to_u64(row.try_get(0).map_err(classify)?))
    }

    async fn connection_for_start(&self) -> Result<Object, OpenError> {
        self.pool.get().await.map_err(|e| OpenError::Unreachable {
            target: self.target.clone(),
            reason: describe_pool(&e),
        })
    }

    fn failed(&self, e: &tokio_postgres::Error) -> OpenError {
        OpenError::Failed {
            target: self.target.clone(),
            reason: describe(e),
        }
    }

    /// Runs a query built by one of the shared builders (`audit_query_sql`, …).
    async fn query_built(&self, sql: &str, values: &[SqlValue]) -> Result<Vec<Row>, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(classify)?;
        let params: Vec<&(dyn ToSql + Sync)> = values
            .iter()
            .map(|v| match v {
                SqlValue::Text(t) => t as &(dyn ToSql + Sync),
                SqlValue::Int(i) => i as &(dyn ToSql + Sync),
            })
            .collect();
        client.query(&stmt, &params).await.map_err(classify)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        // Every way of not getting a connection (refused, timed out, pool closed) means the
        // database is out of reach: the API answers 503, and a later call tries again.
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(describe_pool(&e).into()))
    }

    /// Runs [`IMPORT_VACUUM`], or says why it could not.
    async fn vacuum_imported(&self) -> Result<(), String> {
        // Off the pool: the session setting below must not follow the connection back to it.
        let client = Object::take(self.client().await.map_err(|e| e.to_string())?);
        // Anyone but the owner gets a notice, not an error, and the tables skipped.
        let not_owned: Vec<String> = client
            .query(
                "SELECT relname::TEXT FROM pg_class \
                 WHERE oid IN ('links'::regclass, 'audit'::regclass) \
                 AND NOT pg_has_role(relowner, 'USAGE') ORDER BY 1",
                &[],
            )
            .await
            .map_err(|e| describe(&e))?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| describe(&e))?;
        if !not_owned.is_empty() {
            return Err(format!(
                "this role does not own {}",
                not_owned.join(" and ")
            ));
        }
        // A `statement_timeout` from the URL's options or the role would cut a large table's
        // first VACUUM short. One statement a call: VACUUM runs in no transaction block, and
        // several statements in one string make one.
        for statement in ["SET statement_timeout = 0", IMPORT_VACUUM] {
            client
                .batch_execute(statement)
                .await
                .map_err(|e| describe(&e))?;
        }
        Ok(())
    }
}

/// A transaction for background work, free of the request path's statement timeout.
async fn background_transaction(
    client: &mut Object,
    bounded: bool,
) -> Result<Transaction<'_>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    if bounded {
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = '{BACKGROUND_STATEMENT_TIMEOUT}'"
        ))
        .await?;
    }
    Ok(tx)
}

fn token_info(r: &Row) -> Result<TokenInfo, StoreError> {
    let id = stored_token_id(r.try_get(0).map_err(classify)?)?;
    Ok(TokenInfo {
        id,
        principal: Principal {
            user: r.try_get(1).map_err(classify)?,
            admin: r.try_get(2).map_err(classify)?,
        },
        name: r.try_get(3).map_err(classify)?,
        created_at: r.try_get(4).map_err(classify)?,
        last_used_at: r.try_get(5).map_err(classify)?,
    })
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A [`RedirectTarget`] from [`TARGET_COLUMNS`], the first at column `at`.
fn target_from_row(r: &Row, at: usize) -> Result<RedirectTarget, tokio_postgres::Error> {
    Ok(RedirectTarget {
        long_url: r.try_get(at)?,
        expires_at: r.try_get(at + 1)?,
        version: to_u64(r.try_get(at + 2)?),
        disabled: r.try_get(at + 3)?,
        deleted: r.try_get(at + 4)?,
    })
}

fn link_from_row(row: &Row) -> Result<Link, tokio_postgres::Error> {
    Ok(Link {
        code: row.try_get(0)?,
        long_url: row.try_get(1)?,
        owner: row.try_get(2)?,
        custom_alias: row.try_get(3)?,
        created_at: row.try_get(4)?,
        expires_at: row.try_get(5)?,
        disabled: disable_from(
            row.try_get(6)?,
            row.try_get(11)?,
            row.try_get(12)?,
            row.try_get(13)?,
        ),
        clicks: to_u64(row.try_get(7)?),
        bot_clicks: to_u64(row.try_get(8)?),
        created_ip: row.try_get(9)?,
        version: to_u64(row.try_get(10)?),
        deleted_at: row.try_get(14)?,
        owner_admin: row.try_get(15)?,
    })
}

fn report_from_row(r: &Row) -> Result<RawReport, tokio_postgres::Error> {
    Ok(RawReport {
        id: r.try_get(0)?,
        code: r.try_get(1)?,
        at: r.try_get(2)?,
        ip: r.try_get(3)?,
        category: r.try_get(4)?,
        comment: r.try_get(5)?,
        resolved_at: r.try_get(6)?,
        resolved_by: r.try_get(7)?,
        resolution: r.try_get(8)?,
        disabled_at: r.try_get(9)?,
        disabled_reason: r.try_get(10)?,
        disabled_by: r.try_get(11)?,
        disabled_by_kind: r.try_get(12)?,
        deleted_at: r.try_get(13)?,
    })
}

fn placeholder(i: usize) -> String {
    format!("${i}")
}

#[async_trait]
impl LinkStore for PgStore {
    async fn lease_ids(&self, count: u64) -> Result<Range<u64>, StoreError> {
        let count = to_i64(count);
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "UPDATE id_counter SET next_id = next_id + $1 WHERE id = 0 RETURNING next_id",
            )
            .await
            .map_err(classify)?;
        let end: i64 = client
            .query_one(&stmt, &[&count])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(classify)?;
        Ok(to_u64(end - count)..to_u64(end))
    }

    async fn secret(&self, name: &'static str, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let client = self.client().await?;
        // Two statements, not one: the SELECT must see a secret that a racing process
        // committed while our INSERT waited on it, which a single statement's snapshot would
        // not.
        client
            .execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&name, &candidate],
            )
            .await
            .map_err(classify)?;
        client
            .query_one("SELECT value FROM meta WHERE key = $1", &[&name])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(classify)
    }

    async fn spend_once(
        &self,
        token: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM spent_tokens WHERE token IN \
                 (SELECT token FROM spent_tokens WHERE until <= $1 LIMIT $2)",
                &[&now, &SPENT_PRUNED_PER_SPEND],
            )
            .await
            .map_err(classify)?;
        let inserted = client
            .execute(
                "INSERT INTO spent_tokens (token, until) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&token, &until],
            )
            .await
            .map_err(classify)?;
        Ok(inserted == 1)
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        work: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let taken = client
            .execute(
                "INSERT INTO leases (name, holder, until) VALUES ($1, $2, $4) \
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until \
                 WHERE leases.until <= $5 AND leases.done IS DISTINCT FROM $3",
                &[&name, &holder, &work, &until, &now],
            )
            .await
            .map_err(classify)?;
        Ok(taken == 1)
    }

    async fn end_lease(
        &self,
        name: &str,
        holder: &str,
        done: Option<&str>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE leases SET until = 0, done = coalesce($3, done) \
                 WHERE name = $1 AND holder = $2",
                &[&name, &holder, &done],
            )
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn insert_link(&self, link: &Link, origin: &Origin) -> Result<InsertOutcome, StoreError> {
        self.creates.insert(&self.pool, link, origin).await
    }

    async fn import_links(&self, batch: Arc<ImportBatch>) -> Result<ImportOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(classify)?;
        let outcome = import::write_batch(&tx, &batch).await.map_err(classify)?;
        if let ImportOutcome::Committed(_) = outcome {
            tx.commit().await.map_err(classify)?;
        }
        // Otherwise dropping `tx` rolls it back.
        Ok(outcome)
    }

    async fn after_import(&self) -> Result<Option<&'static str>, StoreError> {
        // Autovacuum would in time, where it is on and once a table grew by a fifth: until
        // then every click batch's `links` probe reads each new row's heap page to check its
        // visibility (BENCHMARKS.md, "twenty-ninth session" of the shortener). `audit` grew by
        // as many rows, which its listings' plans should know of.
        match self.vacuum_imported().await {
            Ok(()) => Ok(Some(IMPORT_VACUUM)),
            Err(reason) => Err(StoreError::Backend(
                format!(
                    "`{IMPORT_VACUUM}` did not run: {reason}; run it as the tables' owner: until \
                     it runs (autovacuum may be late, or off), every click batch reads each new \
                     link's row"
                )
                .into(),
            )),
        }
    }

    async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        client
            .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
            .await
            .and_then(|row| row.map(|r| r.try_get(0)).transpose())
            .map_err(classify)
    }

    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {LINK_COLUMNS} FROM counted_links WHERE code = $1"
            ))
            .await
            .map_err(classify)?;
        client
            .query_opt(&stmt, &[&code])
            .await
            .and_then(|row| row.as_ref().map(link_from_row).transpose())
            .map_err(classify)
    }

    async fn redirect_target(&self, code: &str) -> Result<Option<RedirectTarget>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {TARGET_COLUMNS} FROM links WHERE code = $1"
            ))
            .await
            .map_err(classify)?;
        client
            .query_opt(&stmt, &[&code])
            .await
            .and_then(|row| row.as_ref().map(|r| target_from_row(r, 0)).transpose())
            .map_err(classify)
    }

    async fn redirect_targets(
        &self,
        codes: &[String],
    ) -> Result<Vec<Option<RedirectTarget>>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT n.i, {TARGET_COLUMNS} FROM unnest($1::TEXT[]) WITH ORDINALITY n(code, i) \
                 JOIN links USING (code)"
            ))
            .await
            .map_err(classify)?;
        let rows = client.query(&stmt, &[&codes]).await.map_err(classify)?;
        let mut targets = vec![None; codes.len()];
        for row in &rows {
            let i: i64 = row.try_get(0).map_err(classify)?;
            let slot = usize::try_from(i - 1)
                .ok()
                .and_then(|i| targets.get_mut(i))
                .ok_or_else(|| StoreError::Backend(format!("position {i} out of range").into()))?;
            *slot = Some(target_from_row(row, 1).map_err(classify)?);
        }
        Ok(targets)
    }

    async fn list_links(&self, query: &LinkQuery) -> Result<PageOfLinks, StoreError> {
        let (sql, values) = link_page_sql(query, "counted_links", placeholder, "strpos");
        let rows = self.query_built(&sql, &values).await?;
        let rows = rows
            .iter()
            .map(|r| Ok((link_from_row(r)?, r.try_get(PAGE_SEQ_INDEX)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(classify)?;
        Ok(PageOfLinks::new(query, rows))
    }

    async fn change_link(
        &self,
        code: &str,
        change: &LinkChange,
        origin: &Origin,
        now: UnixSeconds,
    ) -> Result<ChangeOutcome, StoreError> {
        let mut client = self.client().await?;
        change_once(&mut client, code, change, origin, now)
            .await
            .map_err(classify)
    }

    async fn last_change(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT seq FROM change_counter WHERE id = 0")
            .await
            .map_err(classify)?;
        client
            .query_one(&stmt, &[])
            .await
            .and_then(|row| row.try_get::<_, i64>(0))
            .map(to_u64)
            .map_err(classify)
    }

    async fn changes_after(&self, seq: u64, limit: usize) -> Result<Vec<ChangeNote>, StoreError> {
        let client = self.client().await?;
        // Whole positions while fewer than `limit` notes came before them: a group's note
        // holds many codes (`upto`: the notes up to and including the row's).
        let stmt = client
            .prepare_cached(
                "SELECT seq, code, version, codes, versions FROM \
                 (SELECT *, sum(n_codes) OVER (ORDER BY seq) AS upto \
                 FROM (SELECT * FROM link_changes WHERE seq > $1 ORDER BY seq LIMIT $2) n) w \
                 WHERE upto - n_codes < $2 ORDER BY seq",
            )
            .await
            .map_err(classify)?;
        let rows = client
            .query(&stmt, &[&to_i64(seq), &to_i64(limit as u64)])
            .await
            .map_err(classify)?;
        let mut notes = Vec::new();
        for r in &rows {
            let seq = to_u64(r.try_get(0).map_err(classify)?);
            let codes: Option<Vec<String>> = r.try_get(3).map_err(classify)?;
            match codes {
                Some(codes) => {
                    let versions: Vec<i64> = r.try_get(4).map_err(classify)?;
                    notes.extend(codes.into_iter().zip(versions).map(|(code, version)| {
                        ChangeNote {
                            seq,
                            code,
                            version: to_u64(version),
                        }
                    }));
                }
                None => notes.push(ChangeNote {
                    seq,
                    code: r.try_get(1).map_err(classify)?,
                    version: to_u64(r.try_get(2).map_err(classify)?),
                }),
            }
        }
        Ok(notes)
    }

    async fn number_pending_changes(&self) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let mut numbered = 0;
        loop {
            let n = number_pending(&mut client, self.bounded)
                .await
                .map_err(classify)?;
            numbered += n;
            if n < to_u64(NUMBERED_AT_ONCE) {
                return Ok(numbered);
            }
        }
    }

    async fn prune_changes_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = background_transaction(&mut client, self.bounded)
            .await
            .map_err(classify)?;
        // Notes waiting for a number are left to the numbering (its positions stay gapless).
        let pruned = tx
            .execute(
                "DELETE FROM link_changes WHERE seq IN \
                 (SELECT seq FROM link_changes WHERE at < $1 AND seq > 0 ORDER BY at LIMIT $2)",
                &[&at, &to_i64(batch as u64)],
            )
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(pruned)
    }

    async fn live_destinations_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        // The feed sweep's scan: background work, past disabled and deleted rows.
        let mut client = self.client().await?;
        let tx = background_transaction(&mut client, self.bounded)
            .await
            .map_err(classify)?;
        let stmt = tx
            .prepare_cached(
                "SELECT code, long_url FROM links WHERE code > $1 \
                 AND disabled_at IS NULL AND deleted_at IS NULL ORDER BY code LIMIT $2",
            )
            .await
            .map_err(classify)?;
        let rows = tx
            .query(&stmt, &[&after, &to_i64(limit as u64)])
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(classify)
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        let (sql, values) = audit_query_sql(query, placeholder, CreatedRows::ByCode);
        let rows = self.query_built(&sql, &values).await?;
        rows.iter()
            .map(|r| {
                Ok(RawAudit {
                    id: r.try_get(0)?,
                    at: r.try_get(1)?,
                    actor: r.try_get(2)?,
                    ip: r.try_get(3)?,
                    user_agent: r.try_get(4)?,
                    action: r.try_get(5)?,
                    code: r.try_get(6)?,
                    old_url: r.try_get(7)?,
                    new_url: r.try_get(8)?,
                    detail: r.try_get(9)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(classify)?
            .into_iter()
            .map(RawAudit::into_row)
            .collect()
    }

    async fn prune_audit_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = background_transaction(&mut client, self.bounded)
            .await
            .map_err(classify)?;
        let stmt = tx
            .prepare_cached(
                "DELETE FROM audit WHERE id IN \
                 (SELECT id FROM audit WHERE at < $1 ORDER BY id LIMIT $2)",
            )
            .await
            .map_err(classify)?;
        let pruned = tx
            .execute(&stmt, &[&at, &to_i64(batch as u64)])
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(pruned)
    }

    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "SELECT day, clicks, bot_clicks, visitors, tops FROM click_days \
                 WHERE code = $1 AND day >= $2",
            )
            .await
            .map_err(classify)?;
        let rows = client
            .query(&stmt, &[&code, &since.number()])
            .await
            .map_err(classify)?;
        rows.iter()
            .map(|r| {
                Ok(DailyCount {
                    day: Day::from_number(r.try_get(0)?),
                    human: to_u64(r.try_get(1)?),
                    bot: to_u64(r.try_get(2)?),
                    people: stored_people(r.try_get(3)?, r.try_get(4)?),
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(classify)
    }

    async fn insert_report(
        &self,
        report: &NewReport,
        origin: &Origin,
        auto: Option<AutoDisable>,
    ) -> Result<ReportOutcome, StoreError> {
        let mut client = self.client().await?;
        file_report(&mut client, report, origin, auto)
            .await
            .map_err(classify)
    }

    async fn reports(&self, query: &ReportQuery) -> Result<Vec<Report>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&report_page_sql(query.open, placeholder))
            .await
            .map_err(classify)?;
        let rows = client
            .query(
                &stmt,
                &[
                    &query.before.unwrap_or(i64::MAX),
                    &to_i64(query.limit as u64),
                ],
            )
            .await
            .map_err(classify)?;
        rows.iter()
            .map(|r| report_from_row(r).map_err(classify)?.into_report())
            .collect()
    }

    async fn resolve_report(
        &self,
        id: i64,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        let client = self.client().await?;
        let update = client
            .prepare_cached(
                "UPDATE reports SET resolved_at = $2, resolved_by = $3, resolution = $4 \
                 WHERE id = $1 AND resolved_at IS NULL",
            )
            .await
            .map_err(classify)?;
        let resolved = client
            .execute(
                &update,
                &[&id, &resolution.at, &resolution.by, &resolution.text],
            )
            .await
            .map_err(classify)?;
        let select = client
            .prepare_cached(&format!("{REPORT_SELECT} WHERE r.id = $1"))
            .await
            .map_err(classify)?;
        let row = client.query_opt(&select, &[&id]).await.map_err(classify)?;
        let Some(row) = row else {
            return Ok(ResolveOutcome::NotFound);
        };
        let report = report_from_row(&row).map_err(classify)?.into_report()?;
        Ok(if resolved == 1 {
            ResolveOutcome::Resolved(report)
        } else {
            ResolveOutcome::AlreadyResolved(report)
        })
    }

    async fn insert_token(&self, token: &TokenRecord, origin: &Origin) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let audit = AuditRecord::token_issued(token, origin);
        let tx = client.transaction().await.map_err(classify)?;
        tx.execute(
            "INSERT INTO tokens (hash, user_name, admin, created_at, name)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &&token.hash.0[..],
                &token.principal.user,
                &token.principal.admin,
                &token.created_at,
                &token.name,
            ],
        )
        .await
        .map_err(classify)?;
        insert_audit(&tx, &audit).await.map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    async fn find_token(&self, hash: &TokenHash) -> Result<Option<FoundToken>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT user_name, admin, last_used_at FROM tokens WHERE hash = $1")
            .await
            .map_err(classify)?;
        client
            .query_opt(&stmt, &[&&hash.0[..]])
            .await
            .and_then(|row| {
                row.map(|r| {
                    Ok(FoundToken {
                        principal: Principal {
                            user: r.try_get(0)?,
                            admin: r.try_get(1)?,
                        },
                        last_used_at: r.try_get(2)?,
                    })
                })
                .transpose()
            })
            .map_err(classify)
    }

    async fn touch_token(&self, hash: &TokenHash, at: UnixSeconds) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE tokens SET last_used_at = $2
                 WHERE hash = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
                &[&&hash.0[..], &at],
            )
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, hash"),
                &[],
            )
            .await
            .map_err(classify)?;
        rows.iter().map(token_info).collect()
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Result<Option<TokenInfo>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(classify)?;
        let found = tx
            .query(
                &format!(
                    "DELETE FROM tokens WHERE substring(hash from 1 for {TOKEN_ID_BYTES}) = $1
                     RETURNING {}",
                    TOKEN_COLUMNS
                        .trim_start_matches("SELECT ")
                        .trim_end_matches(" FROM tokens")
                ),
                &[&&id.0[..]],
            )
            .await
            .map_err(classify)?;
        let token = match found.as_slice() {
            [] => return Ok(None),
            [row] => token_info(row)?,
            // Two tokens sharing 48 bits of hash: an id that does not say which revokes
            // neither (the transaction is dropped, so rolled back).
            _ => {
                return Err(StoreError::Backend(
                    format!("two tokens have the id {id}").into(),
                ));
            }
        };
        insert_audit(&tx, &AuditRecord::token_revoked(&token, origin, at))
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(Some(token))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(classify)
    }
}
