//! Versioned schema of the embedded store, tracked in SQLite's `user_version`.

use rusqlite::{Connection, TransactionBehavior};

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only: never edit one
/// that has shipped.
const MIGRATIONS: &[&str] = &[
    // v1: links, daily clicks, tokens, the id counter and the secret key of codes.
    "
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value BLOB NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE id_counter (
        only    INTEGER PRIMARY KEY CHECK (only = 0),
        next_id INTEGER NOT NULL
    );
    INSERT INTO id_counter (only, next_id) VALUES (0, 0);

    CREATE TABLE links (
        code         TEXT PRIMARY KEY,
        long_url     TEXT NOT NULL,
        owner        TEXT,
        custom_alias INTEGER NOT NULL,
        created_at   INTEGER NOT NULL,
        expires_at   INTEGER NOT NULL,
        disabled_at  INTEGER,
        clicks       INTEGER NOT NULL DEFAULT 0,
        bot_clicks   INTEGER NOT NULL DEFAULT 0,
        created_ip   TEXT
    ) WITHOUT ROWID;
    CREATE INDEX links_owner ON links (owner);

    CREATE TABLE daily_clicks (
        code       TEXT NOT NULL,
        day        INTEGER NOT NULL,
        clicks     INTEGER NOT NULL DEFAULT 0,
        bot_clicks INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (code, day)
    ) WITHOUT ROWID;
    CREATE INDEX daily_clicks_day ON daily_clicks (day);

    CREATE TABLE tokens (
        hash       BLOB PRIMARY KEY,
        user_name  TEXT NOT NULL,
        admin      INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    ",
    // v2: ids of click batches already applied (the scale-out click stream may deliver a
    // batch twice; it must count once).
    "
    CREATE TABLE applied_click_batches (
        id  TEXT PRIMARY KEY,
        day INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX applied_click_batches_day ON applied_click_batches (day);
    ",
    // v3: link versions, disabled (reversible) apart from deleted (final), the change
    // sequence other processes poll, and the audit trail.
    "
    ALTER TABLE links ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE links ADD COLUMN disabled_reason TEXT;
    ALTER TABLE links ADD COLUMN disabled_by TEXT;
    ALTER TABLE links ADD COLUMN disabled_by_kind TEXT;
    ALTER TABLE links ADD COLUMN deleted_at INTEGER;
    ALTER TABLE links ADD COLUMN owner_admin INTEGER NOT NULL DEFAULT FALSE;
    -- Until v3 a DELETE was the only way to disable a link: those links are deleted.
    UPDATE links SET deleted_at = disabled_at, disabled_at = NULL, version = 2
     WHERE disabled_at IS NOT NULL;

    CREATE TABLE change_counter (
        only INTEGER PRIMARY KEY CHECK (only = 0),
        seq  INTEGER NOT NULL
    );
    INSERT INTO change_counter (only, seq) VALUES (0, 0);
    CREATE TABLE link_changes (
        seq     INTEGER PRIMARY KEY,
        code    TEXT NOT NULL,
        version INTEGER NOT NULL,
        at      INTEGER NOT NULL
    );
    CREATE INDEX link_changes_at ON link_changes (at);

    CREATE TABLE audit (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         INTEGER NOT NULL,
        actor      TEXT NOT NULL,
        ip         TEXT,
        user_agent TEXT,
        action     TEXT NOT NULL,
        code       TEXT,
        old_url    TEXT,
        new_url    TEXT,
        detail     TEXT
    );
    CREATE INDEX audit_code ON audit (code, id);
    CREATE INDEX audit_at ON audit (at);

    -- counts: false once the link was enabled after the report (it no longer counts
    -- towards an automatic disable).
    CREATE TABLE reports (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        code        TEXT NOT NULL,
        at          INTEGER NOT NULL,
        ip          TEXT NOT NULL,
        category    TEXT NOT NULL,
        comment     TEXT,
        counts      INTEGER NOT NULL,
        resolved_at INTEGER,
        resolved_by TEXT,
        resolution  TEXT
    );
    CREATE INDEX reports_code ON reports (code, at);
    CREATE INDEX reports_queue ON reports (resolved_at, id);
    ",
    // v4: the link list's order (newest first, ties by code), per owner and for admins; the
    // owner index it extends goes.
    "
    CREATE INDEX links_owner_created ON links (owner, created_at, code);
    CREATE INDEX links_created ON links (created_at, code);
    DROP INDEX links_owner;
    ",
    // v5: tokens get an operator's label and an approximate last use; their public id is
    // derived from the hash, so existing tokens have one already.
    "
    ALTER TABLE tokens ADD COLUMN name TEXT;
    ALTER TABLE tokens ADD COLUMN last_used_at INTEGER;
    ",
    // v6: who the people of a day were: a HyperLogLog of visitor keys and the top values of
    // each breakdown (NULL until a person clicked; bounded in size).
    "
    ALTER TABLE daily_clicks ADD COLUMN visitors BLOB;
    ALTER TABLE daily_clicks ADD COLUMN tops TEXT;
    ",
    // v7: click totals in a narrow table of their own, so that a click batch over many codes
    // dirties a few dense pages rather than a page of `links` per code. `links.clicks` keeps
    // what a link had before (or was created with); links are read through the view, which
    // adds the two. Nothing to copy: the table starts empty.
    "
    CREATE TABLE link_clicks (
        code       TEXT PRIMARY KEY,
        clicks     INTEGER NOT NULL,
        bot_clicks INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE VIEW counted_links AS
    SELECT l.code, l.long_url, l.owner, l.custom_alias, l.created_at, l.expires_at,
           l.disabled_at, l.clicks + coalesce(t.clicks, 0) AS clicks,
           l.bot_clicks + coalesce(t.bot_clicks, 0) AS bot_clicks, l.created_ip, l.version,
           l.disabled_reason, l.disabled_by, l.disabled_by_kind, l.deleted_at, l.owner_admin
      FROM links l LEFT JOIN link_clicks t ON t.code = l.code;
    ",
    // v8: what several processes on one file share without Redis: spent CAPTCHA solutions
    // (until their challenge expires) and leases on jobs one of them does (the feed sweep).
    "
    CREATE TABLE spent_tokens (
        token TEXT PRIMARY KEY,
        until INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX spent_tokens_until ON spent_tokens (until);
    CREATE TABLE leases (
        name   TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        until  INTEGER NOT NULL,
        done   TEXT
    ) WITHOUT ROWID;
    ",
    // v9: a click flush writes the days alone. `link_clicks` now holds what pruned days held
    // (written by the prune); a link's totals add its live days' rows. Until now it held
    // every click since v7, live days' included: those come off. A day counted before v7 is
    // in `links.clicks` instead, so a link whose live days predate v7 can hold a negative
    // here; the sum stays exact.
    "
    INSERT INTO link_clicks (code, clicks, bot_clicks)
    SELECT code, -sum(clicks), -sum(bot_clicks) FROM daily_clicks WHERE TRUE GROUP BY code
    ON CONFLICT (code) DO UPDATE SET clicks = clicks + excluded.clicks,
                                     bot_clicks = bot_clicks + excluded.bot_clicks;
    DELETE FROM link_clicks WHERE clicks = 0 AND bot_clicks = 0;
    DROP VIEW counted_links;
    CREATE VIEW counted_links AS
    SELECT l.code, l.long_url, l.owner, l.custom_alias, l.created_at, l.expires_at,
           l.disabled_at,
           l.clicks + coalesce(t.clicks, 0)
             + coalesce((SELECT sum(d.clicks) FROM daily_clicks d WHERE d.code = l.code), 0)
             AS clicks,
           l.bot_clicks + coalesce(t.bot_clicks, 0)
             + coalesce((SELECT sum(d.bot_clicks) FROM daily_clicks d WHERE d.code = l.code), 0)
             AS bot_clicks,
           l.created_ip, l.version, l.disabled_reason, l.disabled_by, l.disabled_by_kind,
           l.deleted_at, l.owner_admin
      FROM links l LEFT JOIN link_clicks t ON t.code = l.code;
    ",
    // v10: a link names the audit row of its creation (`created_audit`), and `audit_code`
    // indexes the other rows only. Codes are random, so every create put a row into the
    // index at a random leaf: one more page written to the WAL and again by the checkpoint
    // per create (with it, 15 % fewer creates a second, BENCHMARKS.md). The links row is
    // written anyway. Links created before keep their creation row through the pointer set
    // here (or none: pruned by age).
    "
    ALTER TABLE links ADD COLUMN created_audit INTEGER;
    UPDATE links SET created_audit = a.id
      FROM (SELECT code, min(id) AS id FROM audit WHERE action = 'created' GROUP BY code) AS a
     WHERE links.code = a.code;
    DROP INDEX audit_code;
    CREATE INDEX audit_code ON audit (code, id) WHERE action <> 'created';
    ",
    // v11: the link list's ties (links of one second) go newest first, by `created_audit`,
    // instead of by code: a create's entries in the two list indexes then go at their ends
    // instead of at random places among their second's entries (about a page of each per
    // create: 20-25 % more creates a second, BENCHMARKS.md). The view shows it as `seq`.
    // Links with no creation row left (pruned before v10) get numbers below every row id, in
    // their former list order, so that every link has one.
    "
    UPDATE links SET created_audit = -o.n
      FROM (SELECT code, row_number() OVER (ORDER BY created_at DESC, code DESC) AS n
              FROM links WHERE created_audit IS NULL) AS o
     WHERE links.code = o.code;
    DROP INDEX links_owner_created;
    DROP INDEX links_created;
    CREATE INDEX links_owner_created ON links (owner, created_at, created_audit);
    CREATE INDEX links_created ON links (created_at, created_audit);
    DROP VIEW counted_links;
    CREATE VIEW counted_links AS
    SELECT l.code, l.long_url, l.owner, l.custom_alias, l.created_at, l.expires_at,
           l.disabled_at,
           l.clicks + coalesce(t.clicks, 0)
             + coalesce((SELECT sum(d.clicks) FROM daily_clicks d WHERE d.code = l.code), 0)
             AS clicks,
           l.bot_clicks + coalesce(t.bot_clicks, 0)
             + coalesce((SELECT sum(d.bot_clicks) FROM daily_clicks d WHERE d.code = l.code), 0)
             AS bot_clicks,
           l.created_ip, l.version, l.disabled_reason, l.disabled_by, l.disabled_by_kind,
           l.deleted_at, l.owner_admin, l.created_audit AS seq
      FROM links l LEFT JOIN link_clicks t ON t.code = l.code;
    ",
];

/// Schema version this binary writes.
pub(crate) const CURRENT_VERSION: usize = MIGRATIONS.len();

/// Errors of bringing a database file to the current schema.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrationError {
    #[error(
        "the database has schema version {found}, newer than this binary's {CURRENT_VERSION}; upgrade the binary"
    )]
    TooNew { found: usize },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Applies the missing migrations, each in its own immediate transaction so that two
/// processes opening one file at once never apply one twice.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), MigrationError> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version: usize = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > CURRENT_VERSION {
            return Err(MigrationError::TooNew { found: version });
        }
        let Some(sql) = MIGRATIONS.get(version) else {
            return Ok(());
        };
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
        tracing::info!(version = version + 1, "applied schema migration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{bound, placeholder};
    use crate::store::{PAGE_SEQ_INDEX, link_page_sql};
    use shortener_core::listing::{LinkCursor, LinkQuery};

    /// A store as a build of schema `version` left it.
    #[allow(clippy::unwrap_used)]
    fn at_version(version: usize) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..version] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", version).unwrap();
        conn
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn tokens_issued_before_v5_keep_working_and_are_listed() {
        let mut conn = at_version(4);
        conn.execute(
            "INSERT INTO tokens (hash, user_name, admin, created_at) VALUES (?1, 'old', 0, 5)",
            [&[7u8; 32][..]],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let row: (String, Option<String>, Option<i64>) = conn
            .query_row(
                "SELECT user_name, name, last_used_at FROM tokens WHERE substr(hash, 1, 6) = ?1",
                [&[7u8; 6][..]],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(row, ("old".to_owned(), None, None));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn days_counted_before_v6_keep_their_counts_and_have_no_visitors_yet() {
        let mut conn = at_version(5);
        conn.execute(
            "INSERT INTO daily_clicks (code, day, clicks, bot_clicks) VALUES ('old', 20000, 7, 2)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let version: usize = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, CURRENT_VERSION);
        let row: (i64, i64, Option<Vec<u8>>, Option<String>) = conn
            .query_row(
                "SELECT clicks, bot_clicks, visitors, tops FROM daily_clicks WHERE code = 'old'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(row, (7, 2, None, None));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn totals_counted_before_v7_are_kept_and_added_to() {
        let mut conn = at_version(6);
        conn.execute(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at, clicks, bot_clicks) \
             VALUES ('old', 'https://example.com/', 0, 1, 9, 7, 2)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let totals = |conn: &Connection| -> (i64, i64) {
            conn.query_row(
                "SELECT clicks, bot_clicks FROM counted_links WHERE code = 'old'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        };
        assert_eq!(totals(&conn), (7, 2));
        conn.execute(
            "INSERT INTO link_clicks (code, clicks, bot_clicks) VALUES ('old', 3, 1)",
            [],
        )
        .unwrap();
        assert_eq!(totals(&conn), (10, 3));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn totals_stay_exact_through_v9_and_the_prunes_after_it() {
        use crate::store::sqlite::clicks::{add_clicks, prune_days_before};
        use shortener_core::day::Day;
        use shortener_core::store::ClickDelta;

        let mut conn = at_version(8);
        // `a`: 4 clicks counted before v7; since then day 19 000 (pruned), 19 990 (old, not
        // yet pruned) and 20 020 (live). `b`: its live day counted before v7 only. `c`: none.
        conn.execute_batch(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at, clicks, bot_clicks) \
             VALUES ('a', 'https://example.com/a', 0, 1, 9, 4, 1), \
                    ('b', 'https://example.com/b', 0, 1, 9, 9, 0), \
                    ('c', 'https://example.com/c', 0, 1, 9, 0, 0);
             INSERT INTO daily_clicks (code, day, clicks, bot_clicks) \
             VALUES ('a', 19990, 6, 2), ('a', 20020, 7, 3), ('b', 20020, 9, 0);
             INSERT INTO link_clicks (code, clicks, bot_clicks) VALUES ('a', 18, 6);",
        )
        .unwrap();
        let totals = |conn: &Connection| -> Vec<(String, i64, i64)> {
            conn.prepare("SELECT code, clicks, bot_clicks FROM counted_links ORDER BY code")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let expected = |a: (i64, i64)| {
            vec![
                ("a".to_owned(), a.0, a.1),
                ("b".to_owned(), 9, 0),
                ("c".to_owned(), 0, 0),
            ]
        };
        assert_eq!(totals(&conn), expected((22, 7)));
        migrate(&mut conn).unwrap();
        assert_eq!(totals(&conn), expected((22, 7)));

        let tx = conn.transaction().unwrap();
        assert_eq!(prune_days_before(&tx, Day::from_number(20_000)).unwrap(), 1);
        tx.commit().unwrap();
        assert_eq!(totals(&conn), expected((22, 7)));
        let days: i64 = conn
            .query_row(
                "SELECT count(*) FROM daily_clicks WHERE day < 20000",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(days, 0);

        // A flush after it adds to the live day alone, and to nothing for an unknown code.
        let delta = |code: &str, day: i32| ClickDelta {
            code: code.into(),
            day: Day::from_number(day),
            human: 2,
            bot: 1,
            people: None,
        };
        let tx = conn.transaction().unwrap();
        add_clicks(
            &tx,
            vec![
                delta("a", 20_020),
                delta("a", 20_021),
                delta("ghost", 20_021),
            ],
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(totals(&conn), expected((26, 9)));
        let pruned: (i64, i64) = conn
            .query_row(
                "SELECT clicks, bot_clicks FROM link_clicks WHERE code = 'a'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            pruned,
            (11, 3),
            "the days pruned before v9 and by the prune"
        );
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn links_created_before_v10_name_their_creation_row_which_leaves_the_code_index() {
        let mut conn = at_version(9);
        conn.execute_batch(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at) \
             VALUES ('old', 'https://example.com/', 0, 1, 9), \
                    ('pruned', 'https://example.com/p', 0, 1, 9);
             INSERT INTO audit (at, actor, action, code, new_url) \
             VALUES (1, 'cli', 'created', 'old', 'https://example.com/'), \
                    (2, 'cli', 'disabled', 'old', NULL), \
                    (3, 'cli', 'token_issued', NULL, NULL);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let pointer = |code: &str| -> Option<i64> {
            conn.query_row(
                "SELECT created_audit FROM links WHERE code = ?1",
                [code],
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(pointer("old"), Some(1));
        // Its creation row pruned by age: nothing to point to (v11 then numbers it below
        // every row id, for the list's order).
        assert_eq!(pointer("pruned"), Some(-1));
        let indexed: Vec<i64> = conn
            .prepare("SELECT id FROM audit INDEXED BY audit_code WHERE code = 'old' AND action <> 'created'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(indexed, [2]);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn links_before_v11_keep_their_list_order_and_later_ones_list_first() {
        let mut conn = at_version(10);
        conn.execute_batch(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at, created_audit) \
             VALUES ('a', 'https://example.com/a', 0, 5, 99, 10), \
                    ('b', 'https://example.com/b', 0, 5, 99, 12), \
                    ('c', 'https://example.com/c', 0, 5, 99, 11), \
                    ('x1', 'https://example.com/x1', 0, 3, 99, NULL), \
                    ('x2', 'https://example.com/x2', 0, 3, 99, NULL), \
                    ('y', 'https://example.com/y', 0, 4, 99, NULL);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        // Created after the upgrade, in the same second as the first three.
        conn.execute_batch(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at, created_audit) \
             VALUES ('d', 'https://example.com/d', 0, 5, 99, 13)",
        )
        .unwrap();
        let query = LinkQuery::new(None, 0, 10);
        let (sql, values) = link_page_sql(&query, "counted_links", placeholder, "instr");
        let listed: Vec<(String, i64)> = conn
            .prepare(&sql)
            .unwrap()
            .query_map(bound(values), |r| Ok((r.get(0)?, r.get(PAGE_SEQ_INDEX)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        // Ties of one second newest first by their creation rows; links without one (pruned
        // before v10) below them, in the order of their former list (code descending).
        assert_eq!(
            listed,
            [
                ("d".into(), 13),
                ("b".into(), 12),
                ("c".into(), 11),
                ("a".into(), 10),
                ("y".into(), -1),
                ("x2".into(), -2),
                ("x1".into(), -3)
            ]
        );
    }

    /// A create's entries go at the ends of the list indexes, and a page reads them in order:
    /// the page queries sort nothing.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn link_pages_read_an_index_in_order() {
        let conn = at_version(CURRENT_VERSION);
        let cursor = Some(LinkCursor {
            created_at: 5,
            seq: 3,
        });
        for (owner, after, index) in [
            (None, None, "links_created"),
            (Some("alice"), None, "links_owner_created"),
            (Some("alice"), cursor.clone(), "links_owner_created"),
            (None, cursor, "links_created"),
        ] {
            let query = LinkQuery {
                after,
                ..LinkQuery::new(owner.map(str::to_owned), 0, 20)
            };
            let (sql, values) = link_page_sql(&query, "counted_links", placeholder, "instr");
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(bound(values), |r| r.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let plan = plan.join("; ");
            assert!(plan.contains(&format!("USING INDEX {index}")), "{plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{plan}");
        }
    }
}
