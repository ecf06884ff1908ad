//! Stores of links and clicks. The embedded SQLite store is the default; `--database` picks
//! PostgreSQL.

pub(crate) mod guarded;
pub mod postgres;
pub(crate) mod replicas;
pub mod sqlite;

use crate::config::StoreConfig;
use shortener_core::audit::{AuditAction, AuditQuery, AuditRecord, AuditRow};
use shortener_core::day::UnixSeconds;
use shortener_core::link::{ActorKind, Disable, LinkStatus};
use shortener_core::listing::LinkQuery;
use shortener_core::people::People;
use shortener_core::report::{Category, NewReport, Report, Resolution};
use shortener_core::store::{ClickSink, LinkStore, StoreError};
use shortener_core::token::{TokenHash, TokenId};
use std::sync::Arc;
use std::time::Duration;

/// The `links` columns in the order both stores' row readers expect.
const LINK_COLUMNS: &str = "code, long_url, owner, custom_alias, created_at, expires_at, \
                            disabled_at, clicks, bot_clicks, created_ip, version, \
                            disabled_reason, disabled_by, disabled_by_kind, deleted_at, \
                            owner_admin";
/// Where a link page's row holds `seq`: after [`LINK_COLUMNS`] (see [`link_page_sql`]).
const PAGE_SEQ_INDEX: usize = columns(LINK_COLUMNS);

/// How many columns a comma-separated list names.
const fn columns(list: &str) -> usize {
    let (bytes, mut i, mut n) = (list.as_bytes(), 0, 1);
    while i < bytes.len() {
        if bytes[i] == b',' {
            n += 1;
        }
        i += 1;
    }
    n
}
/// What a redirect needs of a `links` row ([`shortener_core::link::RedirectTarget`]'s
/// fields in order): no click counts, which both stores keep apart from these columns.
const TARGET_COLUMNS: &str = "long_url, expires_at, version, disabled_at IS NOT NULL, \
                              deleted_at IS NOT NULL";
/// What a change writes of a link: the columns after `code`, set from `$2` / `?2` on.
const STATE_COLUMNS: [&str; 8] = [
    "long_url",
    "expires_at",
    "version",
    "disabled_at",
    "disabled_reason",
    "disabled_by",
    "disabled_by_kind",
    "deleted_at",
];
/// Expired spent tokens each spend deletes: more than spends add, so the table shrinks
/// back to the tokens still valid.
const SPENT_PRUNED_PER_SPEND: i64 = 100;
/// The `audit` columns in the order both stores write and read them (after `id`).
const AUDIT_COLUMNS: &str = "at, actor, ip, user_agent, action, code, old_url, new_url, detail";

/// A day's stored people (`daily_clicks.visitors`, `.tops`, both NULL until a person
/// clicked). Unreadable ones are logged and read as empty rather than failing the click
/// pipeline or the analytics read for good.
fn stored_people(visitors: Option<&[u8]>, tops: Option<&str>) -> People {
    People::from_parts(visitors.unwrap_or_default(), tops.unwrap_or_default()).unwrap_or_else(|e| {
        tracing::error!(error = %e, "unreadable stored visitors of a day; starting them afresh");
        People::default()
    })
}

/// The day's people after `delta`'s are merged in, trimmed to what is stored.
fn merged_people(stored: People, delta: &People) -> People {
    let mut people = stored;
    people.merge(delta);
    people.trim();
    people
}

/// The `tokens` columns both stores read into a `TokenInfo`, in order.
const TOKEN_COLUMNS: &str = "hash, user_name, admin, name, created_at, last_used_at";

/// The public id of a stored token hash.
fn stored_token_id(hash: &[u8]) -> Result<TokenId, StoreError> {
    <[u8; 32]>::try_from(hash)
        .map(|hash| TokenHash(hash).public_id())
        .map_err(|_| StoreError::Backend("a stored token hash is not 32 bytes".into()))
}

/// `UPDATE links SET … WHERE code = <1>` for a change, with the store's placeholders.
fn update_state_sql(placeholder: fn(usize) -> String) -> String {
    let sets: Vec<String> = STATE_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| format!("{column} = {}", placeholder(i + 2)))
        .collect();
    format!(
        "UPDATE links SET {} WHERE code = {}",
        sets.join(", "),
        placeholder(1)
    )
}

/// The disable columns of a row, as read.
fn disable_from(
    at: Option<UnixSeconds>,
    reason: Option<String>,
    by: Option<String>,
    kind: Option<String>,
) -> Option<Disable> {
    at.map(|at| Disable {
        at,
        reason: reason.unwrap_or_default(),
        by: by.unwrap_or_default(),
        // Unknown kinds are treated as an admin's, the stricter case for an enable.
        by_kind: kind
            .as_deref()
            .and_then(ActorKind::parse)
            .unwrap_or(ActorKind::Admin),
    })
}

