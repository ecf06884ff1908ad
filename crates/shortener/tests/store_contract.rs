//! The store contract (`LinkStore` + `ClickSink`), run against every store: the embedded
//! SQLite one and PostgreSQL. Both must behave the same to the rest of the service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::TestDb;
use common::records::{delta, link_at, origin};
use shortener::store::Store;
use shortener::store::sqlite::SqliteStore;
use shortener_core::audit::{AuditAction, AuditQuery, AuditRow, Origin};
use shortener_core::day::Day;
use shortener_core::link::{Actor, ActorKind, Link, LinkChange, LinkStatus, Refusal};
use shortener_core::listing::{LinkQuery, PageOfLinks};
use shortener_core::store::{
    ChangeOutcome, ClickBatch, DailyCount, InsertOutcome, StoreError, TokenInfo, TokenRecord,
};
use shortener_core::token::{Principal, TokenHash};

fn link(code: &str, long_url: &str) -> Link {
    link_at(code, long_url, false)
}

async fn days(store: &dyn Store, code: &str, since: i32) -> Vec<(i32, u64, u64)> {
    let mut out: Vec<_> = store
        .daily_clicks(code, Day::from_number(since))
        .await
        .unwrap()
        .into_iter()
        .map(
            |DailyCount {
                 day, human, bot, ..
             }| (day.number(), human, bot),
        )
        .collect();
    out.sort_unstable();
    out
}

