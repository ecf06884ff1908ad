//! `shortener import`'s batches on the embedded store: one transaction of prepared inserts.

use super::{insert_audit, to_i64};
use rusqlite::{Connection, params};
use shortener_core::audit::AuditRecord;
use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome};

/// Page cache of an importing writer (256 MiB): a B-tree keyed by random codes is touched
/// all over, and a page read back from the file costs far more than one kept.
pub(super) const IMPORT_CACHE_KIB: i64 = 256 * 1024;

/// Writes one batch inside the writer's transaction (see [`LinkStore::import_links`]).
///
/// [`LinkStore::import_links`]: shortener_core::store::LinkStore::import_links
pub(super) fn write_batch(c: &Connection, batch: &ImportBatch) -> rusqlite::Result<ImportOutcome> {
    // In code order each insert lands on the same or the next B-tree leaf as the previous one.
    let mut order: Vec<usize> = (0..batch.links.len()).collect();
    order.sort_by(|&a, &b| batch.links[a].code.cmp(&batch.links[b].code));
    c.execute_batch("SAVEPOINT import")?;
    let mut insert = c.prepare_cached(
        "INSERT INTO links (code, long_url, owner, custom_alias, created_at, expires_at, \
         created_ip, version, owner_admin) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (code) DO NOTHING",
    )?;
    let mut outcomes = vec![InsertOutcome::CodeTaken; batch.links.len()];
    let mut generated_taken = Vec::new();
    for i in order {
        let link = &batch.links[i];
        let inserted = insert.execute(params![
            link.code,
            link.long_url,
            link.owner,
            link.custom_alias,
            link.created_at,
            link.expires_at,
            link.created_ip,
            to_i64(link.version),
            link.owner_admin,
        ])?;
        if inserted == 1 {
            insert_audit(c, &AuditRecord::created(link, &batch.origin))?;
            outcomes[i] = InsertOutcome::Inserted;
        } else if !link.custom_alias {
            generated_taken.push(i);
        }
    }
    if !generated_taken.is_empty() {
        generated_taken.sort_unstable();
        c.execute_batch("ROLLBACK TO import; RELEASE import")?;
        return Ok(ImportOutcome::GeneratedTaken(generated_taken));
    }
    c.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![batch.progress_key, batch.progress])?;
    c.execute_batch("RELEASE import")?;
    Ok(ImportOutcome::Committed(outcomes))
}

#[cfg(test)]
mod tests {
    use super::super::SqliteStore;
    use shortener_core::audit::{AuditQuery, Origin};
    use shortener_core::link::Link;
    use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome, LinkStore};

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
            store.import_links(&first).await.unwrap(),
            ImportOutcome::Committed(vec![InsertOutcome::Inserted])
        );
        // A generated code that the alias holds: the whole batch waits for new codes.
        let clash = batch(vec![link("fresh-alias", true), link("held123", false)], "2");
        assert_eq!(
            store.import_links(&clash).await.unwrap(),
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
            store.import_links(&mixed).await.unwrap(),
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