/// A report with its link's state; the columns `RawReport` reads, in order.
const REPORT_SELECT: &str = "SELECT r.id, r.code, r.at, r.ip, r.category, r.comment, \
     r.resolved_at, r.resolved_by, r.resolution, \
     l.disabled_at, l.disabled_reason, l.disabled_by, l.disabled_by_kind, l.deleted_at \
     FROM reports AS r LEFT JOIN links AS l ON l.code = r.code";

/// The report queue's page query (after `REPORT_SELECT`), with the store's placeholders for
/// the cursor (1) and the limit (2).
fn report_page_sql(open: bool, placeholder: fn(usize) -> String) -> String {
    let state = if open { "IS NULL" } else { "IS NOT NULL" };
    format!(
        "{REPORT_SELECT} WHERE r.resolved_at {state} AND r.id < {} ORDER BY r.id DESC LIMIT {}",
        placeholder(1),
        placeholder(2)
    )
}

/// A report row as read, its category still text.
#[derive(Debug)]
struct RawReport {
    id: i64,
    code: String,
    at: UnixSeconds,
    ip: String,
    category: String,
    comment: Option<String>,
    resolved_at: Option<UnixSeconds>,
    resolved_by: Option<String>,
    resolution: Option<String>,
    disabled_at: Option<UnixSeconds>,
    disabled_reason: Option<String>,
    disabled_by: Option<String>,
    disabled_by_kind: Option<String>,
    deleted_at: Option<UnixSeconds>,
}

impl RawReport {
    fn into_report(self) -> Result<Report, StoreError> {
        let category = Category::parse(&self.category).ok_or_else(|| {
            StoreError::Backend(format!("unknown report category {:?}", self.category).into())
        })?;
        Ok(Report {
            id: self.id,
            filed: NewReport {
                code: self.code,
                at: self.at,
                ip: self.ip,
                category,
                comment: self.comment,
            },
            resolution: self.resolved_at.map(|at| Resolution {
                at,
                by: self.resolved_by.unwrap_or_default(),
                text: self.resolution.unwrap_or_default(),
            }),
            link_disabled: disable_from(
                self.disabled_at,
                self.disabled_reason,
                self.disabled_by,
                self.disabled_by_kind,
            ),
            link_deleted: self.deleted_at.is_some(),
        })
    }
}

/// A bound value of an audit query.
#[derive(Debug, Clone)]
enum SqlValue {
    Text(String),
    Int(i64),
}

/// Where a store finds the `created` audit row of a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CreatedRows {
    /// Through the index of audit rows by code, like the other rows.
    ByCode,
    /// Through the link's `created_audit`: the embedded store's `audit_code` leaves the
    /// creation rows out (schema v10), which random codes made a random page write per create.
    ThroughLink,
}

/// The audit page query with only the set filters, newest first, with the store's
/// placeholders, and its values in placeholder order.
fn audit_query_sql(
    query: &AuditQuery,
    placeholder: fn(usize) -> String,
    created: CreatedRows,
) -> (String, Vec<SqlValue>) {
    let mut values = Vec::new();
    let mut filters = Vec::new();
    let mut filter = |column: &str, op: &str, value: SqlValue| {
        values.push(value);
        filters.push(format!("{column} {op} {}", placeholder(values.len())));
    };
    if let Some(code) = &query.code {
        filter("code", "=", SqlValue::Text(code.clone()));
    }
    if let Some(actor) = &query.actor {
        filter("actor", "=", SqlValue::Text(actor.clone()));
    }
    if let Some(action) = query.action {
        filter("action", "=", SqlValue::Text(action.as_str().to_owned()));
    }
    if let Some(since) = query.since {
        filter("at", ">=", SqlValue::Int(since));
    }
    if let Some(until) = query.until {
        filter("at", "<", SqlValue::Int(until));
    }
    if let Some(before) = query.before {
        filter("id", "<", SqlValue::Int(before));
    }
    values.push(SqlValue::Int(
        i64::try_from(query.limit).unwrap_or(i64::MAX),
    ));
    let limit = placeholder(values.len());
    let select = |filters: &[String]| {
        let condition = if filters.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", filters.join(" AND "))
        };
        format!("SELECT id, {AUDIT_COLUMNS} FROM audit {condition}")
    };
    let sql = match (created, query.code.is_some()) {
        (CreatedRows::ThroughLink, true) => {
            // The code's placeholder is the first; numbered placeholders may repeat. The
            // first part's `action <> 'created'` is the partial index's own condition, which
            // SQLite needs to see in the query to use the index.
            let code = placeholder(1);
            let mut indexed = filters.clone();
            indexed.push("action <> 'created'".to_owned());
            let mut creation = filters;
            creation.push(format!(
                "id = (SELECT created_audit FROM links WHERE code = {code})"
            ));
            format!(
                "{} UNION ALL {} ORDER BY id DESC LIMIT {limit}",
                select(&indexed),
                select(&creation)
            )
        }
        _ => format!("{} ORDER BY id DESC LIMIT {limit}", select(&filters)),
    };
    (sql, values)
}

