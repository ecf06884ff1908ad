//! The PostgreSQL store's schema: migrations raced and repeated, a schema this binary was not
//! built for refused, and each upgrade over rows the versions before it wrote. Each test has a
//! database of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::records::{delta, link_at, origin};
use shortener::store::postgres::{CURRENT_VERSION, OpenError, PgStore};
use shortener_core::day::Day;
use shortener_core::listing::LinkQuery;
use shortener_core::people::{Dimension, People, visitor_hash};
use shortener_core::store::{ClickDelta, ClickSink, InsertOutcome, LinkStore};
use std::sync::Arc;

const POOL_SIZE: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_are_idempotent_even_when_raced() {
    let db = TestDb::empty().await;
    let url = db.database_url();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            PgStore::migrate(&url).await.unwrap()
        }));
    }
    let mut applied = 0;
    for t in tasks {
        let report = t.await.unwrap();
        assert_eq!(report.version, CURRENT_VERSION);
        applied += report.applied;
    }
    assert_eq!(applied, usize::try_from(CURRENT_VERSION).unwrap());
    let again = PgStore::migrate(&url).await.unwrap();
    assert_eq!((again.applied, again.version), (0, CURRENT_VERSION));
    // The seed row of the counter exists once: leasing starts at 0.
    assert_eq!(db.store(1).await.lease_ids(3).await.unwrap(), 0..3);
}

/// Undoes v11 (the list's ties in creation order) on a database at v11.
const BACK_TO_V10: &str = "DROP VIEW counted_links; ALTER TABLE links DROP COLUMN seq; \
     CREATE INDEX links_owner_created ON links (owner, created_at, code); \
     CREATE INDEX links_created ON links (created_at, code); \
     CREATE VIEW counted_links AS \
     SELECT l.code, l.long_url, l.owner, l.custom_alias, l.created_at, l.expires_at, \
            l.disabled_at, l.clicks + COALESCE(t.clicks, 0) \
              + COALESCE((SELECT sum(d.clicks) FROM click_days d WHERE d.code = l.code), 0)::INT8 \
              AS clicks, \
            l.bot_clicks + COALESCE(t.bot_clicks, 0) \
              + COALESCE((SELECT sum(d.bot_clicks) FROM click_days d WHERE d.code = l.code), 0)::INT8 \
              AS bot_clicks, \
            l.created_ip, l.version, l.disabled_reason, l.disabled_by, l.disabled_by_kind, \
            l.deleted_at, l.owner_admin \
       FROM links l LEFT JOIN link_clicks t ON t.code = l.code; \
     DELETE FROM schema_migrations WHERE version >= 11";

/// Undoes v10 (days apart from totals) on a database at v10 whose links counted no click.
const BACK_TO_V9: &str = "DROP VIEW daily_clicks, counted_links; DROP TABLE link_clicks; \
     ALTER TABLE click_days RENAME TO daily_clicks; \
     ALTER INDEX click_days_day RENAME TO daily_clicks_day; \
     DELETE FROM schema_migrations WHERE version >= 10";

/// What a binary built for v9 runs on the days: a click batch's statements, its prune, and
/// its analytics read.
const V9_LOCK: &str = "SELECT code FROM links WHERE code = ANY($1::TEXT[]) \
     ORDER BY code COLLATE \"C\" FOR UPDATE";
const V9_TOTALS: &str = "UPDATE links AS l SET clicks = l.clicks + t.clicks, \
     bot_clicks = l.bot_clicks + t.bot_clicks \
     FROM unnest($1::TEXT[], $2::INT8[], $3::INT8[]) AS t (code, clicks, bot_clicks) \
     WHERE l.code = t.code";
const V9_DAYS: &str = "INSERT INTO daily_clicks (code, day, clicks, bot_clicks) \
     SELECT d.code, d.day, d.clicks, d.bot_clicks \
     FROM unnest($1::TEXT[], $2::INT4[], $3::INT8[], $4::INT8[]) AS d (code, day, clicks, bot_clicks) \
     WHERE EXISTS (SELECT 1 FROM links AS l WHERE l.code = d.code) \
     ON CONFLICT (code, day) DO UPDATE SET \
     clicks = daily_clicks.clicks + excluded.clicks, \
     bot_clicks = daily_clicks.bot_clicks + excluded.bot_clicks";
