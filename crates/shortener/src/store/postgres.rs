//! The scale-out store: PostgreSQL through a pool of connections (deadpool-postgres over
//! tokio-postgres), every statement prepared once per connection and cached.
//!
//! Many processes share one database: the id counter is leased with one atomic
//! `UPDATE … RETURNING`, aliases are put-if-absent with `INSERT … ON CONFLICT DO NOTHING`,
//! and a batch of clicks is one transaction. The SQL stays within what CockroachDB also
//! speaks; ARCHITECTURE.md lists the few places where that is not free.

mod group_commit;
mod import;
mod schema;

use super::{
    AUDIT_COLUMNS, LINK_COLUMNS, REPORT_SELECT, RawAudit, RawReport, SPENT_PRUNED_PER_SPEND,
    SqlValue, TARGET_COLUMNS, TOKEN_COLUMNS, audit_query_sql, disable_from, link_page_sql,
    merged_people, report_page_sql, stored_people, stored_token_id, update_state_sql,
};
use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
    Transaction,
};
use shortener_core::audit::{AuditQuery, AuditRecord, AuditRow, Origin};
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::link::{Actor, Link, LinkChange, RedirectTarget, Refusal};
use shortener_core::listing::LinkQuery;
use shortener_core::people::People;
use shortener_core::report::{
    AUTO_DISABLE_WINDOW_SECONDS, AUTO_REPORTS_ACTOR, AutoDisable, NewReport, Report, ReportOutcome,
    ReportQuery, Resolution, ResolveOutcome,
};
use shortener_core::store::{
    ChangeNote, ChangeOutcome, ClickBatch, ClickDelta, ClickSink, DailyCount, FoundToken,
    ImportBatch, ImportOutcome, InsertOutcome, LinkStore, StoreError, TokenInfo, TokenRecord,
};
use shortener_core::token::{Principal, TOKEN_ID_BYTES, TokenHash, TokenId};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, NoTls, Row, config::Host};

pub use schema::CURRENT_VERSION;

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
/// Attempts of a click batch that lost a serialization race or a deadlock (CockroachDB
/// retries, PostgreSQL's deadlock detector); the aggregator retries later beyond these.
const CLICK_ATTEMPTS: u32 = 3;
/// Statement timeout of click batches, pruning and the feed sweep's scan on a pool whose
/// statements are bounded for the request path: background work, larger, retried later.
const BACKGROUND_STATEMENT_TIMEOUT: &str = "60s";

/// A parsed `postgres://` URL. Shown without its password.
#[derive(Clone)]
pub struct DatabaseUrl {
    // Boxed: the parsed config is large and the URL travels inside small enums.
    config: Box<Config>,
}

/// Why a `--database` value was refused.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    /// Not a `postgres://` or `postgresql://` URL.
    #[error(
        "database must be a postgres:// or postgresql:// URL (leave it unset for the embedded store)"
    )]
    Scheme,
    /// tokio-postgres could not parse it.
    #[error("database URL is invalid: {0}")]
    Invalid(String),
    /// `sslmode=require` or stronger: this build speaks plain TCP only.
    #[error("database URL asks for TLS (sslmode=require), which this build does not support")]
    TlsRequired,
}

impl FromStr for DatabaseUrl {
    type Err = DatabaseUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(DatabaseUrlError::Scheme);
        }
        // The parser's messages never quote the URL, so no password reaches a log.
        let config = Config::from_str(url).map_err(|e| DatabaseUrlError::Invalid(describe(&e)))?;
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(DatabaseUrlError::TlsRequired);
        }
        Ok(Self {
            config: Box::new(config),
        })
    }
}

impl fmt::Display for DatabaseUrl {
    /// `user@host:port/dbname`, never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = self.config.get_user() {
            write!(f, "{user}@")?;
        }
        let hosts = self.config.get_hosts();
        let ports = self.config.get_ports();
        for (i, host) in hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match host {
                Host::Tcp(name) => f.write_str(name)?,
                Host::Unix(path) => write!(f, "{}", path.display())?,
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                write!(f, ":{port}")?;
            }
        }
        if hosts.is_empty() {
            f.write_str("localhost")?;
        }
        write!(f, "/{}", self.config.get_dbname().unwrap_or(""))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

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
}

