//! The embedded store's own rules, against a real file.

use super::*;

fn link(code: &str) -> Link {
    Link {
        custom_alias: true,
        ..Link::new(code, "https://example.com/", 0, i64::MAX)
    }
}

fn batch(id: &str, code: &str, human: u64) -> ClickBatch {
    ClickBatch {
        id: id.to_owned(),
        deltas: vec![ClickDelta {
            code: code.into(),
            day: Day::from_unix(crate::now()),
            human,
            bot: 1,
            people: Default::default(),
        }],
    }
}

#[tokio::test]
async fn a_click_batch_counts_once_however_often_it_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    store
        .insert_link(&link("promo"), &Origin::system("test"))
        .await
        .unwrap();
    let first = [batch("a-1", "promo", 5), batch("a-2", "promo", 7)];
    assert_eq!(store.apply_click_batches(&first).await.unwrap(), 2);
    // A replay of one, a new one, and the new one twice in the same call.
    let again = [
        batch("a-2", "promo", 7),
        batch("b-1", "promo", 100),
        batch("b-1", "promo", 100),
    ];
    assert_eq!(store.apply_click_batches(&again).await.unwrap(), 1);
    let stored = store.get_link("promo").await.unwrap().unwrap();
    assert_eq!((stored.clicks, stored.bot_clicks), (112, 3));
    let daily = store
        .daily_clicks("promo", Day::from_unix(crate::now()))
        .await
        .unwrap();
    assert_eq!(daily.iter().map(|d| d.human).sum::<u64>(), 112);
}

#[tokio::test]
async fn batches_past_one_statement_add_every_day_of_every_known_code() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let codes: Vec<String> = (0..150).map(|i| format!("c{i:03}")).collect();
    for code in &codes {
        store
            .insert_link(&link(code), &Origin::system("test"))
            .await
            .unwrap();
    }
    let today = Day::from_unix(crate::now());
    let delta = |code: &str, day: Day, human: u64| ClickDelta {
        code: code.into(),
        day,
        human,
        bot: 1,
        people: Default::default(),
    };
    // Two days a code, a pair repeated, and a code no link has: the 301 counted deltas
    // go in upserts of 64, 64, 64, 64, 32, 8, 4 and 1.
    let mut deltas = vec![delta("c007", today, 4), delta("ghost", today, 9)];
    for code in &codes {
        deltas.push(delta(code, today, 2));
        deltas.push(delta(code, today.minus(1), 1));
    }
    for _ in 0..2 {
        store.apply_clicks(deltas.clone()).await.unwrap();
    }
    for code in &codes {
        let extra = if code == "c007" { 4 } else { 0 };
        let stored = store.get_link(code).await.unwrap().unwrap();
        assert_eq!(
            (stored.clicks, stored.bot_clicks),
            (6 + 2 * extra, 4 + 2 * (extra / 4))
        );
        let days: Vec<(u64, u64)> = store
            .daily_clicks(code, today.minus(1))
            .await
            .unwrap()
            .iter()
            .map(|d| (d.human, d.bot))
            .collect();
        assert_eq!(
            days,
            [(2, 2), (4 + 2 * extra, 2 + 2 * (extra / 4))],
            "{code}"
        );
    }
    assert_eq!(store.get_link("ghost").await.unwrap(), None);
    assert!(store.daily_clicks("ghost", today).await.unwrap().is_empty());
}
