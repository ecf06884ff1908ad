//! Multi-row inserts: many rows per statement execution, so that the per-statement costs —
//! binding setup, the statement's reset and halt, AUTOINCREMENT's counter read and write — are
//! paid once per chunk instead of once per row.

use super::{AUDIT_COLUMNS, LINK_COLUMNS, to_i64};
use rusqlite::types::{Null, ToSqlOutput};
use rusqlite::{CachedStatement, Connection, Statement, params_from_iter};
use shortener_core::audit::{AuditAction, AuditRecord, Origin};
use shortener_core::day::UnixSeconds;
use shortener_core::link::Link;
use std::sync::LazyLock;

/// Most rows per statement. Chunks are powers of two up to this, so a connection caches
/// at most seven statements per table whatever the batch sizes (its statement cache holds 64).
pub(super) const MAX_ROWS: usize = 64;

/// Splits `rows` into chunks whose lengths are powers of two, largest first.
pub(super) fn chunks<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if rows.is_empty() {
            return None;
        }
        let n = MAX_ROWS.min(1 << rows.len().ilog2());
        let (chunk, rest) = rows.split_at(n);
        rows = rest;
        Some(chunk)
    })
}

/// One value of a row in a multi-row insert.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value {
    /// Bound for each row.
    Row,
    /// Bound once per statement, after every row's values (numbered from 1): the same for
    /// every row, such as the actor of a batch's audit rows.
    Shared(usize),
    /// SQL, the same for every row (a literal).
    Sql(&'static str),
}

/// The statements of one multi-row insert, one per chunk length, written once (a create's
/// audit row would otherwise format its SQL every time).
pub(super) struct MultiInsert {
    sql: [String; MAX_ROWS.ilog2() as usize + 1],
}

impl MultiInsert {
    pub(super) fn new(table: &str, columns: &str, row: &[Value], tail: &str) -> Self {
        Self {
            sql: std::array::from_fn(|i| insert_sql(table, columns, row, 1 << i, tail)),
        }
    }

    /// Runs `run` on each chunk of `rows` (see [`chunks`]) with the statement of its length.
    /// The statement of full chunks is taken from the connection's cache once per call, not
    /// per chunk: putting one back clears each of its thousand-odd bindings.
    fn for_chunks<'r, T>(
        &self,
        c: &Connection,
        rows: &'r [T],
        mut run: impl FnMut(&mut Statement<'_>, &'r [T]) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        let mut full: Option<CachedStatement<'_>> = None;
        for chunk in chunks(rows) {
            if chunk.len() == MAX_ROWS {
                let statement = match &mut full {
                    Some(statement) => statement,
                    None => full.insert(c.prepare_cached(self.sql(MAX_ROWS))?),
                };
                run(statement, chunk)?;
            } else {
                run(&mut *c.prepare_cached(self.sql(chunk.len()))?, chunk)?;
            }
        }
        Ok(())
    }

    /// Inserts `rows` (inside the caller's transaction), in slice order: `row` gives the
    /// values of one, `shared` follows them once per statement.
    fn execute<'a, T>(
        &self,
        c: &Connection,
        rows: &'a [T],
        shared: &[ToSqlOutput<'a>],
        mut row: impl FnMut(&'a T, &mut Vec<ToSqlOutput<'a>>),
    ) -> rusqlite::Result<()> {
        let mut values = Vec::new();
        self.for_chunks(c, rows, |statement, chunk| {
            values.clear();
            for r in chunk {
                row(r, &mut values);
            }
            values.extend_from_slice(shared);
            statement.execute(params_from_iter(&values)).map(drop)
        })
    }

    /// The statement for a chunk of `rows` rows (a power of two, see [`chunks`]).
    fn sql(&self, rows: usize) -> &str {
        &self.sql[rows.ilog2() as usize]
    }
}

