//! A link's changes inside a transaction: its row locked, the new state, the change note that
//! tells other instances, the audit row; reports and their automatic disable.

use super::{
    AUDIT_COLUMNS, LINK_COLUMNS, background_transaction, link_from_row, placeholder, to_i64,
    to_u64, update_state_sql,
};
use deadpool_postgres::{Object, Transaction};
use shortener_core::audit::{AuditRecord, Origin};
use shortener_core::day::UnixSeconds;
use shortener_core::link::{Actor, Link, LinkChange, Refusal};
use shortener_core::report::{
    AUTO_DISABLE_WINDOW_SECONDS, AUTO_REPORTS_ACTOR, AutoDisable, NewReport, ReportOutcome,
};
use shortener_core::store::ChangeOutcome;

/// The link locked for the rest of `tx`, with its totals. The lock is taken on `links` (a
/// view that sums the days cannot be locked) and the link read after it, so the read sees the
/// last committed change.
async fn lock_link(
    tx: &Transaction<'_>,
    code: &str,
) -> Result<Option<Link>, tokio_postgres::Error> {
    let lock = tx
        .prepare_cached("SELECT 1 FROM links WHERE code = $1 FOR UPDATE")
        .await?;
    if tx.query_opt(&lock, &[&code]).await?.is_none() {
        return Ok(None);
    }
    let select = tx
        .prepare_cached(&format!(
            "SELECT {LINK_COLUMNS} FROM counted_links WHERE code = $1"
        ))
        .await?;
    tx.query_opt(&select, &[&code])
        .await?
        .as_ref()
        .map(link_from_row)
        .transpose()
}

/// Appends one row to the audit trail inside `tx`.
pub(super) async fn insert_audit(
    tx: &Transaction<'_>,
    r: &AuditRecord,
) -> Result<(), tokio_postgres::Error> {
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
pub(super) const NUMBERED_AT_ONCE: i64 = 10_000;

/// Gives up to [`NUMBERED_AT_ONCE`] notes waiting for a number (negative positions, the
/// oldest first) the next positions of the sequence; returns how many.
///
/// Why a poller never skips a note: a note gets a position only in a transaction holding
/// the `change_counter` row until its commit (a change's own, or this one), above every
/// position an earlier holder committed; so positions become visible in increasing order,
/// on the primary and (replaying commits in order) on replicas. This transaction reads the
/// waiting notes in a statement begun after it holds the row (read committed: a snapshot
/// per statement), so it sees every one committed before, and none numbered already.
pub(super) async fn number_pending(
    client: &mut Object,
    bounded: bool,
) -> Result<u64, tokio_postgres::Error> {
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
pub(super) async fn file_report(
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
pub(super) async fn change_once(
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
