//! A link's changes inside the writer's transaction: the new state, the change note, the
//! audit row; reports and their automatic disable.

use super::multi_row;
use super::{placeholder, read_link, to_i64, to_u64, update_state_sql};
use rusqlite::{Connection, params};
use shortener_core::audit::{AuditRecord, Origin};
use shortener_core::link::{Actor, Link, LinkChange};
use shortener_core::report::{
    AUTO_DISABLE_WINDOW_SECONDS, AUTO_REPORTS_ACTOR, AutoDisable, NewReport, ReportOutcome,
};

/// Appends one row to the audit trail (inside the caller's transaction).
pub(super) fn insert_audit(c: &Connection, r: &AuditRecord) -> rusqlite::Result<()> {
    multi_row::insert_audit_rows(c, &[r])
}

/// Writes a link's new state, its change note and its audit row (inside the caller's
/// transaction).
pub(super) fn write_change(
    c: &Connection,
    before: &Link,
    after: &Link,
    audit: &AuditRecord,
) -> rusqlite::Result<()> {
    let d = after.disabled.as_ref();
    c.prepare_cached(&update_state_sql(placeholder))?
        .execute(params![
            after.code,
            after.long_url,
            after.expires_at,
            to_i64(after.version),
            d.map(|d| d.at),
            d.map(|d| d.reason.as_str()),
            d.map(|d| d.by.as_str()),
            d.map(|d| d.by_kind.as_str()),
            after.deleted_at,
        ])?;
    multi_row::append_change_notes(c, &[after], audit.at)?;
    if before.disabled.is_some() && after.disabled.is_none() {
        // An enable: reports made before it no longer count towards the next auto-disable.
        c.prepare_cached("UPDATE reports SET counts = FALSE WHERE code = ?1 AND counts")?
            .execute([&after.code])?;
    }
    insert_audit(c, audit)
}

/// Files a report and applies its automatic disable (inside the writer's transaction).
pub(super) fn file_report(
    c: &Connection,
    report: &NewReport,
    origin: &Origin,
    auto: Option<AutoDisable>,
) -> rusqlite::Result<ReportOutcome> {
    let Some(link) = read_link(c, &report.code)? else {
        return Ok(ReportOutcome::NotFound);
    };
    let id: i64 = c
        .prepare_cached(
            "INSERT INTO reports (code, at, ip, category, comment, counts) \
             VALUES (?1, ?2, ?3, ?4, ?5, TRUE) RETURNING id",
        )?
        .query_row(
            params![
                report.code,
                report.at,
                report.ip,
                report.category.as_str(),
                report.comment
            ],
            |r| r.get(0),
        )?;
    insert_audit(c, &AuditRecord::reported(&link, report, origin))?;
    let Some(auto) = auto else {
        return Ok(ReportOutcome::Filed { id, disabled: None });
    };
    let reporters: i64 = c
        .prepare_cached(
            "SELECT COUNT(DISTINCT ip) FROM reports WHERE code = ?1 AND counts AND at > ?2",
        )?
        .query_row(
            params![report.code, report.at - AUTO_DISABLE_WINDOW_SECONDS],
            |r| r.get(0),
        )?;
    let reporters = to_u64(reporters);
    if !auto.disables(&link, reporters, report.at) {
        return Ok(ReportOutcome::Filed { id, disabled: None });
    }
    let change = LinkChange::Disable {
        reason: auto.reason(reporters),
    };
    let system = Origin::system(AUTO_REPORTS_ACTOR);
    let disabled = match link.apply(&change, &Actor::system(AUTO_REPORTS_ACTOR), report.at) {
        Ok(Some(after)) => {
            let audit = AuditRecord::changed(&link, &after, &change, &system, report.at);
            write_change(c, &link, &after, &audit)?;
            Some(Box::new(after))
        }
        _ => None,
    };
    Ok(ReportOutcome::Filed { id, disabled })
}