/// Adds clicks to the links' totals and daily rows, inside the caller's transaction.
async fn add_clicks(
    tx: &Transaction<'_>,
    clicks: &ClickColumns,
) -> Result<(), tokio_postgres::Error> {
    if clicks.codes.is_empty() {
        return Ok(());
    }
    // Lock the links in code order first: two batches over overlapping codes then queue on
    // their first common row instead of deadlocking on each other's.
    let lock = tx
        .prepare_cached(
            "SELECT code FROM links WHERE code = ANY($1::TEXT[]) ORDER BY code FOR UPDATE",
        )
        .await?;
    tx.query(&lock, &[&clicks.codes]).await?;
    let totals = tx
        .prepare_cached(
            "UPDATE links AS l SET clicks = l.clicks + t.clicks, \
             bot_clicks = l.bot_clicks + t.bot_clicks \
             FROM unnest($1::TEXT[], $2::INT8[], $3::INT8[]) AS t (code, clicks, bot_clicks) \
             WHERE l.code = t.code",
        )
        .await?;
    tx.execute(
        &totals,
        &[&clicks.codes, &clicks.code_human, &clicks.code_bot],
    )
    .await?;
    // Unknown codes (deleted by hand, say) count nowhere: only days of existing links.
    let daily = tx
        .prepare_cached(
            "INSERT INTO daily_clicks (code, day, clicks, bot_clicks) \
             SELECT d.code, d.day, d.clicks, d.bot_clicks \
             FROM unnest($1::TEXT[], $2::INT4[], $3::INT8[], $4::INT8[]) \
                  AS d (code, day, clicks, bot_clicks) \
             WHERE EXISTS (SELECT 1 FROM links AS l WHERE l.code = d.code) \
             ON CONFLICT (code, day) DO UPDATE SET \
             clicks = daily_clicks.clicks + excluded.clicks, \
             bot_clicks = daily_clicks.bot_clicks + excluded.bot_clicks",
        )
        .await?;
    tx.execute(
        &daily,
        &[
            &clicks.day_codes,
            &clicks.days,
            &clicks.day_human,
            &clicks.day_bot,
        ],
    )
    .await?;
    add_people(tx, clicks).await
}

