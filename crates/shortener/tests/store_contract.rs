//! The store contract (`LinkStore` + `ClickSink`), run against every store: the embedded
//! SQLite one and PostgreSQL. Both must behave the same to the rest of the service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use shortener::store::Store;
use shortener::store::sqlite::SqliteStore;
use shortener_core::day::Day;
use shortener_core::link::Link;
use shortener_core::store::{
    ClickBatch, ClickDelta, DailyCount, InsertOutcome, StoreError, TokenRecord,
};
use shortener_core::token::{Principal, TokenHash};

fn link(code: &str, long_url: &str) -> Link {
    Link {
        code: code.to_owned(),
        long_url: long_url.to_owned(),
        owner: None,
        custom_alias: false,
        created_at: 1_700_000_000,
        expires_at: 1_900_000_000,
        disabled_at: None,
        clicks: 0,
        bot_clicks: 0,
        created_ip: None,
    }
}

fn delta(code: &str, day: i32, human: u64, bot: u64) -> ClickDelta {
    ClickDelta {
        code: code.to_owned(),
        day: Day::from_number(day),
        human,
        bot,
    }
}

async fn days(store: &dyn Store, code: &str, since: i32) -> Vec<(i32, u64, u64)> {
    let mut out: Vec<_> = store
        .daily_clicks(code, Day::from_number(since))
        .await
        .unwrap()
        .into_iter()
        .map(|DailyCount { day, human, bot }| (day.number(), human, bot))
        .collect();
    out.sort_unstable();
    out
}

async fn contract(store: &dyn Store) {
    store.ping().await.unwrap();

    // Id blocks: consecutive, disjoint, of the asked size, from 0 on a fresh store.
    let a = store.lease_ids(10).await.unwrap();
    let b = store.lease_ids(5).await.unwrap();
    assert_eq!(a, 0..10);
    assert_eq!(b, 10..15);

    // The code key: the first candidate wins, later ones get it back.
    let key = store.code_key([7; 16]).await.unwrap();
    assert_eq!(key, [7; 16]);
    assert_eq!(store.code_key([9; 16]).await.unwrap(), [7; 16]);

    // Links: every field round-trips; put-if-absent never overwrites.
    let mut full = link("full-fields", "https://example.com/full");
    full.owner = Some("alice".into());
    full.custom_alias = true;
    full.created_ip = Some("192.0.2.7".into());
    full.clicks = 3;
    full.bot_clicks = 4;
    assert_eq!(
        store.insert_link(&full).await.unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(store.get_link("full-fields").await.unwrap(), Some(full));
    let plain = link("plain", "https://example.com/plain");
    assert_eq!(
        store.insert_link(&plain).await.unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(
        store
            .insert_link(&link("plain", "https://example.com/other"))
            .await
            .unwrap(),
        InsertOutcome::CodeTaken
    );
    assert_eq!(store.get_link("plain").await.unwrap(), Some(plain.clone()));
    assert_eq!(store.get_link("nothing").await.unwrap(), None);
    // Codes are case-sensitive.
    assert_eq!(store.get_link("PLAIN").await.unwrap(), None);

    // Disabling: unknown → false; the first instant stays.
    assert!(!store.disable_link("nothing", 5).await.unwrap());
    assert!(store.disable_link("plain", 100).await.unwrap());
    assert!(store.disable_link("plain", 200).await.unwrap());
    let disabled = store.get_link("plain").await.unwrap().unwrap();
    assert_eq!(disabled.disabled_at, Some(100));
    assert_eq!(disabled.long_url, plain.long_url);

    // Clicks: totals and days move together; unknown codes count nowhere; repeated
    // (code, day) pairs in one batch add up.
    let counted = link("counted", "https://example.com/counted");
    store.insert_link(&counted).await.unwrap();
    store.apply_clicks(&[]).await.unwrap();
    store
        .apply_clicks(&[
            delta("counted", 20_000, 2, 1),
            delta("counted", 20_001, 5, 0),
            delta("counted", 20_001, 1, 1),
            delta("ghost", 20_001, 9, 9),
            delta("full-fields", 20_001, 1, 0),
        ])
        .await
        .unwrap();
    store
        .apply_clicks(&[delta("counted", 20_001, 10, 0)])
        .await
        .unwrap();
    let after = store.get_link("counted").await.unwrap().unwrap();
    assert_eq!((after.clicks, after.bot_clicks), (18, 2));
    assert_eq!(
        days(store, "counted", 0).await,
        vec![(20_000, 2, 1), (20_001, 16, 1)]
    );
    assert_eq!(days(store, "counted", 20_001).await, vec![(20_001, 16, 1)]);
    assert_eq!(days(store, "ghost", 0).await, vec![]);
    assert_eq!(store.get_link("ghost").await.unwrap(), None);
    let full_after = store.get_link("full-fields").await.unwrap().unwrap();
    assert_eq!((full_after.clicks, full_after.bot_clicks), (4, 4));

    // Batches with ids count once, however often they come, in one call or several.
    let batch = |id: &str, human: u64| ClickBatch {
        id: id.to_owned(),
        deltas: vec![delta("batched", 20_001, human, 1)],
    };
    store
        .insert_link(&link("batched", "https://example.com/batched"))
        .await
        .unwrap();
    assert_eq!(store.apply_click_batches(&[]).await.unwrap(), 0);
    assert_eq!(
        store
            .apply_click_batches(&[batch("a-1", 5), batch("a-2", 7)])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .apply_click_batches(&[batch("a-2", 7), batch("b-1", 100), batch("b-1", 100)])
            .await
            .unwrap(),
        1
    );
    let batched = store.get_link("batched").await.unwrap().unwrap();
    assert_eq!((batched.clicks, batched.bot_clicks), (112, 3));
    assert_eq!(days(store, "batched", 0).await, vec![(20_001, 112, 3)]);

    // Pruning forgets old days, never totals.
    assert_eq!(
        store
            .prune_clicks_before(Day::from_number(20_001))
            .await
            .unwrap(),
        1
    );
    assert_eq!(days(store, "counted", 0).await, vec![(20_001, 16, 1)]);
    let pruned = store.get_link("counted").await.unwrap().unwrap();
    assert_eq!((pruned.clicks, pruned.bot_clicks), (18, 2));

    // Tokens: found by hash only; a hash is stored once.
    let token = TokenRecord {
        hash: TokenHash::of("shk_contract"),
        principal: Principal {
            user: "bob".into(),
            admin: true,
        },
        created_at: 1_700_000_000,
    };
    store.insert_token(&token).await.unwrap();
    assert_eq!(
        store.find_token(&token.hash).await.unwrap(),
        Some(token.principal.clone())
    );
    assert_eq!(
        store.find_token(&TokenHash::of("shk_other")).await.unwrap(),
        None
    );
    assert!(matches!(
        store.insert_token(&token).await,
        Err(StoreError::Backend(_))
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_store_keeps_the_contract() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    contract(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_keeps_the_contract() {
    let db = TestDb::migrated().await;
    let store = db.store(4).await;
    contract(&store).await;
}