/// The link page query over `from` (the store's links as read, with their creation order as
/// `seq`) with only the set filters, newest first, with the store's placeholders and substring
/// function (`instr` / `strpos`, both haystack first), and its values in placeholder order.
fn link_page_sql(
    query: &LinkQuery,
    from: &str,
    placeholder: fn(usize) -> String,
    substring_fn: &str,
) -> (String, Vec<SqlValue>) {
    let mut values = Vec::new();
    let mut filters = vec!["deleted_at IS NULL".to_owned()];
    let mut bind = |value: SqlValue| {
        values.push(value);
        placeholder(values.len())
    };
    if let Some(owner) = &query.owner {
        filters.push(format!("owner = {}", bind(SqlValue::Text(owner.clone()))));
    }
    if let Some(text) = &query.contains {
        let p = bind(SqlValue::Text(text.clone()));
        filters.push(format!(
            "({substring_fn}(code, {p}) > 0 OR {substring_fn}(long_url, {p}) > 0)"
        ));
    }
    // The same precedence as `Link::status`: disabled wins over expired.
    match query.status {
        Some(LinkStatus::Active) => filters.push(format!(
            "disabled_at IS NULL AND expires_at > {}",
            bind(SqlValue::Int(query.now))
        )),
        Some(LinkStatus::Expired) => filters.push(format!(
            "disabled_at IS NULL AND expires_at <= {}",
            bind(SqlValue::Int(query.now))
        )),
        Some(LinkStatus::Disabled) => filters.push("disabled_at IS NOT NULL".to_owned()),
        Some(LinkStatus::Deleted) => filters.push("FALSE".to_owned()),
        None => {}
    }
    if let Some(after) = query.created_after {
        filters.push(format!("created_at >= {}", bind(SqlValue::Int(after))));
    }
    if let Some(before) = query.created_before {
        filters.push(format!("created_at < {}", bind(SqlValue::Int(before))));
    }
    if let Some(cursor) = &query.after {
        let at = bind(SqlValue::Int(cursor.created_at));
        let seq = bind(SqlValue::Int(cursor.seq));
        filters.push(format!(
            "(created_at < {at} OR (created_at = {at} AND seq < {seq}))"
        ));
    }
    let limit = bind(SqlValue::Int(
        i64::try_from(query.limit).unwrap_or(i64::MAX),
    ));
    // `seq` follows the link's columns: the page's rows are read by `link_from_row`, then it.
    let sql = format!(
        "SELECT {LINK_COLUMNS}, seq FROM {from} WHERE {} ORDER BY created_at DESC, seq DESC LIMIT {limit}",
        filters.join(" AND ")
    );
    (sql, values)
}

/// An audit row as read, its action still text.
#[derive(Debug)]
struct RawAudit {
    id: i64,
    at: UnixSeconds,
    actor: String,
    ip: Option<String>,
    user_agent: Option<String>,
    action: String,
    code: Option<String>,
    old_url: Option<String>,
    new_url: Option<String>,
    detail: Option<String>,
}

impl RawAudit {
    fn into_row(self) -> Result<AuditRow, StoreError> {
        let action = AuditAction::parse(&self.action).ok_or_else(|| {
            StoreError::Backend(format!("unknown audit action {:?}", self.action).into())
        })?;
        Ok(AuditRow {
            id: self.id,
            record: AuditRecord {
                at: self.at,
                actor: self.actor,
                ip: self.ip,
                user_agent: self.user_agent,
                action,
                code: self.code,
                old_url: self.old_url,
                new_url: self.new_url,
                detail: self.detail,
            },
        })
    }
}
/// Everything the service needs from one backend: links, tokens, ids and clicks.
pub trait Store: LinkStore + ClickSink + std::fmt::Debug {}

impl<T: LinkStore + ClickSink + std::fmt::Debug> Store for T {}

/// Why the configured store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The embedded store.
    #[error(transparent)]
    Embedded(#[from] StoreError),
    /// PostgreSQL: unreachable, or its schema is not this binary's.
    #[error(transparent)]
    Postgres(#[from] postgres::OpenError),
}

/// Opens the configured store, ready to serve: the embedded one brings its schema up to date,
/// PostgreSQL's must already be current (`shortener migrate`). `statement_timeout` bounds
/// PostgreSQL's statements on the server (the request path's deadline).
pub async fn open(
    config: &StoreConfig,
    statement_timeout: Option<Duration>,
) -> Result<Arc<dyn Store>, OpenError> {
    Ok(match config {
        StoreConfig::Embedded { data_dir } => Arc::new(sqlite::SqliteStore::open(data_dir)?),
        StoreConfig::Postgres { url, pool_size } => {
            Arc::new(postgres::PgStore::open_bounded(url, *pool_size, statement_timeout).await?)
        }
    })
}

/// Opens the configured store for `shortener import`: as [`open`], with the embedded
/// store's writer keeping a large page cache for bulk inserts.
pub async fn open_for_import(config: &StoreConfig) -> Result<Arc<dyn Store>, OpenError> {
    Ok(match config {
        StoreConfig::Embedded { data_dir } => {
            Arc::new(sqlite::SqliteStore::open_for_import(data_dir)?)
        }
        StoreConfig::Postgres { .. } => open(config, None).await?,
    })
}