/// Merges the people of each (code, day) into its row, which the upsert before has locked.
async fn add_people(
    tx: &Transaction<'_>,
    clicks: &ClickColumns,
) -> Result<(), tokio_postgres::Error> {
    if clicks.people.is_empty() {
        return Ok(());
    }
    let (codes, days): (Vec<&str>, Vec<i32>) = clicks
        .people
        .keys()
        .map(|(code, day)| (code.as_str(), *day))
        .unzip();
    let read = tx
        .prepare_cached(
            "SELECT d.code, d.day, d.visitors, d.tops FROM daily_clicks AS d \
             JOIN unnest($1::TEXT[], $2::INT4[]) AS k (code, day) \
             ON d.code = k.code AND d.day = k.day",
        )
        .await?;
    let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in tx.query(&read, &[&codes, &days]).await? {
        let key: (String, i32) = (row.try_get(0)?, row.try_get(1)?);
        let Some(delta) = clicks.people.get(&key) else {
            continue;
        };
        let stored = stored_people(row.try_get(2)?, row.try_get(3)?);
        let people = merged_people(stored, delta);
        columns.0.push(key.0);
        columns.1.push(key.1);
        columns.2.push(people.visitors.to_bytes());
        columns.3.push(people.tops_to_text());
    }
    let write = tx
        .prepare_cached(
            "UPDATE daily_clicks AS d SET visitors = t.visitors, tops = t.tops \
             FROM unnest($1::TEXT[], $2::INT4[], $3::BYTEA[], $4::TEXT[]) \
                  AS t (code, day, visitors, tops) \
             WHERE d.code = t.code AND d.day = t.day",
        )
        .await?;
    tx.execute(&write, &[&columns.0, &columns.1, &columns.2, &columns.3])
        .await?;
    Ok(())
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

async fn apply_clicks_once(
    client: &mut Object,
    clicks: &ClickColumns,
    bounded: bool,
) -> Result<(), tokio_postgres::Error> {
    let tx = background_transaction(client, bounded).await?;
    add_clicks(&tx, clicks).await?;
    tx.commit().await
}

/// Marks the batches applied and adds the clicks of those that were not, in one transaction;
/// returns how many were new. `batches` are distinct by id and in id order, so that racing
/// callers claim ids in one order.
async fn apply_batches_once(
    client: &mut Object,
    batches: &[&ClickBatch],
    today: i32,
    bounded: bool,
) -> Result<usize, tokio_postgres::Error> {
    let tx = background_transaction(client, bounded).await?;
    let ids: Vec<&str> = batches.iter().map(|b| b.id.as_str()).collect();
    // A batch id claimed by a concurrent transaction makes this one wait for its outcome:
    // committed → not new here; rolled back → ours to apply.
    let mark = tx
        .prepare_cached(
            "INSERT INTO applied_click_batches (id, day) \
             SELECT id, $2 FROM unnest($1::TEXT[]) AS b (id) \
             ON CONFLICT (id) DO NOTHING RETURNING id",
        )
        .await?;
    let fresh: HashSet<String> = tx
        .query(&mark, &[&ids, &today])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let clicks = ClickColumns::new(
        batches
            .iter()
            .filter(|b| fresh.contains(&b.id))
            .flat_map(|b| &b.deltas),
    );
    add_clicks(&tx, &clicks).await?;
    tx.commit().await?;
    Ok(fresh.len())
}

/// Clicks as column arrays: totals per code, counts per (code, day), each without duplicates
/// (an upsert may not touch one row twice) and in key order.
#[derive(Debug, Default)]
struct ClickColumns {
    codes: Vec<String>,
    code_human: Vec<i64>,
    code_bot: Vec<i64>,
    day_codes: Vec<String>,
    days: Vec<i32>,
    day_human: Vec<i64>,
    day_bot: Vec<i64>,
    /// People per (code, day), where any clicked.
    people: BTreeMap<(String, i32), People>,
}

impl ClickColumns {
    fn new<'a>(deltas: impl IntoIterator<Item = &'a ClickDelta>) -> Self {
        let mut per_day: BTreeMap<(&str, Day), (u64, u64)> = BTreeMap::new();
        let mut batch = Self::default();
        for d in deltas {
            let entry = per_day.entry((d.code.as_str(), d.day)).or_default();
            entry.0 = entry.0.saturating_add(d.human);
            entry.1 = entry.1.saturating_add(d.bot);
            if let Some(people) = d.people() {
                batch
                    .people
                    .entry((d.code.clone(), d.day.number()))
                    .or_default()
                    .merge(people);
            }
        }
        for ((code, day), (human, bot)) in per_day {
            if batch.codes.last().map(String::as_str) == Some(code) {
                if let (Some(h), Some(b)) = (batch.code_human.last_mut(), batch.code_bot.last_mut())
                {
                    *h = h.saturating_add(to_i64(human));
                    *b = b.saturating_add(to_i64(bot));
                }
            } else {
                batch.codes.push(code.to_owned());
                batch.code_human.push(to_i64(human));
                batch.code_bot.push(to_i64(bot));
            }
            batch.day_codes.push(code.to_owned());
            batch.days.push(day.number());
            batch.day_human.push(to_i64(human));
            batch.day_bot.push(to_i64(bot));
        }
        batch
    }
}

/// One line for a driver error: its kind, then the server's message or the I/O cause.
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out.replace('\n', " ")
}

fn describe_pool(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => describe(e),
        PoolError::Timeout(TimeoutType::Create) => {
            "no answer within the connect timeout (set connect_timeout=SECONDS in the URL)".into()
        }
        PoolError::Timeout(TimeoutType::Wait) => {
            format!("every pooled connection stayed busy for {WAIT_TIMEOUT:?}")
        }
        PoolError::Timeout(TimeoutType::Recycle) => "a pooled connection stopped answering".into(),
        other => other.to_string(),
    }
}