static NOTES: LazyLock<MultiInsert> = LazyLock::new(|| {
    MultiInsert::new(
        "link_changes",
        "seq, code, version, at",
        &[Value::Row, Value::Row, Value::Row, Value::Shared(1)],
        "",
    )
});
static AUDIT: LazyLock<MultiInsert> =
    LazyLock::new(|| MultiInsert::new("audit", AUDIT_COLUMNS, &[Value::Row; 9], ""));
/// Audit rows of creations take the ids their links name (`created_audit`, [`next_audit_id`]).
static CREATION_COLUMNS: LazyLock<String> = LazyLock::new(|| format!("id, {AUDIT_COLUMNS}"));
/// Rows of `audit` that say a link was created, each by its own origin.
static CREATES_AUDIT: LazyLock<MultiInsert> = LazyLock::new(|| {
    let (row, null) = (Value::Row, Value::Sql("NULL"));
    MultiInsert::new(
        "audit",
        &CREATION_COLUMNS,
        &[
            row,
            row,
            row,
            row,
            row,
            Value::Shared(1),
            row,
            null,
            row,
            null,
        ],
        "",
    )
});
/// Rows of `audit` that say one origin created a link.
static CREATED_AUDIT: LazyLock<MultiInsert> = LazyLock::new(|| {
    MultiInsert::new(
        "audit",
        &CREATION_COLUMNS,
        &[
            Value::Row,
            Value::Row,
            Value::Shared(1),
            Value::Shared(2),
            Value::Shared(3),
            Value::Shared(4),
            Value::Row,
            Value::Sql("NULL"),
            Value::Row,
            Value::Sql("NULL"),
        ],
        "",
    )
});
/// A link's columns as inserted: the store's, then the id of its creation's audit row.
static INSERTED_LINK_COLUMNS: LazyLock<String> =
    LazyLock::new(|| format!("{LINK_COLUMNS}, created_audit"));
static LINKS: LazyLock<MultiInsert> =
    LazyLock::new(|| MultiInsert::new("links", &INSERTED_LINK_COLUMNS, &[Value::Row; 17], ""));
/// Links as created: version 1, no clicks, neither disabled nor deleted (see [`as_created`]).
static NEW_LINKS: LazyLock<MultiInsert> = LazyLock::new(|| {
    let (row, null) = (Value::Row, Value::Sql("NULL"));
    MultiInsert::new(
        "links",
        &INSERTED_LINK_COLUMNS,
        &[
            row,
            row,
            row,
            row,
            row,
            row,
            null,
            Value::Sql("0"),
            Value::Sql("0"),
            row,
            Value::Sql("1"),
            null,
            null,
            null,
            null,
            row,
            row,
        ],
        "",
    )
});

/// `INSERT OR FAIL INTO {table} ({columns}) VALUES (…), …` for `rows` rows of `row`, then
/// `tail`. Parameters are numbered: each row's own, then the shared ones.
///
/// `OR FAIL`, not the default `ABORT`: an aborting multi-row statement inside a transaction
/// first copies every page it changes into a statement journal (a temporary file once past
/// 64 KiB), to undo itself alone. Its callers' transactions are rolled back whole on any
/// other error, so that undo is never needed; a link whose code is held stops the statement
/// with the rows before it kept (see [`insert_in_code_order`]).
fn insert_sql(table: &str, columns: &str, row: &[Value], rows: usize, tail: &str) -> String {
    let per_row = row.iter().filter(|v| matches!(v, Value::Row)).count();
    let mut next = 0;
    let values: Vec<String> = (0..rows)
        .map(|_| {
            let values: Vec<String> = row
                .iter()
                .map(|v| match v {
                    Value::Row => {
                        next += 1;
                        format!("?{next}")
                    }
                    Value::Shared(n) => format!("?{}", per_row * rows + n),
                    Value::Sql(sql) => (*sql).to_owned(),
                })
                .collect();
            format!("({})", values.join(", "))
        })
        .collect();
    format!(
        "INSERT OR FAIL INTO {table} ({columns}) VALUES {} {tail}",
        values.join(", ")
    )
}