const V9_PEOPLE: &str = "UPDATE daily_clicks AS d SET visitors = t.visitors, tops = t.tops \
     FROM unnest($1::TEXT[], $2::INT4[], $3::BYTEA[], $4::TEXT[]) AS t (code, day, visitors, tops) \
     WHERE d.code = t.code AND d.day = t.day";
const V9_PRUNE: &str = "DELETE FROM daily_clicks WHERE day < $1";
const V9_READ: &str = "SELECT day, clicks, bot_clicks, visitors, tops FROM daily_clicks \
     WHERE code = $1 AND day >= $2";

/// A database taken back to v9 holding `links` (code, clicks, bot clicks; created a second
/// apart in that order) and the days' `rows` as v9 wrote them.
async fn at_v9(links: &[(&str, i64, i64)], rows: &str) -> TestDb {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(BACK_TO_V10).await.unwrap();
    client.batch_execute(BACK_TO_V9).await.unwrap();
    for (at, (code, clicks, bot)) in (1_700_000_000i64..).zip(links) {
        client
            .execute(
                "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at, \
                                    clicks, bot_clicks) \
                 VALUES ($1, 'https://example.com/', TRUE, $2, 1900000000, $3, $4)",
                &[code, &at, clicks, bot],
            )
            .await
            .unwrap();
    }
    client
        .batch_execute(&format!(
            "INSERT INTO daily_clicks (code, day, clicks, bot_clicks) VALUES {rows}"
        ))
        .await
        .unwrap();
    db
}

/// v11 over a database at v10: its links get numbers in the order the table holds them (here
/// their creation order), links created after list first among their second's, whether
/// created by this binary, by a v10 one (no `seq` in its column list), or by a role that may
/// insert rows but was granted no sequence.
#[tokio::test(flavor = "multi_thread")]
async fn links_before_v11_list_as_stored_and_later_ones_list_first() {
    let mut db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(BACK_TO_V10).await.unwrap();
    let v10_insert = |code: &str| {
        format!(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at) \
             VALUES ('{code}', 'https://example.com/', TRUE, 1700000000, 1900000000)"
        )
    };
    for code in ["b", "a", "c"] {
        client.batch_execute(&v10_insert(code)).await.unwrap();
    }
    let report = PgStore::migrate(&db.database_url()).await.unwrap();
    assert_eq!((report.applied, report.version), (1, CURRENT_VERSION));
    let store = db.store(1).await;
    let listed = || async {
        let page = store
            .list_links(&LinkQuery::new(None, 1_700_000_100, 10))
            .await
            .unwrap();
        page.links.into_iter().map(|l| l.code).collect::<Vec<_>>()
    };
    assert_eq!(listed().await, ["c", "a", "b"]);
    let inserted = store
        .insert_link(&link_at("new", "https://example.com/n", true), &origin())
        .await
        .unwrap();
    assert_eq!(inserted, InsertOutcome::Inserted);
    client.batch_execute(&v10_insert("0-v10")).await.unwrap();
    let url = db.non_owner().await;
    let role = url::Url::parse(&url).unwrap().username().to_owned();
    client
        .batch_execute(&format!(
            "REVOKE USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public FROM {role}"
        ))
        .await
        .unwrap();
    let (writer, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    writer.batch_execute(&v10_insert("1-role")).await.unwrap();
    assert_eq!(listed().await, ["1-role", "0-v10", "new", "c", "a", "b"]);
}

/// A v9 statement refused because the days' old name is a view now (and for no other reason).
fn refused_as_a_view(result: Result<u64, tokio_postgres::Error>) {
    let error = result.expect_err("a v9 write to the days succeeded");
    let message = error.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.starts_with("cannot ") && m.ends_with("view \"daily_clicks\"")),
        "{error:?}"
    );
}

/// A link's totals as the store reads them.
async fn totals(store: &PgStore, code: &str) -> (u64, u64) {
    let link = store.get_link(code).await.unwrap().unwrap();
    (link.clicks, link.bot_clicks)
}

