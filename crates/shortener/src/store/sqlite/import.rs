//! `shortener import`'s batches on the embedded store: one transaction of multi-row inserts.

use super::multi_row::{
    append_change_notes, insert_created_audit_rows, insert_links, next_audit_id,
    stored_with_audit_ids,
};
use rusqlite::{Connection, params};
use shortener_core::link::Link;
use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome};

/// Page cache of an importing writer (256 MiB): a B-tree keyed by random codes is touched
/// all over, and a page read back from the file costs far more than one kept. (1 GiB,
/// tried at 10 M links: 5 % less of the writer's CPU.)
const IMPORT_CACHE_KIB: i64 = 256 * 1024;

/// WAL pages after which an importing writer's commit checkpoints (256 MiB; SQLite's
/// default is 1 000). Each batch rewrites most pages of `links`, keyed by random codes;
/// checkpointing every few batches rather than after each copies such a page into the
/// database once for them all, and waits for the checkpoint's two fsyncs less often. The
/// WAL grows to this plus a batch.
const IMPORT_AUTOCHECKPOINT_PAGES: i64 = 64 * 1024;

/// Tunes the writer connection of an importing process.
pub(super) fn tune_writer(c: &Connection) -> rusqlite::Result<()> {
    c.pragma_update(None, "cache_size", -IMPORT_CACHE_KIB)?;
    c.pragma_update(None, "wal_autocheckpoint", IMPORT_AUTOCHECKPOINT_PAGES)
}

/// Writes one batch as the writer's transaction (see [`LinkStore::import_links`]); the
/// caller rolls it back unless it returns [`ImportOutcome::Committed`].
///
/// [`LinkStore::import_links`]: shortener_core::store::LinkStore::import_links
pub(super) fn write_batch(c: &Connection, batch: &ImportBatch) -> rusqlite::Result<ImportOutcome> {
    let links: Vec<&Link> = batch.links.iter().collect();
    let first_audit = next_audit_id(c)?;
    let stored = insert_links(c, &links, first_audit)?;
    let outcomes: Vec<InsertOutcome> = stored
        .iter()
        .map(|&stored| match stored {
            true => InsertOutcome::Inserted,
            false => InsertOutcome::CodeTaken,
        })
        .collect();
    let generated_taken: Vec<usize> = (0..batch.links.len())
        .filter(|&i| !stored[i] && !batch.links[i].custom_alias)
        .collect();
    if !generated_taken.is_empty() {
        return Ok(ImportOutcome::GeneratedTaken(generated_taken));
    }
    let audited = stored_with_audit_ids(&links, &stored, first_audit);
    insert_created_audit_rows(c, &audited, &batch.origin)?;
    let created: Vec<&Link> = audited.iter().map(|(_, l)| *l).collect();
    let at = created.first().map_or(0, |l| l.created_at);
    append_change_notes(c, &created, at)?;
    c.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![batch.progress_key, batch.progress])?;
    Ok(ImportOutcome::Committed(outcomes))
}

#[cfg(test)]
mod tests {
    use super::super::SqliteStore;
    use shortener_core::audit::{AuditQuery, Origin};
    use shortener_core::link::Link;
    use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome, LinkStore};
    use std::sync::Arc;

    fn link(code: &str, alias: bool) -> Link {
        Link {
            custom_alias: alias,
            ..Link::new(code, "https://example.com/", 0, i64::MAX)
        }
    }

    fn batch(links: Vec<Link>, progress: &str) -> ImportBatch {
        ImportBatch {
            links,
            origin: Origin::system("test"),
            progress_key: "import:test".into(),
            progress: progress.as_bytes().to_vec(),
        }
    }

    #[tokio::test]
    async fn a_taken_generated_code_writes_nothing_of_the_batch_and_a_taken_alias_only_skips() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let first = batch(vec![link("held123", true)], "1");
        assert_eq!(
            store.import_links(Arc::new(first)).await.unwrap(),
            ImportOutcome::Committed(vec![InsertOutcome::Inserted])
        );
        // A generated code that the alias holds: the whole batch waits for new codes.
        let clash = batch(vec![link("fresh-alias", true), link("held123", false)], "2");
        assert_eq!(
            store.import_links(Arc::new(clash)).await.unwrap(),
            ImportOutcome::GeneratedTaken(vec![1])
        );
        assert!(store.get_link("fresh-alias").await.unwrap().is_none());
        assert_eq!(
            store.meta("import:test").await.unwrap(),
            Some(b"1".to_vec())
        );
        // A taken alias is refused alone; the rest and the progress commit.
        let mixed = batch(vec![link("held123", true), link("new4567", false)], "3");
        assert_eq!(
            store.import_links(Arc::new(mixed)).await.unwrap(),
            ImportOutcome::Committed(vec![InsertOutcome::CodeTaken, InsertOutcome::Inserted])
        );
        assert_eq!(
            store.meta("import:test").await.unwrap(),
            Some(b"3".to_vec())
        );
        let audit = store
            .audit(&AuditQuery {
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        let codes: Vec<_> = audit.iter().filter_map(|r| r.record.code.clone()).collect();
        assert_eq!(codes, ["new4567", "held123"]);
    }
}