/// `None` as SQL's NULL.
fn nullable<'a, T: Into<ToSqlOutput<'a>>>(value: Option<T>) -> ToSqlOutput<'a> {
    value.map_or(ToSqlOutput::from(Null), Into::into)
}

/// The id the next audit row takes (inside the caller's transaction, which holds the write
/// lock): AUTOINCREMENT's counter, which explicit ids move up too.
pub(super) fn next_audit_id(c: &Connection) -> rusqlite::Result<i64> {
    c.prepare_cached(
        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'audit'), 0) + 1",
    )?
    .query_row([], |r| r.get(0))
}

/// Inserts the links whose codes are free (inside the caller's transaction); see
/// [`insert_in_code_order`]. The link at slice index `i` names `first_audit + i` as its
/// creation's audit row, which the caller then writes under that id if it was stored. Links
/// all as created (what creates and import batches hold) go in a statement that binds half
/// the values: binding was a tenth of a create's writer instructions.
pub(super) fn insert_links(
    c: &Connection,
    links: &[&Link],
    first_audit: i64,
) -> rusqlite::Result<Vec<bool>> {
    if links.iter().all(|l| as_created(l)) {
        return insert_in_code_order(c, links, first_audit, &NEW_LINKS, |l, row| {
            row.extend(leading_values(l));
            row.extend([
                nullable(l.created_ip.as_deref()),
                ToSqlOutput::from(l.owner_admin),
            ]);
        });
    }
    insert_in_code_order(c, links, first_audit, &LINKS, |l, row| {
        let d = l.disabled.as_ref();
        row.extend(leading_values(l));
        row.extend([
            nullable(d.map(|d| d.at)),
            ToSqlOutput::from(to_i64(l.clicks)),
            ToSqlOutput::from(to_i64(l.bot_clicks)),
            nullable(l.created_ip.as_deref()),
            ToSqlOutput::from(to_i64(l.version)),
            nullable(d.map(|d| d.reason.as_str())),
            nullable(d.map(|d| d.by.as_str())),
            nullable(d.map(|d| d.by_kind.as_str())),
            nullable(l.deleted_at),
            ToSqlOutput::from(l.owner_admin),
        ]);
    })
}

/// Whether `l` holds what [`NEW_LINKS`] writes as SQL literals.
fn as_created(l: &Link) -> bool {
    l.version == 1
        && l.clicks == 0
        && l.bot_clicks == 0
        && l.disabled.is_none()
        && l.deleted_at.is_none()
}

/// A link's first six columns (`code` to `expires_at`).
fn leading_values(l: &Link) -> [ToSqlOutput<'_>; 6] {
    [
        ToSqlOutput::from(l.code.as_str()),
        ToSqlOutput::from(l.long_url.as_str()),
        nullable(l.owner.as_deref()),
        ToSqlOutput::from(l.custom_alias),
        ToSqlOutput::from(l.created_at),
        ToSqlOutput::from(l.expires_at),
    ]
}

