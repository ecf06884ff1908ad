//! The PostgreSQL store under concurrency, from many tasks over several pools (as many
//! instances would be). Each test has a database of its own; its schema's upgrades are
//! `postgres_schema.rs`'s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::records::{link_at, origin};
use shortener::store::postgres::PgStore;
use shortener_core::audit::Origin;
use shortener_core::day::Day;
use shortener_core::link::{Link, LinkChange};
use shortener_core::people::{Dimension, People, visitor_hash};
use shortener_core::store::{
    ClickBatch, ClickDelta, ClickSink, InsertOutcome, LinkStore, StoreError,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Pools per test and connections per pool: 4 × 4 stays far below `max_connections` while
/// tests run side by side.
const POOLS: usize = 4;
const POOL_SIZE: usize = 4;

async fn pools(db: &TestDb) -> Vec<Arc<PgStore>> {
    let mut stores = Vec::new();
    for _ in 0..POOLS {
        stores.push(Arc::new(db.store(POOL_SIZE).await));
    }
    stores
}

fn link(code: &str, long_url: &str) -> Link {
    link_at(code, long_url, true)
}

/// Changes `code`'s destination: a change note numbered in its own transaction.
async fn edit(store: &PgStore, code: &str) {
    let change = LinkChange::Edit {
        long_url: Some("https://example.com/edited".to_owned()),
        expires_at: None,
    };
    store
        .change_link(code, &change, &origin(), 1_700_000_100)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn id_blocks_leased_concurrently_are_disjoint_and_leave_no_gap() {
    let db = TestDb::migrated().await;
    let stores = pools(&db).await;
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for t in 0..8u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut ranges = Vec::new();
                for n in 0..40u64 {
                    // Varied sizes, so that an off-by-one in the arithmetic shows.
                    let size = 1 + (i as u64 * 7 + t * 3 + n) % 97;
                    let range = store.lease_ids(size).await.unwrap();
                    assert_eq!(range.end - range.start, size);
                    ranges.push(range);
                }
                ranges
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by_key(|r| r.start);
    let mut next = 0;
    for r in &all {
        assert_eq!(r.start, next, "gap or overlap at {r:?}");
        next = r.end;
    }
    assert_eq!(all.len(), POOLS * 8 * 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_alias_inserted_concurrently_has_exactly_one_winner() {
    let db = TestDb::migrated().await;
    let stores = pools(&db).await;
    for round in 0..5 {
        let code = format!("contested-{round}");
        let mut tasks = Vec::new();
        for i in 0..64 {
            let store = stores[i % POOLS].clone();
            let code = code.clone();
            tasks.push(tokio::spawn(async move {
                let outcome = store
                    .insert_link(&link(&code, &format!("https://example.com/{i}")), &origin())
                    .await
                    .unwrap();
                (outcome, i)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            if let (InsertOutcome::Inserted, i) = t.await.unwrap() {
                winners.push(i);
            }
        }
        assert_eq!(winners.len(), 1, "{code}: {winners:?}");
        let stored = stores[0].get_link(&code).await.unwrap().unwrap();
        assert_eq!(
            stored.long_url,
            format!("https://example.com/{}", winners[0])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_committed_in_groups_all_land_with_their_audit_rows() {
    let db = TestDb::migrated().await;
    let stores = pools(&db).await;
    let mut tasks = Vec::new();
    for i in 0..2_000 {
        let store = stores[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let origin = Origin {
                ip: Some(format!("192.0.2.{}", i % 250)),
                ..origin()
            };
            let code = format!("group-{i}");
            let outcome = store
                .insert_link(&link(&code, &format!("https://example.com/{i}")), &origin)
                .await
                .unwrap();
            (code, outcome)
        }));
    }
    for t in tasks {
        let (code, outcome) = t.await.unwrap();
        assert_eq!(outcome, InsertOutcome::Inserted);
        // Answered after the commit: another pool reads it at once.
        assert!(stores[3].get_link(&code).await.unwrap().is_some(), "{code}");
    }
    let client = db.client().await;
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM links").await, 2_000);
    assert_eq!(
        count(
            "SELECT count(*) FROM links l JOIN audit a ON a.code = l.code \
             AND a.action = 'created' AND a.new_url = l.long_url AND a.ip IS NOT NULL"
        )
        .await,
        2_000
    );

    // Their change notes, one per group, numbered by racing processes: each group once, at
    // positions 1..=groups.
    let numbering: Vec<_> = stores
        .iter()
        .map(|store| {
            let store = store.clone();
            tokio::spawn(async move { store.number_pending_changes().await.unwrap() })
        })
        .collect();
    let mut numbered = 0;
    for n in numbering {
        numbered += n.await.unwrap();
    }
    assert!((1..2_000).contains(&numbered), "{numbered} groups");
    assert_eq!(stores[0].last_change().await.unwrap(), numbered);
    assert_eq!(
        count("SELECT count(*) FROM link_changes").await,
        numbered as i64
    );
    let mut codes = Vec::new();
    let mut after = 0;
    loop {
        let notes = stores[1].changes_after(after, 700).await.unwrap();
        let Some(last) = notes.last() else { break };
        // Whole groups: at least the limit (or all that is left), each position complete.
        assert!(
            notes.len() >= 700 || last.seq == numbered,
            "{}",
            notes.len()
        );
        assert_eq!(notes[0].seq, after + 1);
        for pair in notes.windows(2) {
            assert!(pair[1].seq == pair[0].seq || pair[1].seq == pair[0].seq + 1);
        }
        after = last.seq;
        codes.extend(notes.into_iter().map(|note| {
            assert_eq!(note.version, 1);
            note.code
        }));
    }
    assert_eq!(after, numbered);
    assert_eq!(codes.len(), 2_000);
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), 2_000);
}

/// `changes_after` stops at whole positions once it has `limit` notes: a group's note is
/// never cut, and fewer than `limit` notes means nothing is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_group_note_is_read_whole_and_limits_count_notes() {
    let db = TestDb::migrated().await;
    let store = db.store(POOL_SIZE).await;
    store
        .insert_link(&link("alone", "https://example.com/0"), &origin())
        .await
        .unwrap();
    // A group of three (as a group commit writes it) and one of two, then an edit.
    db.client()
        .await
        .batch_execute(
            "INSERT INTO link_changes (seq, codes, versions, at) VALUES \
             (-1000000, '{g1,g2,g3}', '{1,1,1}', 0), (-1000001, '{h1,h2}', '{1,1}', 0)",
        )
        .await
        .unwrap();
    assert_eq!(store.number_pending_changes().await.unwrap(), 3);
    edit(&store, "alone").await;
    let read = |after, limit| {
        let store = &store;
        async move {
            store
                .changes_after(after, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|n| (n.seq, n.code, n.version))
                .collect::<Vec<_>>()
        }
    };
    let note = |seq, code: &str, version| (seq, code.to_owned(), version);
    let all = vec![
        note(1, "alone", 1),
        note(2, "g1", 1),
        note(2, "g2", 1),
        note(2, "g3", 1),
        note(3, "h1", 1),
        note(3, "h2", 1),
        note(4, "alone", 2),
    ];
    assert_eq!(read(0, 100).await, all);
    assert_eq!(read(0, 1).await, all[..1]);
    assert_eq!(read(0, 2).await, all[..4]);
    assert_eq!(read(0, 4).await, all[..4]);
    assert_eq!(read(0, 5).await, all[..6]);
    assert_eq!(read(1, 1).await, all[1..4]);
    assert_eq!(read(3, 10).await, all[6..]);
    assert!(read(4, 10).await.is_empty());
    // Pruning counts positions (the groups' notes are the old ones here).
    assert_eq!(store.prune_changes_before(1, 10).await.unwrap(), 2);
    assert_eq!(read(0, 100).await, [all[0].clone(), all[6].clone()]);
    // A malformed note is refused by the schema.
    let refused = db
        .client()
        .await
        .batch_execute(
            "INSERT INTO link_changes (seq, codes, versions, at) VALUES (-5, '{a,b}', '{1}', 0)",
        )
        .await;
    assert!(refused.is_err());
}

/// A create's note committed after notes numbered later than it began (a slow group) is
/// numbered after them: a poller that read up to there still reads it.
#[tokio::test(flavor = "multi_thread")]
async fn a_note_committed_late_is_numbered_after_every_note_read_before() {
    let db = TestDb::migrated().await;
    let store = db.store(POOL_SIZE).await;
    store
        .insert_link(&link("first", "https://example.com/1"), &origin())
        .await
        .unwrap();
    // A group still committing: its note is written, not yet committed.
    let mut client = db.client().await;
    let slow = client.transaction().await.unwrap();
    slow.execute(
        "INSERT INTO link_changes (seq, code, version, at) VALUES (-1000000, 'slow', 1, 0)",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(store.number_pending_changes().await.unwrap(), 1);
    edit(&store, "first").await;
    let read: Vec<u64> = store
        .changes_after(0, 10)
        .await
        .unwrap()
        .iter()
        .map(|n| n.seq)
        .collect();
    assert_eq!(read, [1, 2]);
    slow.commit().await.unwrap();
    assert_eq!(store.number_pending_changes().await.unwrap(), 1);
    let late = store.changes_after(2, 10).await.unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].seq, late[0].code.as_str()), (3, "slow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn click_batches_applied_concurrently_count_exactly() {
    let db = TestDb::migrated().await;
    let stores = pools(&db).await;
    let codes: Vec<String> = (0..12).map(|i| format!("link-{i}")).collect();
    // Two codes no link has: each batch that meets one inserts its day's row and deletes it
    // again before the commit, while other batches wait on that row.
    let ghosts = ["link-3", "link-8"];
    for code in codes.iter().filter(|c| !ghosts.contains(&c.as_str())) {
        stores[0]
            .insert_link(&link(code, "https://example.com/"), &origin())
            .await
            .unwrap();
    }
    let codes = Arc::new(codes);
    let mut tasks = Vec::new();
    for w in 0..16usize {
        let store = stores[w % POOLS].clone();
        let codes = codes.clone();
        tasks.push(tokio::spawn(async move {
            let mut applied: HashMap<(String, i32), (u64, u64)> = HashMap::new();
            for n in 0..30usize {
                // Overlapping code sets in different orders from every writer: the worst
                // case for lock ordering.
                let mut batch = Vec::new();
                for k in 0..6 {
                    let code = &codes[(w * 5 + n * 7 + k * 11) % codes.len()];
                    let day = 20_000 + ((w + n + k) % 3) as i32;
                    let (human, bot) = ((w + k) as u64 % 4 + 1, (n + k) as u64 % 2);
                    batch.push(ClickDelta {
                        code: code.as_str().into(),
                        day: Day::from_number(day),
                        human,
                        bot,
                        people: Default::default(),
                    });
                    let e = applied.entry((code.clone(), day)).or_default();
                    e.0 += human;
                    e.1 += bot;
                }
                if w % 2 == 1 {
                    batch.reverse();
                }
                store.apply_clicks(batch).await.unwrap();
            }
            applied
        }));
    }
    let mut expected: HashMap<(String, i32), (u64, u64)> = HashMap::new();
    for t in tasks {
        for (key, (h, b)) in t.await.unwrap() {
            let e = expected.entry(key).or_default();
            e.0 += h;
            e.1 += b;
        }
    }
    let ghost_rows: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM click_days WHERE code = ANY($1)",
            &[&ghosts.as_slice()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ghost_rows, 0, "clicks of codes no link has count nowhere");
    for code in codes.iter().filter(|c| !ghosts.contains(&c.as_str())) {
        let got = stores[1].get_link(code).await.unwrap().unwrap();
        let (mut human, mut bot) = (0, 0);
        let mut want_days: Vec<(i32, u64, u64)> = expected
            .iter()
            .filter(|((c, _), _)| c == code)
            .map(|((_, d), &(h, b))| {
                human += h;
                bot += b;
                (*d, h, b)
            })
            .collect();
        want_days.sort_unstable();
        assert_eq!((got.clicks, got.bot_clicks), (human, bot), "{code}");
        let mut got_days: Vec<(i32, u64, u64)> = stores[2]
            .daily_clicks(code, Day::from_number(0))
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.day.number(), d.human, d.bot))
            .collect();
        got_days.sort_unstable();
        assert_eq!(got_days, want_days, "{code}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn click_batches_delivered_to_several_aggregators_at_once_count_once() {
    let db = TestDb::migrated().await;
    let stores = pools(&db).await;
    let codes = ["one", "two", "three"];
    for code in codes {
        stores[0]
            .insert_link(&link(code, "https://example.com/"), &origin())
            .await
            .unwrap();
    }
    // 120 batches, each of 1..=3 clicks on one code; every aggregator gets all of them, in
    // chunks and orders of its own (a redelivered stream, consumers that overlap).
    let batches: Vec<ClickBatch> = (0..120u64)
        .map(|i| ClickBatch {
            id: format!("stream-{i}"),
            deltas: vec![ClickDelta {
                code: codes[(i % 3) as usize].into(),
                day: Day::from_number(20_000 + (i % 2) as i32),
                human: i % 3 + 1,
                bot: i % 2,
                people: Default::default(),
            }],
        })
        .collect();
    let batches = Arc::new(batches);
    let mut tasks = Vec::new();
    for w in 0..8usize {
        let (store, batches) = (stores[w % POOLS].clone(), batches.clone());
        tasks.push(tokio::spawn(async move {
            let mut order: Vec<&ClickBatch> = batches.iter().collect();
            order.rotate_left(w * 15);
            if w % 2 == 1 {
                order.reverse();
            }
            let mut fresh = 0;
            for chunk in order.chunks(7 + w) {
                let chunk: Vec<ClickBatch> = chunk.iter().map(|b| (*b).clone()).collect();
                fresh += store.apply_click_batches(&chunk).await.unwrap();
            }
            fresh
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        fresh += t.await.unwrap();
    }
    assert_eq!(fresh, 120, "every batch is new exactly once");
    for (k, code) in codes.iter().enumerate() {
        let (human, bot) = batches
            .iter()
            .filter(|b| &*b.deltas[0].code == *code)
            .fold((0, 0), |(h, b), batch| {
                (h + batch.deltas[0].human, b + batch.deltas[0].bot)
            });
        let got = stores[k % POOLS].get_link(code).await.unwrap().unwrap();
        assert_eq!((got.clicks, got.bot_clicks), (human, bot), "{code}");
        let days: u64 = stores[0]
            .daily_clicks(code, Day::from_number(0))
            .await
            .unwrap()
            .iter()
            .map(|d| d.human)
            .sum();
        assert_eq!(days, human, "{code}");
    }
}

/// A late batch adding to a day the prune is forgetting: whichever commits first, the prune
/// moves what the day holds at its delete into the link's totals, so no click is lost. Here
/// the batch holds the day's row when the prune starts and commits while the prune waits.
#[tokio::test(flavor = "multi_thread")]
async fn a_prune_racing_a_late_batch_loses_no_click() {
    let db = TestDb::migrated().await;
    let store = Arc::new(db.store(2).await);
    store
        .insert_link(&link("late", "https://example.com/"), &origin())
        .await
        .unwrap();
    let old = Day::from_number(20_000);
    let click = |human| ClickDelta {
        code: "late".into(),
        day: old,
        human,
        bot: 0,
        people: Default::default(),
    };
    store.apply_clicks(vec![click(5)]).await.unwrap();
    // The late batch's write, uncommitted: the row is locked until it ends.
    let batch = db.client().await;
    batch
        .batch_execute(
            "BEGIN; UPDATE click_days SET clicks = clicks + 3 WHERE code = 'late' AND day = 20000",
        )
        .await
        .unwrap();
    let prune = Arc::clone(&store);
    let pruned =
        tokio::spawn(async move { prune.prune_clicks_before(Day::from_number(20_001)).await });
    db.until_a_session_waits(|| !pruned.is_finished()).await;
    batch.batch_execute("COMMIT").await.unwrap();
    assert_eq!(pruned.await.unwrap().unwrap(), 1);
    let late = store.get_link("late").await.unwrap().unwrap();
    assert_eq!(late.clicks, 8);
    // And a batch after the prune starts the day anew, counted on top.
    store.apply_clicks(vec![click(2)]).await.unwrap();
    let late = store.get_link("late").await.unwrap().unwrap();
    assert_eq!(late.clicks, 10);
    assert_eq!(store.daily_clicks("late", old).await.unwrap()[0].human, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_click_batch_is_all_or_nothing() {
    let db = TestDb::migrated().await;
    let store = db.store(2).await;
    store
        .insert_link(&link("fine", "https://example.com/"), &origin())
        .await
        .unwrap();
    // One more click overflows this link's BIGINT count of the day: the statement fails.
    store
        .insert_link(&link("full", "https://example.com/"), &origin())
        .await
        .unwrap();
    let day = Day::from_number(20_000);
    db.client()
        .await
        .execute(
            "INSERT INTO click_days (code, day, clicks, bot_clicks) VALUES ('full', $1, $2, 0)",
            &[&day.number(), &i64::MAX],
        )
        .await
        .unwrap();
    let batch = [
        ClickDelta {
            code: "fine".into(),
            day,
            human: 3,
            bot: 1,
            people: Default::default(),
        },
        ClickDelta {
            code: "full".into(),
            day,
            human: 1,
            bot: 0,
            people: Default::default(),
        },
    ];
    assert!(matches!(
        store.apply_clicks(batch.to_vec()).await,
        Err(StoreError::Backend(_))
    ));
    let fine = store.get_link("fine").await.unwrap().unwrap();
    assert_eq!((fine.clicks, fine.bot_clicks), (0, 0));
    assert!(store.daily_clicks("fine", day).await.unwrap().is_empty());
    // The failed batch leaves the connection usable and nothing half-written.
    store.apply_clicks(batch[..1].to_vec()).await.unwrap();
    let fine = store.get_link("fine").await.unwrap().unwrap();
    assert_eq!((fine.clicks, fine.bot_clicks), (3, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_click_batch_past_one_statement_counts_every_known_code_and_its_people() {
    // Several statements' worth of codes (4 096 each), days and people, with ghosts.
    const CODES: usize = 9_000;
    let db = TestDb::migrated().await;
    db.client()
        .await
        .execute(
            "INSERT INTO links (code, long_url, custom_alias, created_at, expires_at) \
             SELECT 'c' || lpad(n::TEXT, 5, '0'), 'https://example.com/', FALSE, 1700000000, 1900000000 \
             FROM generate_series(0, $1::INT4 - 1) AS n",
            &[&(CODES as i32)],
        )
        .await
        .unwrap();
    let store = db.store(2).await;
    let (first, second) = (Day::from_number(20_000), Day::from_number(20_001));
    let mut deltas = Vec::new();
    for i in 0..CODES + 500 {
        let code = format!("c{i:05}");
        for day in [first, second] {
            let mut people = People::default();
            people.count(
                visitor_hash(
                    &[9; 16],
                    [192, 0, 2, (i % 200) as u8].into(),
                    "Firefox/131.0",
                ),
                &[(Dimension::Browsers, "Firefox")],
            );
            deltas.push(ClickDelta {
                code: code.as_str().into(),
                day,
                human: 1 + (i % 3) as u64,
                bot: (i % 2) as u64,
                people: (i % 5 == 0).then(|| Box::new(people)),
            });
        }
    }
    deltas.reverse();
    store.apply_clicks(deltas).await.unwrap();
    for i in [0, 4_095, 4_096, 8_191, 8_192, CODES - 1] {
        let code = format!("c{i:05}");
        let (human, bot) = (1 + (i % 3) as u64, (i % 2) as u64);
        let link = store.get_link(&code).await.unwrap().unwrap();
        assert_eq!(
            (link.clicks, link.bot_clicks),
            (2 * human, 2 * bot),
            "{code}"
        );
        let days = store.daily_clicks(&code, first).await.unwrap();
        assert_eq!(days.len(), 2, "{code}");
        for day in days {
            assert_eq!((day.human, day.bot), (human, bot), "{code}");
            assert_eq!(
                day.people.visitors.estimate(),
                u64::from(i % 5 == 0),
                "{code}"
            );
        }
    }
    let ghosts: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM click_days WHERE code >= $1",
            &[&format!("c{CODES:05}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ghosts, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_database_is_unavailable_not_an_error() {
    let db = TestDb::migrated().await;
    let mut relay = common::pg::relay().await;
    let url = common::pg::url_through(&relay, &db.url).parse().unwrap();
    let store = PgStore::open(&url, 2).await.unwrap();
    store
        .insert_link(&link("kept", "https://example.com/"), &origin())
        .await
        .unwrap();

    relay.cut().await;
    let started = std::time::Instant::now();
    for _ in 0..3 {
        assert!(matches!(
            store.get_link("kept").await,
            Err(StoreError::Unavailable(_))
        ));
    }
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.lease_ids(1).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // Back up: the pool reconnects by itself.
    relay.restore().await.unwrap();
    assert!(store.get_link("kept").await.unwrap().is_some());
}

/// The request path's statement bound of the pool under test.
const REQUEST_BOUND: Duration = Duration::from_millis(250);

/// Runs `work` while another session holds `LOCK TABLE table` and lets it go only once `work`
/// has waited on it for 4 × [`REQUEST_BOUND`] (or finished first); returns what `work` gave.
async fn behind_a_lock<T: Send + 'static>(
    db: &TestDb,
    table: &str,
    work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let blocker = db.client().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    let work = tokio::spawn(work);
    let watcher = db.client().await;
    let waited = (4 * REQUEST_BOUND).as_secs_f64();
    while !work.is_finished() {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' \
                 AND EXTRACT(EPOCH FROM clock_timestamp() - query_start)::FLOAT8 > $1",
                &[&waited],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    work.await.unwrap()
}

/// Pruning and the feed sweep's scan are background work: on a pool whose statements carry
/// the request path's `statement_timeout` they wait past it (their own, larger bound), where
/// a request's read behind the same lock gives up.
#[tokio::test(flavor = "multi_thread")]
async fn background_work_is_not_held_to_the_request_paths_statement_timeout() {
    let db = TestDb::migrated().await;
    let store = Arc::new(
        PgStore::open_bounded(&db.database_url(), 2, Some(REQUEST_BOUND))
            .await
            .unwrap(),
    );
    // One link: a live destination and an audit row.
    store
        .insert_link(&link("kept", "https://example.com/"), &origin())
        .await
        .unwrap();

    let request = Arc::clone(&store);
    let read = behind_a_lock(&db, "links", async move { request.get_link("kept").await }).await;
    assert!(
        matches!(read, Err(StoreError::Unavailable(_))),
        "a request's read gives up at the bound: {read:?}"
    );

    let sweep = Arc::clone(&store);
    let scanned = behind_a_lock(&db, "links", async move {
        sweep.live_destinations_after("", 10).await
    })
    .await
    .expect("the feed sweep's scan waits past the request bound");
    assert_eq!(
        scanned,
        vec![("kept".to_owned(), "https://example.com/".to_owned())]
    );

    // A change: a note in the change sequence and a second audit row.
    edit(&store, "kept").await;
    let number = Arc::clone(&store);
    let numbered = behind_a_lock(&db, "change_counter", async move {
        number.number_pending_changes().await
    })
    .await
    .expect("numbering change notes waits past the request bound");
    // The create's note (the edit numbered its own).
    assert_eq!(numbered, 1);
    let prune = Arc::clone(&store);
    let pruned = behind_a_lock(&db, "link_changes", async move {
        prune.prune_changes_before(i64::MAX, 1000).await
    })
    .await
    .expect("pruning change notes waits past the request bound");
    // The create's note and the edit's.
    assert_eq!(pruned, 2);

    let prune = Arc::clone(&store);
    let pruned = behind_a_lock(&db, "audit", async move {
        prune.prune_audit_before(i64::MAX, 1000).await
    })
    .await
    .expect("pruning the audit trail waits past the request bound");
    assert_eq!(pruned, 2);
}