/// v10 over a database at v9 with links whose totals count live days and pruned ones: every
/// total reads as before, counts on, and survives a prune; a binary built for v9 still running
/// (its statements prepared before the upgrade) can no longer write the days — its batch fails
/// whole instead of counting twice, its prune instead of dropping clicks — and still reads them.
#[tokio::test(flavor = "multi_thread")]
async fn totals_counted_before_v10_stay_exact_and_v9_binaries_cannot_write_days() {
    // 'a' has 10 + 3 clicks, 1 + 0 of them on a day pruned since; 'b' has only pruned days;
    // 'c' none.
    let db = at_v9(
        &[("a", 10, 3), ("b", 2, 0), ("c", 0, 0)],
        "('a', 20000, 4, 1), ('a', 20001, 5, 2)",
    )
    .await;
    let v9 = db.client().await;
    let v9_days = v9.prepare(V9_DAYS).await.unwrap();
    let v9_prune = v9.prepare(V9_PRUNE).await.unwrap();
    let v9_read = v9.prepare(V9_READ).await.unwrap();
    assert_eq!(v9.query(&v9_read, &[&"a", &0i32]).await.unwrap().len(), 2);

    let report = PgStore::migrate(&db.database_url()).await.unwrap();
    assert_eq!((report.applied, report.version), (2, CURRENT_VERSION));
    let store = db.store(2).await;
    for (code, expected) in [("a", (10, 3)), ("b", (2, 0)), ("c", (0, 0))] {
        assert_eq!(totals(&store, code).await, expected, "{code}");
    }
    let query = LinkQuery::new(None, 1_700_000_100, 10);
    let listed: Vec<_> = store
        .list_links(&query)
        .await
        .unwrap()
        .links
        .into_iter()
        .map(|l| (l.code, l.clicks, l.bot_clicks))
        .collect();
    assert_eq!(
        listed,
        [("c".into(), 0, 0), ("b".into(), 2, 0), ("a".into(), 10, 3)]
    );

    // The v9 binary: its batch (lock, totals, days) fails at the days and leaves nothing.
    let mut old = db.client().await;
    let (refused, tx) = v9_batch(&mut old, "a", 1).await;
    refused_as_a_view(refused);
    drop(tx);
    let days = (vec!["a"], vec![20001i32], vec![1i64], vec![0i64]);
    refused_as_a_view(
        v9.execute(&v9_days, &[&days.0, &days.1, &days.2, &days.3])
            .await,
    );
    let people = (
        Vec::<&str>::new(),
        Vec::<i32>::new(),
        Vec::<Vec<u8>>::new(),
        Vec::<&str>::new(),
    );
    refused_as_a_view(
        v9.execute(V9_PEOPLE, &[&people.0, &people.1, &people.2, &people.3])
            .await,
    );
    refused_as_a_view(v9.execute(&v9_prune, &[&20001i32]).await);
    assert_eq!(v9.query(&v9_read, &[&"a", &0i32]).await.unwrap().len(), 2);
    assert_eq!(totals(&store, "a").await, (10, 3));

    // This binary counts on, and its prune moves days into the totals.
    store
        .apply_clicks(vec![delta("a", 20001, 2, 0), delta("c", 20001, 1, 1)])
        .await
        .unwrap();
    assert_eq!(totals(&store, "a").await, (12, 3));
    assert_eq!(
        store
            .prune_clicks_before(Day::from_number(20001))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .prune_clicks_before(Day::from_number(20002))
            .await
            .unwrap(),
        2
    );
    for (code, expected) in [("a", (12, 3)), ("b", (2, 0)), ("c", (1, 1))] {
        assert_eq!(totals(&store, code).await, expected, "{code}");
    }
    assert!(
        store
            .daily_clicks("a", Day::from_number(0))
            .await
            .unwrap()
            .is_empty()
    );
}

/// The first statements of a v9 binary's click batch of `human` clicks on `code`: lock, totals,
/// and its days' upsert's result; the transaction stays open.
async fn v9_batch<'a>(
    v9: &'a mut tokio_postgres::Client,
    code: &str,
    human: i64,
) -> (
    Result<u64, tokio_postgres::Error>,
    tokio_postgres::Transaction<'a>,
) {
    let tx = v9.transaction().await.unwrap();
    tx.query(V9_LOCK, &[&vec![code]]).await.unwrap();
    tx.execute(V9_TOTALS, &[&vec![code], &vec![human], &vec![0i64]])
        .await
        .unwrap();
    let days = tx
        .execute(
            V9_DAYS,
            &[&vec![code], &vec![20000i32], &vec![human], &vec![0i64]],
        )
        .await;
    (days, tx)
}