/// Inserts the links whose codes are free (inside the caller's transaction) through
/// `insert`, whose rows `row` gives the values of, in code order: each insert then lands
/// on the same or the next B-tree leaf as the one before. Each row ends with its
/// `created_audit`, `first_audit` + its slice index. Says of each link, in slice order,
/// whether it was stored; of links sharing a code, the first is.
///
/// A statement stops at the first row whose code is held (`OR FAIL` keeps the rows before
/// it, which are as many as the statement changed); the rows after it go in the next one.
/// So a taken code costs one more statement, and the usual case, none taken, needs no
/// `RETURNING`, whose ephemeral tables cost a create 9 % of the writer's instructions.
fn insert_in_code_order<'a>(
    c: &Connection,
    links: &[&'a Link],
    first_audit: i64,
    insert: &MultiInsert,
    row: impl Fn(&'a Link, &mut Vec<ToSqlOutput<'a>>),
) -> rusqlite::Result<Vec<bool>> {
    let mut order: Vec<usize> = (0..links.len()).collect();
    // Stable: among links sharing a code, the first in the slice is inserted first.
    order.sort_by(|&a, &b| links[a].code.cmp(&links[b].code));
    let mut stored = vec![false; links.len()];
    let mut values = Vec::new();
    let mut rest = &order[..];
    while !rest.is_empty() {
        // Rows of `rest` decided: stored, or (the last one, after a refusal) taken.
        let mut decided = 0;
        let inserted = insert.for_chunks(c, rest, |statement, chunk| {
            values.clear();
            for &i in chunk {
                row(links[i], &mut values);
                values.push(ToSqlOutput::from(first_audit + i as i64));
            }
            let result = statement.execute(params_from_iter(&values));
            let changed = match &result {
                Ok(_) => chunk.len(),
                Err(e) if code_taken(e) => usize::try_from(c.changes()).unwrap_or(0),
                Err(_) => 0,
            };
            for &i in &chunk[..changed.min(chunk.len())] {
                stored[i] = true;
            }
            decided += changed + usize::from(result.is_err());
            result.map(drop)
        });
        match inserted {
            Ok(()) => break,
            Err(e) if code_taken(&e) => rest = rest.get(decided..).unwrap_or_default(),
            Err(e) => return Err(e),
        }
    }
    Ok(stored)
}

