//! Multi-row inserts: many rows per statement execution, so that the per-statement costs —
//! binding setup, the statement's reset, AUTOINCREMENT's counter read and write — are paid
//! once per chunk instead of once per row.

use super::{AUDIT_COLUMNS, LINK_COLUMNS, to_i64};
use rusqlite::types::ToSql;
use rusqlite::{Connection, params_from_iter};
use shortener_core::audit::AuditRecord;
use shortener_core::day::UnixSeconds;
use shortener_core::link::Link;
use std::sync::LazyLock;

/// Most rows per statement. Chunks are powers of two up to this, so a connection caches
/// at most seven statements per table whatever the batch sizes (its statement cache holds 64).
const MAX_ROWS: usize = 64;

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

/// The statements of one multi-row insert, one per chunk length, written once (a create's
/// audit row would otherwise format its SQL every time).
pub(super) struct MultiInsert {
    sql: [String; MAX_ROWS.ilog2() as usize + 1],
}

impl MultiInsert {
    pub(super) fn new(table: &str, columns: &str, tail: &str) -> Self {
        Self {
            sql: std::array::from_fn(|i| insert_sql(table, columns, 1 << i, tail)),
        }
    }

    /// The statement for a chunk of `rows` rows (a power of two, see [`chunks`]).
    pub(super) fn sql(&self, rows: usize) -> &str {
        &self.sql[rows.ilog2() as usize]
    }
}

static NOTES: LazyLock<MultiInsert> =
    LazyLock::new(|| MultiInsert::new("link_changes", "seq, code, version, at", ""));
static AUDIT: LazyLock<MultiInsert> =
    LazyLock::new(|| MultiInsert::new("audit", AUDIT_COLUMNS, ""));
static LINKS: LazyLock<MultiInsert> = LazyLock::new(|| {
    MultiInsert::new(
        "links",
        LINK_COLUMNS,
        "ON CONFLICT (code) DO NOTHING RETURNING code",
    )
});

/// `INSERT INTO {table} ({columns}) VALUES (?, …), …` for `rows` rows, then `tail`.
fn insert_sql(table: &str, columns: &str, rows: usize, tail: &str) -> String {
    let per_row = columns.split(',').count();
    let row = format!("({})", vec!["?"; per_row].join(", "));
    format!(
        "INSERT INTO {table} ({columns}) VALUES {} {tail}",
        vec![row.as_str(); rows].join(", ")
    )
}

/// Inserts the links whose codes are free (inside the caller's transaction), in code order:
/// each insert then lands on the same or the next B-tree leaf as the one before. Says of
/// each link, in slice order, whether it was stored; of links sharing a code, the first is.
pub(super) fn insert_links(c: &Connection, links: &[&Link]) -> rusqlite::Result<Vec<bool>> {
    let mut order: Vec<usize> = (0..links.len()).collect();
    // Stable: among links sharing a code, the first in the slice is inserted first.
    order.sort_by(|&a, &b| links[a].code.cmp(&links[b].code));
    let mut stored = vec![false; links.len()];
    for chunk in chunks(&order) {
        let mut insert = c.prepare_cached(LINKS.sql(chunk.len()))?;
        let derived: Vec<[i64; 3]> = chunk
            .iter()
            .map(|&i| {
                let l = links[i];
                [to_i64(l.clicks), to_i64(l.bot_clicks), to_i64(l.version)]
            })
            .collect();
        let disabled: Vec<[Option<&str>; 3]> = chunk
            .iter()
            .map(|&i| {
                let d = links[i].disabled.as_ref();
                [
                    d.map(|d| d.reason.as_str()),
                    d.map(|d| d.by.as_str()),
                    d.map(|d| d.by_kind.as_str()),
                ]
            })
            .collect();
        let disabled_at: Vec<Option<i64>> = chunk
            .iter()
            .map(|&i| links[i].disabled.as_ref().map(|d| d.at))
            .collect();
        let values = chunk
            .iter()
            .zip(derived.iter().zip(disabled.iter().zip(&disabled_at)))
            .flat_map(|(&i, (n, (d, at)))| -> [&dyn ToSql; 16] {
                let l = links[i];
                [
                    &l.code,
                    &l.long_url,
                    &l.owner,
                    &l.custom_alias,
                    &l.created_at,
                    &l.expires_at,
                    at,
                    &n[0],
                    &n[1],
                    &l.created_ip,
                    &n[2],
                    &d[0],
                    &d[1],
                    &d[2],
                    &l.deleted_at,
                    &l.owner_admin,
                ]
            });
        let mut rows = insert.query(params_from_iter(values))?;
        while let Some(row) = rows.next()? {
            // RETURNING's order is unspecified: find the code in the sorted chunk. Only the
            // first link of a code can have been stored.
            let code = row.get_ref(0)?.as_str()?;
            let at = chunk.partition_point(|&i| links[i].code.as_str() < code);
            if let Some(&i) = chunk.get(at) {
                stored[i] = true;
            }
        }
    }
    Ok(stored)
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
    let last: i64 = c
        .prepare_cached("UPDATE change_counter SET seq = seq + ?1 RETURNING seq")?
        .query_row([n], |r| r.get(0))?;
    let mut seq = last - n;
    for chunk in chunks(links) {
        let rows: Vec<[i64; 2]> = chunk
            .iter()
            .map(|l| {
                seq += 1;
                [seq, to_i64(l.version)]
            })
            .collect();
        let values = chunk
            .iter()
            .zip(&rows)
            .flat_map(|(l, row)| -> [&dyn ToSql; 4] { [&row[0], &l.code, &row[1], &at] });
        c.prepare_cached(NOTES.sql(chunk.len()))?
            .execute(params_from_iter(values))?;
    }
    Ok(())
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
    let created: Vec<&Link> = links
        .iter()
        .zip(stored)
        .filter(|(_, stored)| **stored)
        .map(|(l, _)| *l)
        .collect();
    append_change_notes(c, &created, at)
}

/// Appends audit rows (inside the caller's transaction), ids in slice order.
pub(super) fn insert_audit_rows(c: &Connection, records: &[&AuditRecord]) -> rusqlite::Result<()> {
    for chunk in chunks(records) {
        let mut insert = c.prepare_cached(AUDIT.sql(chunk.len()))?;
        let actions: Vec<&str> = chunk.iter().map(|r| r.action.as_str()).collect();
        let values = chunk
            .iter()
            .zip(&actions)
            .flat_map(|(r, action)| -> [&dyn ToSql; 9] {
                [
                    &r.at,
                    &r.actor,
                    &r.ip,
                    &r.user_agent,
                    action,
                    &r.code,
                    &r.old_url,
                    &r.new_url,
                    &r.detail,
                ]
            });
        insert.execute(params_from_iter(values))?;
    }
    Ok(())
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
    fn the_sql_has_a_placeholder_per_column_and_row() {
        assert_eq!(
            insert_sql("t", "a, b", 2, "RETURNING a"),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?) RETURNING a"
        );
    }
}
