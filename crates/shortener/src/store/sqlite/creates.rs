//! Creates on the embedded store: the writer inserts a group's creates together, one
//! multi-row `INSERT` for their links and one for their audit rows, so that the
//! per-statement costs (binding setup, the statement's reset, AUTOINCREMENT's counter) are
//! paid per chunk of up to 64 creates rather than per create.

use super::multi_row::{
    insert_creation_rows, insert_links, next_audit_id, note_stored, stored_with_audit_ids,
};
use super::writer::{Isolation, WriteOp, answer};
use rusqlite::Connection;
use shortener_core::audit::AuditRecord;
use shortener_core::link::Link;
use shortener_core::store::{InsertOutcome, StoreError};
use tokio::sync::oneshot;

/// A create queued for the writer: a link stored if its code is free, with its audit row.
pub(super) struct Create {
    link: Link,
    audit: AuditRecord,
    result: Option<rusqlite::Result<InsertOutcome>>,
    reply: oneshot::Sender<Result<InsertOutcome, StoreError>>,
}

impl Create {
    pub(super) fn new(
        link: Link,
        audit: AuditRecord,
        reply: oneshot::Sender<Result<InsertOutcome, StoreError>>,
    ) -> Self {
        Self {
            link,
            audit,
            result: None,
            reply,
        }
    }
}

/// Inserts `creates` (inside the group's transaction); `false` if the store failed, which
/// fails the whole group (a conditional insert and its audit row fail only with the store).
pub(super) fn apply(conn: &Connection, creates: &mut [&mut Create]) -> bool {
    let links: Vec<&Link> = creates.iter().map(|c| &c.link).collect();
    let audits: Vec<&AuditRecord> = creates.iter().map(|c| &c.audit).collect();
    let written = next_audit_id(conn).and_then(|first| {
        let stored = insert_links(conn, &links, first)?;
        // In queue order, so the audit trail lists a group's creates as they arrived.
        insert_creation_rows(conn, &stored_with_audit_ids(&audits, &stored, first))?;
        let at = creates.first().map_or(0, |c| c.audit.at);
        note_stored(conn, &links, &stored, at)?;
        Ok(stored)
    });
    match written {
        Ok(stored) => {
            for (create, stored) in creates.iter_mut().zip(stored) {
                create.result = Some(Ok(match stored {
                    true => InsertOutcome::Inserted,
                    false => InsertOutcome::CodeTaken,
                }));
            }
            true
        }
        Err(e) => {
            // A lone create answers this error; in a group every create is answered that
            // the group's commit failed.
            if let Some(first) = creates.first_mut() {
                first.result = Some(Err(e));
            }
            false
        }
    }
}

impl WriteOp for Create {
    fn apply(&mut self, conn: &Connection) -> bool {
        apply(conn, &mut [self])
    }

    fn isolation(&self) -> Isolation {
        Isolation::Shared
    }

    fn finish(self: Box<Self>, durable: Result<(), &str>) {
        answer(self.reply, durable, self.result);
    }

    fn as_create(&mut self) -> Option<&mut Create> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shortener_core::audit::Origin;

    fn create(
        code: &str,
        url: &str,
    ) -> (Create, oneshot::Receiver<Result<InsertOutcome, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        let link = Link::new(code, url, 0, i64::MAX);
        let audit = AuditRecord::created(&link, &Origin::system("test"));
        (Create::new(link, audit, reply), rx)
    }

    fn stored(conn: &Connection, sql: &str) -> Vec<(String, String)> {
        conn.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_group_stores_the_first_create_of_each_free_code_each_with_its_audit_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        let (mut held, _) = create("held000", "https://example.com/held");
        assert!(apply(&conn, &mut [&mut held]));
        // More than a chunk, codes out of order, a code twice, a code already held.
        let mut group: Vec<_> = (0..100)
            .rev()
            .map(|i| create(&format!("c{i:03}"), &format!("https://example.com/{i}")))
            .collect();
        group.push(create("c050", "https://example.com/second"));
        group.push(create("held000", "https://example.com/again"));
        let mut creates: Vec<&mut Create> = group.iter_mut().map(|(c, _)| c).collect();
        assert!(apply(&conn, &mut creates));
        let outcomes: Vec<_> = group
            .iter()
            .map(|(c, _)| *c.result.as_ref().unwrap().as_ref().unwrap())
            .collect();
        assert!(
            outcomes[..100]
                .iter()
                .all(|o| *o == InsertOutcome::Inserted)
        );
        assert_eq!(outcomes[100..], [InsertOutcome::CodeTaken; 2]);
        let links = stored(&conn, "SELECT code, long_url FROM links ORDER BY code");
        assert_eq!(links.len(), 101);
        assert!(links.contains(&("c050".into(), "https://example.com/50".into())));
        assert!(links.contains(&("held000".into(), "https://example.com/held".into())));
        // One audit row per stored link, in the order the creates were queued.
        let audit = stored(&conn, "SELECT code, action FROM audit ORDER BY id");
        let codes: Vec<&str> = audit.iter().map(|(code, _)| code.as_str()).collect();
        let mut expected = vec!["held000".to_owned()];
        expected.extend((0..100).rev().map(|i| format!("c{i:03}")));
        assert_eq!(codes, expected);
    }

    #[test]
    fn held_codes_at_a_statements_start_middle_and_end_refuse_only_their_creates() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        let held = ["c000", "c031", "c032", "c033", "c063", "c064", "c099"];
        for code in held {
            let (mut c, _) = create(code, "https://example.com/held");
            assert!(apply(&conn, &mut [&mut c]));
        }
        // Sorted, 100 codes are statements of 64, 32 and 4 rows.
        let mut group: Vec<_> = (0..100)
            .map(|i| create(&format!("c{i:03}"), &format!("https://example.com/{i}")))
            .collect();
        let mut creates: Vec<&mut Create> = group.iter_mut().map(|(c, _)| c).collect();
        assert!(apply(&conn, &mut creates));
        for (c, _) in &group {
            let expected = match held.contains(&c.link.code.as_str()) {
                true => InsertOutcome::CodeTaken,
                false => InsertOutcome::Inserted,
            };
            let outcome = *c.result.as_ref().unwrap().as_ref().unwrap();
            assert_eq!(outcome, expected, "{}", c.link.code);
        }
        let links = stored(&conn, "SELECT code, long_url FROM links ORDER BY code");
        assert_eq!(links.len(), 100);
        for (code, url) in links {
            let held = held.contains(&code.as_str());
            assert_eq!(url.ends_with("/held"), held, "{code} {url}");
        }
        let audited: i64 = conn
            .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(audited, 100);
        // Each link names its own creation row (refused creates left their ids unused).
        let named: i64 = conn
            .query_row(
                "SELECT count(*) FROM links l JOIN audit a ON a.id = l.created_audit \
                 WHERE a.code = l.code AND a.action = 'created' AND a.new_url = l.long_url",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(named, 100);
    }
}