/// `migrate` to v10 while v9 binaries' click batches are in flight. One that has written its
/// days holds their table: the migration waits for its commit and counts it. One that has
/// only updated totals meets the view at its days and rolls back whole (v11 waits for it).
/// Totals stay exact.
#[tokio::test(flavor = "multi_thread")]
async fn v9_batches_in_flight_during_the_upgrade_count_once_or_not_at_all() {
    let db = at_v9(&[("a", 4, 0), ("b", 0, 0)], "('a', 20000, 4, 0)").await;
    // 'b': lock and totals taken, days not yet written. 'a': written whole, not committed.
    let mut late = db.client().await;
    let tx_b = late.transaction().await.unwrap();
    tx_b.query(V9_LOCK, &[&vec!["b"]]).await.unwrap();
    tx_b.execute(V9_TOTALS, &[&vec!["b"], &vec![5i64], &vec![0i64]])
        .await
        .unwrap();
    let mut early = db.client().await;
    let (written, tx_a) = v9_batch(&mut early, "a", 3).await;
    assert_eq!(written.unwrap(), 1);
    let url = db.database_url();
    let migrate = tokio::spawn(async move { PgStore::migrate(&url).await });
    db.until_a_session_waits(|| !migrate.is_finished()).await;
    tx_a.commit().await.unwrap();
    // v10 committed once v11 waits on `links`, whose row 'b' holds: its batch goes on.
    db.until_a_lock_on_waits("links", || !migrate.is_finished())
        .await;
    refused_as_a_view(
        tx_b.execute(
            V9_DAYS,
            &[&vec!["b"], &vec![20000i32], &vec![5i64], &vec![0i64]],
        )
        .await,
    );
    drop(tx_b);
    assert_eq!(migrate.await.unwrap().unwrap().applied, 2);
    let store = db.store(1).await;
    assert_eq!(totals(&store, "a").await, (7, 0));
    assert_eq!(totals(&store, "b").await, (0, 0));
    let days = store.daily_clicks("a", Day::from_number(0)).await.unwrap();
    assert_eq!(days[0].human, 7);
}

/// Undoes v9 (notes' counts of codes) and v8 (change notes of many codes) on a database at v9
/// holding none of them.
const BACK_TO_V7: &str = "ALTER TABLE link_changes DROP COLUMN n_codes; \
     ALTER TABLE link_changes DROP CONSTRAINT link_changes_one_form, \
     DROP COLUMN codes, DROP COLUMN versions, \
     ALTER COLUMN code SET NOT NULL, ALTER COLUMN version SET NOT NULL; \
     DELETE FROM schema_migrations WHERE version >= 8";

/// A database migrated, then taken back to v7, and a connection to it.
async fn at_v7() -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(BACK_TO_V10).await.unwrap();
    client.batch_execute(BACK_TO_V9).await.unwrap();
    client.batch_execute(BACK_TO_V7).await.unwrap();
    (db, client)
}

/// v8 over a database at v7 whose creates' notes (one per create) are partly numbered,
/// partly still waiting: all are read as before, in order with the group notes after them.
#[tokio::test(flavor = "multi_thread")]
async fn notes_written_before_v8_are_numbered_and_read_with_group_notes() {
    let (db, client) = at_v7().await;
    // The store refuses a v7 schema, so its rows are written as v7's creates wrote them.
    client
        .batch_execute(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at) VALUES \
             ('v7-a', 'https://example.com/a', TRUE, 1700000000, 1900000000), \
             ('v7-b', 'https://example.com/b', TRUE, 1700000000, 1900000000), \
             ('v7-c', 'https://example.com/c', TRUE, 1700000000, 1900000000); \
             INSERT INTO audit (at, actor, action, code, new_url) VALUES \
             (1700000000, 'test', 'created', 'v7-a', 'https://example.com/a'), \
             (1700000000, 'test', 'created', 'v7-b', 'https://example.com/b'), \
             (1700000000, 'test', 'created', 'v7-c', 'https://example.com/c'); \
             INSERT INTO link_changes (seq, code, version, at) VALUES \
             (1, 'v7-a', 1, 1700000000), (-2, 'v7-b', 1, 1700000000), \
             (-3, 'v7-c', 1, 1700000000); \
             UPDATE change_counter SET seq = 1",
        )
        .await
        .unwrap();
    let report = PgStore::migrate(&db.database_url()).await.unwrap();
    assert_eq!((report.applied, report.version), (4, CURRENT_VERSION));
    let store = Arc::new(db.store(POOL_SIZE).await);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let code = format!("v8-{i}");
            store
                .insert_link(&link_at(&code, "https://example.com/v8", true), &origin())
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), InsertOutcome::Inserted);
    }
    let numbered = store.number_pending_changes().await.unwrap();
    assert!((3..=52).contains(&numbered), "{numbered}");
    let notes = store.changes_after(0, 1000).await.unwrap();
    let firsts: Vec<_> = notes[..3]
        .iter()
        .map(|n| (n.seq, n.code.as_str(), n.version))
        .collect();
    assert_eq!(firsts, [(1, "v7-a", 1), (2, "v7-b", 1), (3, "v7-c", 1)]);
    let mut later: Vec<_> = notes[3..].iter().map(|n| n.code.clone()).collect();
    assert_eq!(notes.last().unwrap().seq, numbered + 1);
    later.sort_unstable();
    let mut expected: Vec<_> = (0..50).map(|i| format!("v8-{i}")).collect();
    expected.sort_unstable();
    assert_eq!(later, expected);
}