/// Whether `e` is an insert refused because its code is held.
fn code_taken(e: &rusqlite::Error) -> bool {
    e.sqlite_error()
        .is_some_and(|e| e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

/// Appends a change note `(code, version)` per link (inside the caller's transaction),
/// numbered next in the change sequence in slice order. One counter update per call: the
/// counter row serialises changers, so notes are numbered in commit order.
pub(super) fn append_change_notes(
    c: &Connection,
    links: &[&Link],
    at: UnixSeconds,
) -> rusqlite::Result<()> {
    if links.is_empty() {
        return Ok(());
    }
    let n = links.len() as i64;
    // Read, then written: every write runs in the writer's `BEGIN IMMEDIATE` transaction,
    // so no other writer moves the counter in between; `UPDATE … RETURNING` would build an
    // ephemeral table for its one row.
    let mut seq: i64 = c
        .prepare_cached("SELECT seq FROM change_counter")?
        .query_row([], |r| r.get(0))?;
    c.prepare_cached("UPDATE change_counter SET seq = ?1")?
        .execute([seq + n])?;
    NOTES.execute(c, links, &[ToSqlOutput::from(at)], |l, row| {
        seq += 1;
        row.extend([
            ToSqlOutput::from(seq),
            ToSqlOutput::from(l.code.as_str()),
            ToSqlOutput::from(to_i64(l.version)),
        ]);
    })
}

/// Notes the links a multi-row insert stored (`stored` as [`insert_links`] returns it): a
/// create or import, announced like every change, so that processes holding a code as
/// unknown forget that (their negative entries may then live long).
pub(super) fn note_stored(
    c: &Connection,
    links: &[&Link],
    stored: &[bool],
    at: UnixSeconds,
) -> rusqlite::Result<()> {
    let stored: Vec<&Link> = stored_with_audit_ids(links, stored, 0)
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    append_change_notes(c, &stored, at)
}

/// The items (a link each, in [`insert_links`]'s slice order) that `stored`, as it returns
/// it, says were stored, each with the id of its creation's audit row: `first_audit` + its
/// slice index (ids of refused links go unused).
pub(super) fn stored_with_audit_ids<T: Copy>(
    items: &[T],
    stored: &[bool],
    first_audit: i64,
) -> Vec<(i64, T)> {
    items
        .iter()
        .zip(stored)
        .zip(first_audit..)
        .filter(|((_, stored), _)| **stored)
        .map(|((item, _), id)| (id, *item))
        .collect()
}

/// Appends the audit rows of creates (inside the caller's transaction), each under the id
/// its link names (see [`insert_links`]), ascending: the action is bound once per statement,
/// and no `old_url` or `detail` is written (a creation has neither).
pub(super) fn insert_creation_rows(
    c: &Connection,
    rows: &[(i64, &AuditRecord)],
) -> rusqlite::Result<()> {
    debug_assert!(rows.iter().all(|(_, r)| r.action == AuditAction::Created
        && r.old_url.is_none()
        && r.detail.is_none()));
    let shared = [ToSqlOutput::from(AuditAction::Created.as_str())];
    CREATES_AUDIT.execute(c, rows, &shared, |(id, r), row| {
        row.extend([
            ToSqlOutput::from(*id),
            ToSqlOutput::from(r.at),
            ToSqlOutput::from(r.actor.as_str()),
            nullable(r.ip.as_deref()),
            nullable(r.user_agent.as_deref()),
            nullable(r.code.as_deref()),
            nullable(r.new_url.as_deref()),
        ]);
    })
}

/// Appends audit rows other than creations (inside the caller's transaction), ids in slice
/// order.
pub(super) fn insert_audit_rows(c: &Connection, records: &[&AuditRecord]) -> rusqlite::Result<()> {
    debug_assert!(records.iter().all(|r| r.action != AuditAction::Created));
    AUDIT.execute(c, records, &[], |r, row| {
        row.extend([
            ToSqlOutput::from(r.at),
            ToSqlOutput::from(r.actor.as_str()),
            nullable(r.ip.as_deref()),
            nullable(r.user_agent.as_deref()),
            ToSqlOutput::from(r.action.as_str()),
            nullable(r.code.as_deref()),
            nullable(r.old_url.as_deref()),
            nullable(r.new_url.as_deref()),
            nullable(r.detail.as_deref()),
        ]);
    })
}

/// Appends the `created` audit row of each link, by `origin` (inside the caller's
/// transaction), each under the id its link names (see [`insert_links`]), ascending: what
/// [`AuditRecord::created`] makes, the values all rows share bound once per statement.
pub(super) fn insert_created_audit_rows(
    c: &Connection,
    links: &[(i64, &Link)],
    origin: &Origin,
) -> rusqlite::Result<()> {
    let shared = [
        ToSqlOutput::from(origin.actor.name.as_str()),
        nullable(origin.ip.as_deref()),
        nullable(origin.user_agent.as_deref()),
        ToSqlOutput::from(AuditAction::Created.as_str()),
    ];
    CREATED_AUDIT.execute(c, links, &shared, |(id, l), row| {
        row.extend([
            ToSqlOutput::from(*id),
            ToSqlOutput::from(l.created_at),
            ToSqlOutput::from(l.code.as_str()),
            ToSqlOutput::from(l.long_url.as_str()),
        ]);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_that_cover_every_row_in_order() {
        let rows: Vec<usize> = (0..203).collect();
        let lens: Vec<usize> = chunks(&rows).map(<[usize]>::len).collect();
        assert_eq!(lens, [64, 64, 64, 8, 2, 1]);
        assert_eq!(chunks(&rows).flatten().copied().collect::<Vec<_>>(), rows);
        assert_eq!(chunks::<u8>(&[]).count(), 0);
        for rows in chunks(&rows) {
            let sql = AUDIT.sql(rows.len());
            assert_eq!(sql.matches('(').count(), rows.len() + 1, "{sql}");
        }
    }

    #[test]
    fn the_sql_numbers_each_rows_values_then_the_shared_ones() {
        assert_eq!(
            insert_sql("t", "a, b", &[Value::Row; 2], 2, "RETURNING a"),
            "INSERT OR FAIL INTO t (a, b) VALUES (?1, ?2), (?3, ?4) RETURNING a"
        );
        let row = [Value::Row, Value::Shared(1), Value::Sql("0"), Value::Row];
        assert_eq!(
            insert_sql("t", "a, b, c, d", &row, 2, ""),
            "INSERT OR FAIL INTO t (a, b, c, d) VALUES (?1, ?5, 0, ?2), (?3, ?5, 0, ?4) "
        );
    }
}