/// A redirect's read of `code`, alone and among others, says what the full read says of it.
async fn assert_target_as_read(store: &dyn Store, code: &str) {
    let full = store
        .get_link(code)
        .await
        .unwrap()
        .as_ref()
        .map(Link::redirect_target);
    assert_eq!(store.redirect_target(code).await.unwrap(), full, "{code}");
    let codes = ["never-stored", code, code].map(str::to_owned);
    assert_eq!(
        store.redirect_targets(&codes).await.unwrap(),
        [None, full.clone(), full],
        "{code}"
    );
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
        store.insert_link(&full, &origin()).await.unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(store.get_link("full-fields").await.unwrap(), Some(full));
    let plain = link("plain", "https://example.com/plain");
    assert_eq!(
        store.insert_link(&plain, &origin()).await.unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(
        store
            .insert_link(&link("plain", "https://example.com/other"), &origin())
            .await
            .unwrap(),
        InsertOutcome::CodeTaken
    );
    assert_eq!(store.get_link("plain").await.unwrap(), Some(plain.clone()));
    assert_eq!(store.get_link("nothing").await.unwrap(), None);
    // Codes are case-sensitive.
    assert_eq!(store.get_link("PLAIN").await.unwrap(), None);
    for code in ["full-fields", "plain", "nothing", "PLAIN"] {
        assert_target_as_read(store, code).await;
    }

    // Creates write a change note each (a taken code none), so that processes holding the
    // code as unknown hear of it. PostgreSQL numbers them after their commit, when asked
    // (every serving process asks at each poll); the embedded store as it writes them.
    let numbered_at_once = store.last_change().await.unwrap();
    let numbered_later = store.number_pending_changes().await.unwrap();
    assert_eq!(numbered_at_once + numbered_later, 2);
    assert_eq!(store.last_change().await.unwrap(), 2);
    assert_eq!(store.number_pending_changes().await.unwrap(), 0);

    // Changes: one rule, a version per change, an audit row and a change note each, in
    // commit order; refusals and no-ops write nothing.
    let admin = Origin {
        actor: Actor {
            name: "root".into(),
            kind: ActorKind::Admin,
        },
        ip: Some("192.0.2.9".into()),
        user_agent: Some("curl/8".into()),
    };
    let disable = LinkChange::Disable {
        reason: "phishing".into(),
    };
    assert_eq!(
        store
            .change_link("nothing", &disable, &admin, 100)
            .await
            .unwrap(),
        ChangeOutcome::Refused(Refusal::NotFound)
    );
    let ChangeOutcome::Changed { before, after } = store
        .change_link("plain", &disable, &admin, 100)
        .await
        .unwrap()
    else {
        panic!("not disabled");
    };
    assert_eq!((before, after.version), (plain.clone(), 2));
    assert_eq!(store.get_link("plain").await.unwrap(), Some(after.clone()));
    assert_target_as_read(store, "plain").await;
    let disabled = after.disabled.clone().unwrap();
    assert_eq!(
        (
            disabled.at,
            disabled.reason.as_str(),
            disabled.by.as_str(),
            disabled.by_kind
        ),
        (100, "phishing", "root", ActorKind::Admin)
    );
    assert_eq!(
        store
            .change_link("plain", &disable, &admin, 200)
            .await
            .unwrap(),
        ChangeOutcome::Unchanged(after)
    );
    let bob = Origin {
        actor: Actor {
            name: "bob".into(),
            kind: ActorKind::User,
        },
        ip: None,
        user_agent: None,
    };
    assert_eq!(
        store
            .change_link("plain", &LinkChange::Enable, &bob, 300)
            .await
            .unwrap(),
        ChangeOutcome::Refused(Refusal::NotFound)
    );
    let enabled = store
        .change_link("plain", &LinkChange::Enable, &admin, 300)
        .await
        .unwrap();
    assert!(
        matches!(enabled, ChangeOutcome::Changed { after, .. } if after.version == 3 && after.disabled.is_none())
    );
    let deleted = store
        .change_link("plain", &LinkChange::Delete, &admin, 400)
        .await
        .unwrap();
    assert!(
        matches!(deleted, ChangeOutcome::Changed { after, .. } if after.deleted_at == Some(400))
    );
    assert_target_as_read(store, "plain").await;
    assert_eq!(
        store
            .change_link("plain", &LinkChange::Enable, &admin, 500)
            .await
            .unwrap(),
        ChangeOutcome::Refused(Refusal::Deleted)
    );
    assert_eq!(store.last_change().await.unwrap(), 5);
    let notes = store.changes_after(0, 10).await.unwrap();
    let notes: Vec<_> = notes
        .iter()
        .map(|n| (n.seq, n.code.as_str(), n.version))
        .collect();
    assert_eq!(
        notes,
        vec![
            (1, "full-fields", 1),
            (2, "plain", 1),
            (3, "plain", 2),
            (4, "plain", 3),
            (5, "plain", 4)
        ]
    );
    assert_eq!(store.changes_after(4, 10).await.unwrap().len(), 1);
    assert_eq!(store.changes_after(3, 1).await.unwrap()[0].seq, 4);

    // The audit trail: creates and changes, newest first, filtered, paged by id.
    let all = store
        .audit(&AuditQuery {
            limit: 100,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let actions: Vec<_> = all.iter().map(|r| r.record.action.as_str()).collect();
    assert_eq!(
        actions,
        ["deleted", "enabled", "disabled", "created", "created"]
    );
    assert!(all.windows(2).all(|w| w[0].id > w[1].id));
    let disabled_row = &all[2].record;
    assert_eq!(
        (
            disabled_row.actor.as_str(),
            disabled_row.ip.as_deref(),
            disabled_row.user_agent.as_deref(),
            disabled_row.code.as_deref(),
            disabled_row.old_url.as_deref(),
            disabled_row.detail.as_deref(),
            disabled_row.at,
        ),
        (
            "root",
            Some("192.0.2.9"),
            Some("curl/8"),
            Some("plain"),
            Some("https://example.com/plain"),
            Some("phishing"),
            100
        )
    );
    let page = |query: AuditQuery| async move { store.audit(&query).await.unwrap() };
    let plain_rows = page(AuditQuery {
        code: Some("plain".into()),
        action: Some(AuditAction::Created),
        limit: 10,
        ..AuditQuery::default()
    })
    .await;
    assert_eq!(plain_rows.len(), 1);
    assert_eq!(
        plain_rows[0].record.new_url.as_deref(),
        Some("https://example.com/plain")
    );
    // A code's whole trail, its creation included (found through the link on the embedded
    // store), newest first, limited and paged within the code.
    let by_plain = |limit: usize, before: Option<i64>| AuditQuery {
        code: Some("plain".into()),
        limit,
        before,
        ..AuditQuery::default()
    };
    let trail = page(by_plain(10, None)).await;
    let actions: Vec<_> = trail.iter().map(|r| r.record.action.as_str()).collect();
    assert_eq!(actions, ["deleted", "enabled", "disabled", "created"]);
    let ids = |rows: &[AuditRow]| rows.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(&page(by_plain(2, None)).await), ids(&trail[..2]));
    assert_eq!(
        ids(&page(by_plain(10, Some(trail[1].id))).await),
        ids(&trail[2..])
    );
    assert_eq!(
        ids(&page(by_plain(1, Some(trail[2].id))).await),
        ids(&trail[3..])
    );
    let window = page(AuditQuery {
        actor: Some("root".into()),
        since: Some(200),
        until: Some(400),
        limit: 10,
        ..AuditQuery::default()
    })
    .await;
    assert_eq!(window.len(), 1);
    assert_eq!(window[0].record.action, AuditAction::Enabled);
    let first = page(AuditQuery {
        limit: 2,
        ..AuditQuery::default()
    })
    .await;
    let second = page(AuditQuery {
        limit: 2,
        before: Some(first[1].id),
        ..AuditQuery::default()
    })
    .await;
    assert_eq!(second[0].id, all[2].id);

    // Retention prunes by age, in batches; change notes likewise.
    assert_eq!(store.prune_audit_before(300, 10).await.unwrap(), 1);
    assert_eq!(store.prune_audit_before(1_800_000_000, 1).await.unwrap(), 1);
    assert_eq!(
        store.prune_audit_before(1_800_000_000, 10).await.unwrap(),
        3
    );
    assert_eq!(
        store.prune_audit_before(1_800_000_000, 10).await.unwrap(),
        0
    );
    assert_eq!(store.prune_changes_before(400, 1).await.unwrap(), 1);
    assert_eq!(store.prune_changes_before(400, 10).await.unwrap(), 1);
    assert_eq!(store.prune_changes_before(400, 10).await.unwrap(), 0);
    assert_eq!(store.changes_after(2, 10).await.unwrap()[0].seq, 5);

    // Clicks: totals and days move together; unknown codes count nowhere; repeated
    // (code, day) pairs in one batch add up.
    let counted = link("counted", "https://example.com/counted");
    store.insert_link(&counted, &origin()).await.unwrap();
    store.apply_clicks(Vec::new()).await.unwrap();
    store
        .apply_clicks(vec![
            delta("counted", 20_000, 2, 1),
            delta("counted", 20_001, 5, 0),
            delta("counted", 20_001, 1, 1),
            delta("ghost", 20_001, 9, 9),
            delta("full-fields", 20_001, 1, 0),
        ])
        .await
        .unwrap();
    store
        .apply_clicks(vec![delta("counted", 20_001, 10, 0)])
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
        .insert_link(&link("batched", "https://example.com/batched"), &origin())
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
        name: Some("ci".into()),
    };
    store.insert_token(&token, &origin()).await.unwrap();
    let found = store.find_token(&token.hash).await.unwrap().unwrap();
    assert_eq!(
        (found.principal, found.last_used_at),
        (token.principal.clone(), None)
    );
    store.touch_token(&token.hash, 1_700_000_100).await.unwrap();
    // A late writer never moves "last used" backwards.
    store.touch_token(&token.hash, 1_700_000_050).await.unwrap();
    let listed = store.list_tokens().await.unwrap();
    assert_eq!(
        listed,
        [TokenInfo {
            id: token.hash.public_id(),
            principal: token.principal.clone(),
            name: Some("ci".into()),
            created_at: 1_700_000_000,
            last_used_at: Some(1_700_000_100),
        }]
    );
    assert_eq!(
        store.find_token(&TokenHash::of("shk_other")).await.unwrap(),
        None
    );
    assert!(matches!(
        store.insert_token(&token, &origin()).await,
        Err(StoreError::Backend(_))
    ));
    let issued = store
        .audit(&AuditQuery {
            action: Some(AuditAction::TokenIssued),
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    // The refused second insert left no row behind.
    assert_eq!(issued.len(), 1);
    assert_eq!(
        issued[0].record.detail.as_deref(),
        Some(format!("admin token {} for bob (ci)", token.hash.public_id()).as_str())
    );
    // Revoking: gone from lookups and the list, with its audit row; a second time, unknown.
    let revoked = store
        .revoke_token(token.hash.public_id(), &origin(), 1_700_000_200)
        .await
        .unwrap();
    assert_eq!(revoked, listed.into_iter().next());
    assert_eq!(store.find_token(&token.hash).await.unwrap(), None);
    assert!(store.list_tokens().await.unwrap().is_empty());
    assert_eq!(
        store
            .revoke_token(token.hash.public_id(), &origin(), 1_700_000_300)
            .await
            .unwrap(),
        None
    );
    let trail = store
        .audit(&AuditQuery {
            action: Some(AuditAction::TokenRevoked),
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(trail.len(), 1);
    assert_eq!(trail[0].record.at, 1_700_000_200);
}

/// The link list on a store of its own: order, keyset cursor, every filter, literal
/// substrings (no LIKE wildcards), status judged at the query's instant.
async fn list_contract(store: &dyn Store) {
    let owned = |code: &str, url: &str, owner: &str, created_at: i64| Link {
        owner: Some(owner.to_owned()),
        created_at,
        expires_at: created_at + 100,
        ..Link::new(code, url, created_at, created_at + 100)
    };
    for l in [
        owned("aaaa", "https://example.com/100%_off", "alice", 10),
        // cccc, then bbbb in the same second: ties list the later created (bbbb) first.
        owned("cccc", "https://example.com/c", "alice", 20),
        owned("bbbb", "https://example.com/b", "alice", 20),
        owned("dddd", "https://example.com/d", "bob", 30),
        owned("eeee", "https://example.com/e", "alice", 40),
    ] {
        assert_eq!(
            store.insert_link(&l, &origin()).await.unwrap(),
            InsertOutcome::Inserted
        );
    }
    let admin = Actor {
        name: "root".into(),
        kind: ActorKind::Admin,
    };
    let admin_origin = Origin {
        actor: admin,
        ip: None,
        user_agent: None,
    };
    let disable = LinkChange::Disable { reason: "x".into() };
    store
        .change_link("bbbb", &disable, &admin_origin, 50)
        .await
        .unwrap();
    store
        .change_link("eeee", &LinkChange::Delete, &admin_origin, 50)
        .await
        .unwrap();
    let codes = |page: PageOfLinks| page.links.into_iter().map(|l| l.code).collect::<Vec<_>>();
    let alice = |limit| LinkQuery::new(Some("alice".into()), 115, limit);

    assert_eq!(
        codes(store.list_links(&alice(10)).await.unwrap()),
        ["bbbb", "cccc", "aaaa"]
    );
    assert_eq!(
        codes(
            store
                .list_links(&LinkQuery::new(None, 115, 10))
                .await
                .unwrap()
        ),
        ["dddd", "bbbb", "cccc", "aaaa"]
    );
    // Pages of one continue after (created_at, creation order), ties included; the last
    // full page's cursor leads to an empty one, which has none.
    let mut page = alice(1);
    let mut seen = Vec::new();
    loop {
        let listed = store.list_links(&page).await.unwrap();
        assert!(listed.links.len() <= 1);
        let next = listed.next.clone();
        seen.extend(codes(listed));
        match next {
            Some(cursor) => page.after = Some(cursor),
            None => break,
        }
    }
    assert_eq!(seen, ["bbbb", "cccc", "aaaa"]);
    let two = store.list_links(&alice(2)).await.unwrap();
    assert!(two.next.is_some());
    let rest = LinkQuery {
        after: two.next,
        ..alice(2)
    };
    let last = store.list_links(&rest).await.unwrap();
    assert_eq!(
        (codes(last.clone()), last.next),
        (vec!["aaaa".to_owned()], None)
    );
    let filtered = |edit: &dyn Fn(&mut LinkQuery)| {
        let mut q = alice(10);
        edit(&mut q);
        q
    };
    for (query, expected) in [
        (filtered(&|q| q.contains = Some("%_".into())), vec!["aaaa"]),
        (filtered(&|q| q.contains = Some("_".into())), vec!["aaaa"]),
        (filtered(&|q| q.contains = Some("cc".into())), vec!["cccc"]),
        (filtered(&|q| q.contains = Some("CC".into())), vec![]),
        (
            filtered(&|q| q.status = Some(LinkStatus::Disabled)),
            vec!["bbbb"],
        ),
        // At 115 aaaa (expires at 110) is expired, cccc (120) active.
        (
            filtered(&|q| q.status = Some(LinkStatus::Expired)),
            vec!["aaaa"],
        ),
        (
            filtered(&|q| q.status = Some(LinkStatus::Active)),
            vec!["cccc"],
        ),
        (filtered(&|q| q.status = Some(LinkStatus::Deleted)), vec![]),
        (
            filtered(&|q| q.created_after = Some(20)),
            vec!["bbbb", "cccc"],
        ),
        (filtered(&|q| q.created_before = Some(20)), vec!["aaaa"]),
    ] {
        assert_eq!(
            codes(store.list_links(&query).await.unwrap()),
            expected,
            "{query:?}"
        );
    }
}

/// One-time tokens and leases, on two handles of one store (as two processes have): of
/// racing spends of a token exactly one wins, a lease runs until it ends or expires, and
/// finished work is not taken again.
async fn shared_jobs_contract(a: &dyn Store, b: &dyn Store) {
    let now = 1_700_000_000;
    let spends = futures_util::future::join_all(
        (0..16).map(|i| [a, b][i % 2].spend_once("challenge-1", now + 600, now)),
    )
    .await;
    let won = spends.into_iter().filter(|r| *r.as_ref().unwrap()).count();
    assert_eq!(won, 1);
    assert!(
        !b.spend_once("challenge-1", now + 600, now + 1)
            .await
            .unwrap()
    );
    assert!(a.spend_once("challenge-2", now + 5, now).await.unwrap());
    // Past its time a token is forgotten by a later spend (pruning), so it could be taken
    // again — which is why callers refuse expired challenges before spending them.
    assert!(
        b.spend_once("challenge-3", now + 600, now + 10)
            .await
            .unwrap()
    );
    assert!(
        a.spend_once("challenge-2", now + 5, now + 10)
            .await
            .unwrap()
    );

    let (lease, until) = ("sweep", now + 600);
    let takes = futures_util::future::join_all((0..8).map(|i| {
        let store = [a, b][i % 2];
        async move {
            store
                .take_lease(lease, &format!("h{i}"), "w1", until, now)
                .await
        }
    }))
    .await;
    let holders: Vec<usize> = (0..8).filter(|i| *takes[*i].as_ref().unwrap()).collect();
    assert_eq!(holders.len(), 1);
    let holder = format!("h{}", holders[0]);
    // Another holder's end changes nothing.
    b.end_lease(lease, "someone-else", Some("w1"))
        .await
        .unwrap();
    assert!(
        !a.take_lease(lease, "x", "w1", until, now + 1)
            .await
            .unwrap()
    );
    // Expired: taken over (its work unfinished).
    assert!(
        a.take_lease(lease, "x", "w1", now + 1200, until)
            .await
            .unwrap()
    );
    b.end_lease(lease, &holder, Some("w1")).await.unwrap();
    assert!(
        !b.take_lease(lease, "y", "w1", until, now + 2)
            .await
            .unwrap()
    );
    a.end_lease(lease, "x", Some("w1")).await.unwrap();
    // Ended with its work done: that work is not taken again, new work is.
    assert!(
        !b.take_lease(lease, "y", "w1", until, now + 3)
            .await
            .unwrap()
    );
    assert!(
        b.take_lease(lease, "y", "w2", until, now + 3)
            .await
            .unwrap()
    );
    // Ended without (a failed job): the same work is taken again.
    b.end_lease(lease, "y", None).await.unwrap();
    assert!(
        a.take_lease(lease, "z", "w2", until, now + 4)
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn both_stores_share_one_time_tokens_and_leases_alike() {
    let dir = tempfile::TempDir::new().unwrap();
    let (a, b) = (
        SqliteStore::open(dir.path()).unwrap(),
        SqliteStore::open(dir.path()).unwrap(),
    );
    shared_jobs_contract(&a, &b).await;
    let db = TestDb::migrated().await;
    shared_jobs_contract(&db.store(2).await, &db.store(2).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn both_stores_list_links_alike() {
    let dir = tempfile::TempDir::new().unwrap();
    list_contract(&SqliteStore::open(dir.path()).unwrap()).await;
    let db = TestDb::migrated().await;
    list_contract(&db.store(2).await).await;
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
