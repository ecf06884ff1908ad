//! `shortener import`'s batches on PostgreSQL: one transaction, one multi-row statement per
//! table (column arrays through `unnest`), so a batch costs a few round trips, not one per link.

use super::{AUDIT_COLUMNS, to_i64};
use deadpool_postgres::Transaction;
use shortener_core::audit::AuditRecord;
use shortener_core::link::Link;
use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome};
use std::collections::HashSet;

/// Writes one batch inside `tx`; the caller commits unless it is `GeneratedTaken`.
pub(super) async fn write_batch(
    tx: &Transaction<'_>,
    batch: &ImportBatch,
) -> Result<ImportOutcome, tokio_postgres::Error> {
    let links = &batch.links;
    let codes: Vec<&str> = links.iter().map(|l| l.code.as_str()).collect();
    let urls: Vec<&str> = links.iter().map(|l| l.long_url.as_str()).collect();
    let owners: Vec<Option<&str>> = links.iter().map(|l| l.owner.as_deref()).collect();
    let aliases: Vec<bool> = links.iter().map(|l| l.custom_alias).collect();
    let created: Vec<i64> = links.iter().map(|l| l.created_at).collect();
    let expires: Vec<i64> = links.iter().map(|l| l.expires_at).collect();
    let ips: Vec<Option<&str>> = links.iter().map(|l| l.created_ip.as_deref()).collect();
    let versions: Vec<i64> = links.iter().map(|l| to_i64(l.version)).collect();
    let admins: Vec<bool> = links.iter().map(|l| l.owner_admin).collect();
    let insert = tx
        .prepare_cached(
            "INSERT INTO links (code, long_url, owner, custom_alias, created_at, expires_at, \
             created_ip, version, owner_admin) \
             SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BOOL[], $5::INT8[], \
             $6::INT8[], $7::TEXT[], $8::INT8[], $9::BOOL[]) \
             ON CONFLICT (code) DO NOTHING RETURNING code",
        )
        .await?;
    let rows = tx
        .query(
            &insert,
            &[
                &codes, &urls, &owners, &aliases, &created, &expires, &ips, &versions, &admins,
            ],
        )
        .await?;
    let stored: HashSet<String> = rows
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<Result<_, _>>()?;
    // Codes are distinct within a batch, so a returned code names exactly one link.
    let outcomes: Vec<InsertOutcome> = links
        .iter()
        .map(|l| {
            if stored.contains(&l.code) {
                InsertOutcome::Inserted
            } else {
                InsertOutcome::CodeTaken
            }
        })
        .collect();
    let generated_taken: Vec<usize> = (0..links.len())
        .filter(|&i| outcomes[i] == InsertOutcome::CodeTaken && !links[i].custom_alias)
        .collect();
    if !generated_taken.is_empty() {
        return Ok(ImportOutcome::GeneratedTaken(generated_taken));
    }

    let records: Vec<AuditRecord> = links
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == InsertOutcome::Inserted)
        .map(|(l, _)| AuditRecord::created(l, &batch.origin))
        .collect();
    let created: Vec<&Link> = links.iter().filter(|l| stored.contains(&l.code)).collect();
    insert_created(tx, &created, &records).await?;
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&batch.progress_key, &batch.progress],
    )
    .await?;
    Ok(ImportOutcome::Committed(outcomes))
}

/// Codes in one change note at most: a poller reads whole notes, and a pooled connection
/// keeps the buffers of the largest row it read (an import's batch of 500 000 codes in one
/// note held megabytes in each connection that polled it).
const CODES_PER_NOTE: i64 = 1000;

/// Appends the `created` audit rows of `links` (`records`, one each) and change notes for
/// all of them (`codes`, `versions`, [`CODES_PER_NOTE`] a note), in one statement inside
/// `tx`. Each note waits for its number (see `number_pending`) under the negated lowest id of
/// its codes' audit rows: unique, and never after a position a poller asks for. Numbering
/// them here would hold the sequence's row through the commit, and concurrent groups would
/// queue on it (halving creates/s); notes of many codes, not one per create, spare
/// PostgreSQL a row written and renumbered per create.
pub(super) async fn insert_created(
    tx: &Transaction<'_>,
    links: &[&Link],
    records: &[AuditRecord],
) -> Result<(), tokio_postgres::Error> {
    if links.is_empty() {
        return Ok(());
    }
    let at: Vec<i64> = records.iter().map(|r| r.at).collect();
    let actor: Vec<&str> = records.iter().map(|r| r.actor.as_str()).collect();
    let ip: Vec<Option<&str>> = records.iter().map(|r| r.ip.as_deref()).collect();
    let agent: Vec<Option<&str>> = records.iter().map(|r| r.user_agent.as_deref()).collect();
    let action: Vec<&str> = records.iter().map(|r| r.action.as_str()).collect();
    let code: Vec<Option<&str>> = records.iter().map(|r| r.code.as_deref()).collect();
    let old_url: Vec<Option<&str>> = records.iter().map(|r| r.old_url.as_deref()).collect();
    let new_url: Vec<Option<&str>> = records.iter().map(|r| r.new_url.as_deref()).collect();
    let detail: Vec<Option<&str>> = records.iter().map(|r| r.detail.as_deref()).collect();
    let codes: Vec<&str> = links.iter().map(|l| l.code.as_str()).collect();
    let versions: Vec<i64> = links.iter().map(|l| to_i64(l.version)).collect();
    let audit = tx
        .prepare_cached(&format!(
            "WITH audited AS (INSERT INTO audit ({AUDIT_COLUMNS}) \
             SELECT * FROM unnest($1::INT8[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], \
             $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[]) RETURNING id, at, code), \
             noted AS (SELECT a.id, a.at, n.code, n.version, n.ord \
             FROM unnest($10::TEXT[], $11::INT8[]) WITH ORDINALITY n(code, version, ord) \
             JOIN audited a ON a.code = n.code) \
             INSERT INTO link_changes (seq, codes, versions, at) \
             SELECT -min(id), array_agg(code ORDER BY ord), array_agg(version ORDER BY ord), \
             min(at) FROM noted GROUP BY (ord - 1) / {CODES_PER_NOTE}"
        ))
        .await?;
    let notes = tx
        .execute(
            &audit,
            &[
                &at, &actor, &ip, &agent, &action, &code, &old_url, &new_url, &detail, &codes,
                &versions,
            ],
        )
        .await?;
    // The notes join the audit rows by code: distinct codes, each a record's.
    debug_assert_eq!(notes, links.len().div_ceil(CODES_PER_NOTE as usize) as u64);
    Ok(())
}