/// Whether a failed statement means the database is out of reach (503) rather than that it
/// refused the statement (500).
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        // 08: connection exception; 57P0x: shutting down or starting; 53300: too many
        // connections. A lost serialization race or deadlock (after our own retries) is
        // also "try again shortly" rather than a fault.
        return code.starts_with("08")
            || code.starts_with("57P0")
            || code == SqlState::TOO_MANY_CONNECTIONS.code()
            // 57014: our statement timeout (or an operator) cancelled it; the store is slow.
            || code == SqlState::QUERY_CANCELED.code()
            || is_retryable(e);
    }
    // No server error: unavailable only if the socket itself failed.
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
    )
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

fn classify(e: tokio_postgres::Error) -> StoreError {
    let message = describe(&e);
    if is_unavailable(&e) {
        StoreError::Unavailable(message.into())
    } else {
        StoreError::Backend(message.into())
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
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

/// The link locked for the rest of `tx`.
async fn lock_link(
    tx: &Transaction<'_>,
    code: &str,
) -> Result<Option<Link>, tokio_postgres::Error> {
    let select = tx
        .prepare_cached(&format!(
            "SELECT {LINK_COLUMNS} FROM links WHERE code = $1 FOR UPDATE"
        ))
        .await?;
    tx.query_opt(&select, &[&code])
        .await?
        .as_ref()
        .map(link_from_row)
        .transpose()
}

fn placeholder(i: usize) -> String {
    format!("${i}")
}

/// Appends one row to the audit trail inside `tx`.
async fn insert_audit(tx: &Transaction<'_>, r: &AuditRecord) -> Result<(), tokio_postgres::Error> {
    let stmt = tx
        .prepare_cached(&format!(
            "INSERT INTO audit ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .await?;
    tx.execute(
        &stmt,
        &[
            &r.at,
            &r.actor,
            &r.ip,
            &r.user_agent,
            &r.action.as_str(),
            &r.code,
            &r.old_url,
            &r.new_url,
            &r.detail,
        ],
    )
    .await
    .map(drop)
}

/// Appends the change note `(code, version)` of `link` inside `tx`, at the next position of
/// the sequence: the counter row's lock, held until the commit, orders notes by commit.
/// Creates and imports write theirs unnumbered instead (`import::insert_created`,
/// [`number_pending`]).
async fn append_change_note(
    tx: &Transaction<'_>,
    link: &Link,
    at: UnixSeconds,
) -> Result<(), tokio_postgres::Error> {
    let counter = tx
        .prepare_cached("UPDATE change_counter SET seq = seq + 1 WHERE id = 0 RETURNING seq")
        .await?;
    let seq: i64 = tx.query_one(&counter, &[]).await?.try_get(0)?;
    let note = tx
        .prepare_cached("INSERT INTO link_changes (seq, code, version, at) VALUES ($1, $2, $3, $4)")
        .await?;
    tx.execute(&note, &[&seq, &link.code, &to_i64(link.version), &at])
        .await
        .map(drop)
}

/// Most notes one [`number_pending`] transaction numbers.
const NUMBERED_AT_ONCE: i64 = 10_000;

/// Gives up to [`NUMBERED_AT_ONCE`] notes waiting for a number (negative positions, the
/// oldest first) the next positions of the sequence; returns how many.
///
/// Why a poller never skips a note: a note gets a position only in a transaction holding
/// the `change_counter` row until its commit (a change's own, or this one), above every
/// position an earlier holder committed; so positions become visible in increasing order,
/// on the primary and (replaying commits in order) on replicas. This transaction reads the
/// waiting notes in a statement begun after it holds the row (read committed: a snapshot
/// per statement), so it sees every one committed before, and none numbered already.
async fn number_pending(client: &mut Object, bounded: bool) -> Result<u64, tokio_postgres::Error> {
    let tx = background_transaction(client, bounded).await?;
    // Most polls find none: a look first, without the lock.
    let waiting = tx
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM link_changes WHERE seq < 0)")
        .await?;
    if !tx.query_one(&waiting, &[]).await?.try_get::<_, bool>(0)? {
        tx.commit().await?;
        return Ok(0);
    }
    let lock = tx
        .prepare_cached("SELECT seq FROM change_counter WHERE id = 0 FOR UPDATE")
        .await?;
    let last: i64 = tx.query_one(&lock, &[]).await?.try_get(0)?;
    // One statement for the notes and the counter: changes (request-path deadlines) wait for
    // the row while this holds it.
    let number = tx
        .prepare_cached(
            "WITH waiting AS (SELECT seq, row_number() OVER (ORDER BY seq DESC) AS n \
             FROM link_changes WHERE seq < 0 ORDER BY seq DESC LIMIT $2), \
             numbered AS (UPDATE link_changes c SET seq = $1 + w.n FROM waiting w \
             WHERE c.seq = w.seq RETURNING 1) \
             UPDATE change_counter SET seq = $1 + (SELECT count(*) FROM numbered) WHERE id = 0 \
             RETURNING seq - $1",
        )
        .await?;
    let n: i64 = tx
        .query_one(&number, &[&last, &NUMBERED_AT_ONCE])
        .await?
        .try_get(0)?;
    tx.commit().await?;
    Ok(to_u64(n))
}

/// Writes a link's new state, its change note and its audit row inside `tx`, the link's
/// row locked.
async fn write_change(
    tx: &Transaction<'_>,
    before: &Link,
    after: &Link,
    audit: &AuditRecord,
) -> Result<(), tokio_postgres::Error> {
    let update = tx.prepare_cached(&update_state_sql(placeholder)).await?;
    let d = after.disabled.as_ref();
    tx.execute(
        &update,
        &[
            &after.code,
            &after.long_url,
            &after.expires_at,
            &to_i64(after.version),
            &d.map(|d| d.at),
            &d.map(|d| d.reason.as_str()),
            &d.map(|d| d.by.as_str()),
            &d.map(|d| d.by_kind.as_str()),
            &after.deleted_at,
        ],
    )
    .await?;
    append_change_note(tx, after, audit.at).await?;
    if before.disabled.is_some() && after.disabled.is_none() {
        // An enable: reports made before it no longer count towards the next auto-disable.
        let uncount = tx
            .prepare_cached("UPDATE reports SET counts = FALSE WHERE code = $1 AND counts")
            .await?;
        tx.execute(&uncount, &[&after.code]).await?;
    }
    insert_audit(tx, audit).await
}

/// Files a report and applies its automatic disable in one transaction, the link locked so
/// that concurrent reports count each other.
async fn file_report(
    client: &mut Object,
    report: &NewReport,
    origin: &Origin,
    auto: Option<AutoDisable>,
) -> Result<ReportOutcome, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let Some(link) = lock_link(&tx, &report.code).await? else {
        return Ok(ReportOutcome::NotFound);
    };
    let insert = tx
        .prepare_cached(
            "INSERT INTO reports (code, at, ip, category, comment, counts) \
             VALUES ($1, $2, $3, $4, $5, TRUE) RETURNING id",
        )
        .await?;
    let id: i64 = tx
        .query_one(
            &insert,
            &[
                &report.code,
                &report.at,
                &report.ip,
                &report.category.as_str(),
                &report.comment,
            ],
        )
        .await?
        .try_get(0)?;
    insert_audit(&tx, &AuditRecord::reported(&link, report, origin)).await?;
    let mut disabled = None;
    if let Some(auto) = auto {
        let count = tx
            .prepare_cached(
                "SELECT COUNT(DISTINCT ip) FROM reports WHERE code = $1 AND counts AND at > $2",
            )
            .await?;
        let reporters: i64 = tx
            .query_one(
                &count,
                &[&report.code, &(report.at - AUTO_DISABLE_WINDOW_SECONDS)],
            )
            .await?
            .try_get(0)?;
        let reporters = to_u64(reporters);
        if auto.disables(&link, reporters, report.at) {
            let change = LinkChange::Disable {
                reason: auto.reason(reporters),
            };
            if let Ok(Some(after)) =
                link.apply(&change, &Actor::system(AUTO_REPORTS_ACTOR), report.at)
            {
                let system = Origin::system(AUTO_REPORTS_ACTOR);
                let audit = AuditRecord::changed(&link, &after, &change, &system, report.at);
                write_change(&tx, &link, &after, &audit).await?;
                disabled = Some(Box::new(after));
            }
        }
    }
    tx.commit().await?;
    Ok(ReportOutcome::Filed { id, disabled })
}

/// Applies `change` under the rule in one transaction: the link row locked, its new state,
/// the change note and the audit row.
async fn change_once(
    client: &mut Object,
    code: &str,
    change: &LinkChange,
    origin: &Origin,
    now: UnixSeconds,
) -> Result<ChangeOutcome, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let Some(before) = lock_link(&tx, code).await? else {
        return Ok(ChangeOutcome::Refused(Refusal::NotFound));
    };
    let after = match before.apply(change, &origin.actor, now) {
        Err(refusal) => return Ok(ChangeOutcome::Refused(refusal)),
        Ok(None) => return Ok(ChangeOutcome::Unchanged(before)),
        Ok(Some(after)) => after,
    };
    let audit = AuditRecord::changed(&before, &after, change, origin, now);
    write_change(&tx, &before, &after, &audit).await?;
    tx.commit().await?;
    Ok(ChangeOutcome::Changed { before, after })
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
            .prepare_cached(&format!("SELECT {LINK_COLUMNS} FROM links WHERE code = $1"))
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
        let target = |r: &Row| -> Result<RedirectTarget, tokio_postgres::Error> {
            Ok(RedirectTarget {
                long_url: r.try_get(0)?,
                expires_at: r.try_get(1)?,
                version: to_u64(r.try_get(2)?),
                disabled: r.try_get(3)?,
                deleted: r.try_get(4)?,
            })
        };
        client
            .query_opt(&stmt, &[&code])
            .await
            .and_then(|row| row.as_ref().map(target).transpose())
            .map_err(classify)
    }

    async fn list_links(&self, query: &LinkQuery) -> Result<Vec<Link>, StoreError> {
        let (sql, values) = link_page_sql(query, "links", placeholder, "strpos");
        let rows = self.query_built(&sql, &values).await?;
        rows.iter()
            .map(link_from_row)
            .collect::<Result<_, _>>()
            .map_err(classify)
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
                 (SELECT *, sum(COALESCE(cardinality(codes), 1)) OVER (ORDER BY seq) AS upto \
                 FROM (SELECT * FROM link_changes WHERE seq > $1 ORDER BY seq LIMIT $2) n) w \
                 WHERE upto - COALESCE(cardinality(codes), 1) < $2 ORDER BY seq",
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
        let (sql, values) = audit_query_sql(query, placeholder);
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
                "SELECT day, clicks, bot_clicks, visitors, tops FROM daily_clicks \
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

#[async_trait]
impl ClickSink for PgStore {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        if deltas.is_empty() {
            return Ok(());
        }
        let clicks = ClickColumns::new(&deltas);
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match apply_clicks_once(&mut client, &clicks, self.bounded).await {
                Ok(()) => return Ok(()),
                // The transaction rolled back whole, so trying again cannot count twice.
                Err(e) if is_retryable(&e) && attempt < CLICK_ATTEMPTS => attempt += 1,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        // The first of several batches with one id counts, as if they had come one by one.
        let mut distinct: BTreeMap<&str, &ClickBatch> = BTreeMap::new();
        for batch in batches {
            distinct.entry(batch.id.as_str()).or_insert(batch);
        }
        if distinct.is_empty() {
            return Ok(0);
        }
        let batches: Vec<&ClickBatch> = distinct.into_values().collect();
        let today = Day::from_unix(crate::now()).number();
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match apply_batches_once(&mut client, &batches, today, self.bounded).await {
                Ok(fresh) => return Ok(fresh),
                Err(e) if is_retryable(&e) && attempt < CLICK_ATTEMPTS => attempt += 1,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = background_transaction(&mut client, self.bounded)
            .await
            .map_err(classify)?;
        tx.execute(
            "DELETE FROM applied_click_batches WHERE day < $1",
            &[&day.number()],
        )
        .await
        .map_err(classify)?;
        let pruned = tx
            .execute("DELETE FROM daily_clicks WHERE day < $1", &[&day.number()])
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(pruned)
    }
}