/// v6 (visitors and breakdowns per day) over a database at v5: earlier days keep their
/// counts, read as having no people yet, and take people from then on.
#[tokio::test(flavor = "multi_thread")]
async fn days_counted_before_v6_keep_their_counts_and_gain_people() {
    // Back to v5: the migrations' columns and tables gone, their rows too.
    let (db, client) = at_v7().await;
    client
        .batch_execute(
            "ALTER TABLE daily_clicks DROP COLUMN visitors, DROP COLUMN tops; \
             DROP TABLE spent_tokens, leases; \
             DELETE FROM schema_migrations WHERE version >= 6",
        )
        .await
        .unwrap();
    // The store refuses a v5 schema, so its rows are written by hand.
    client
        .batch_execute(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at) \
             VALUES ('before-v6', 'https://example.com/', TRUE, 1700000000, 1900000000); \
             INSERT INTO daily_clicks (code, day, clicks, bot_clicks) \
             VALUES ('before-v6', 20000, 7, 2)",
        )
        .await
        .unwrap();
    let report = PgStore::migrate(&db.database_url()).await.unwrap();
    assert_eq!((report.applied, report.version), (6, CURRENT_VERSION));
    let store = db.store(1).await;
    let day = Day::from_number(20_000);
    let read = store.daily_clicks("before-v6", day).await.unwrap();
    assert_eq!((read[0].human, read[0].bot), (7, 2));
    assert!(read[0].people.is_empty());
    let mut people = People::default();
    for last in [1, 2] {
        let visitor = visitor_hash(&[9; 16], [192, 0, 2, last].into(), "Firefox/131.0");
        people.count(visitor, &[(Dimension::Browsers, "Firefox")]);
    }
    store
        .apply_clicks(vec![ClickDelta {
            code: "before-v6".into(),
            day,
            human: 2,
            bot: 0,
            people: Some(Box::new(people)),
        }])
        .await
        .unwrap();
    let read = store.daily_clicks("before-v6", day).await.unwrap();
    assert_eq!(read[0].human, 9);
    assert_eq!(read[0].people.visitors.estimate(), 2);
    assert_eq!(
        read[0].people.top(Dimension::Browsers).ranked(),
        vec![("Firefox".to_owned(), 2)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn open_refuses_a_missing_or_newer_schema() {
    let db = TestDb::empty().await;
    let url = db.database_url();
    let err = PgStore::open(&url, 1).await.unwrap_err();
    assert!(
        matches!(err, OpenError::SchemaBehind { found: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("shortener migrate"), "{err}");

    PgStore::migrate(&url).await.unwrap();
    PgStore::open(&url, 1).await.unwrap();

    db.client()
        .await
        .execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[&(CURRENT_VERSION + 1)],
        )
        .await
        .unwrap();
    let err = PgStore::open(&url, 1).await.unwrap_err();
    assert!(matches!(err, OpenError::SchemaAhead { .. }), "{err}");
    let err = PgStore::migrate(&url).await.unwrap_err();
    assert!(matches!(err, OpenError::SchemaAhead { .. }), "{err}");
}
