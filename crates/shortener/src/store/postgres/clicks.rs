//! Click batches on PostgreSQL: column arrays through `unnest` into the days' rows alone,
//! stream batches claimed by id so that each counts once; the prune moves the days it
//! forgets into the links' pruned totals (`link_clicks`), so every total stays exact.

use super::errors::{classify, is_retryable};
use super::{PgStore, background_transaction, to_i64, to_u64};
use crate::store::{merged_people, stored_people};
use async_trait::async_trait;
use deadpool_postgres::{Object, Transaction};
use shortener_core::day::Day;
use shortener_core::people::People;
use shortener_core::store::{ClickBatch, ClickDelta, ClickSink, StoreError};
use std::collections::{BTreeMap, HashSet};

/// Attempts of a click batch that lost a serialization race or a deadlock (CockroachDB
/// retries, PostgreSQL's deadlock detector); the aggregator retries later beyond these.
const CLICK_ATTEMPTS: u32 = 3;
/// Codes (or days, or people) per statement of a click batch. A statement's arrays are
/// encoded into its pooled connection's buffers, which keep their largest size: batches of
/// 50 000 codes sent whole made messages of megabytes, and the 16 connections held ~45 MiB
/// of them serving Zipf at 1 M links (BENCHMARKS.md).
const ROWS_PER_STATEMENT: usize = 4096;

/// The ranges of `len` rows, a statement each.
fn statements(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..len)
        .step_by(ROWS_PER_STATEMENT)
        .map(move |start| start..len.min(start + ROWS_PER_STATEMENT))
}

/// Adds clicks to their days' rows, inside the caller's transaction: the only table a batch
/// writes (schema v10). Deltas of codes no link has count nowhere, unless their day's row is
/// there already (a link deleted by hand after its day's first click): they add to it.
///
/// Only a day's first clicks of a code look `links` up, as on the embedded store: the upsert
/// returns the rows it inserted (`xmax = 0` marks a row version the statement created; one it
/// updated carries the lock its `ON CONFLICT` took), and those of codes no link has are
/// deleted again before the commit. A lookup of every row in the upsert itself was half
/// of the statement's time (4 096 rows updated: 46–59 ms with it, 19–31 without; a new day's
/// rows, all inserted, cost 1.0–1.4 × as much as before: BENCHMARKS.md).
///
/// Each statement takes a consecutive range of (code, day) keys in byte order
/// (`ClickColumns`) and writes them in that order whatever the plan (`ORDER BY`, `COLLATE
/// "C"`), so two batches over overlapping keys take their rows' locks in one order and queue
/// on their first common row instead of deadlocking.
async fn add_clicks(
    tx: &Transaction<'_>,
    clicks: &ClickColumns,
) -> Result<(), tokio_postgres::Error> {
    if clicks.days.is_empty() {
        return Ok(());
    }
    let daily = tx
        .prepare_cached(
            "WITH up AS (INSERT INTO click_days (code, day, clicks, bot_clicks) \
             SELECT d.code, d.day, d.clicks, d.bot_clicks \
             FROM unnest($1::TEXT[], $2::INT4[], $3::INT8[], $4::INT8[]) \
                  AS d (code, day, clicks, bot_clicks) \
             ORDER BY d.code COLLATE \"C\", d.day \
             ON CONFLICT (code, day) DO UPDATE SET \
             clicks = click_days.clicks + excluded.clicks, \
             bot_clicks = click_days.bot_clicks + excluded.bot_clicks \
             RETURNING code, day, xmax = 0 AS inserted) \
             SELECT code, day FROM up WHERE inserted",
        )
        .await?;
    let (mut new_codes, mut new_days): (Vec<String>, Vec<i32>) = (Vec::new(), Vec::new());
    for rows in statements(clicks.days.len()) {
        let (codes, days, human, bot) = (
            &clicks.day_codes[rows.clone()],
            &clicks.days[rows.clone()],
            &clicks.day_human[rows.clone()],
            &clicks.day_bot[rows],
        );
        for row in tx.query(&daily, &[&codes, &days, &human, &bot]).await? {
            new_codes.push(row.try_get(0)?);
            new_days.push(row.try_get(1)?);
        }
    }
    forget_rows_without_link(tx, &new_codes, &new_days).await?;
    add_people(tx, clicks).await
}

/// Deletes the given (code, day) rows, inserted by this transaction, whose code no link has.
async fn forget_rows_without_link(
    tx: &Transaction<'_>,
    codes: &[String],
    days: &[i32],
) -> Result<(), tokio_postgres::Error> {
    if codes.is_empty() {
        return Ok(());
    }
    let forget = tx
        .prepare_cached(
            "DELETE FROM click_days AS c \
             USING unnest($1::TEXT[], $2::INT4[]) AS k (code, day) \
             WHERE c.code = k.code AND c.day = k.day \
             AND NOT EXISTS (SELECT 1 FROM links AS l WHERE l.code = k.code)",
        )
        .await?;
    for rows in statements(codes.len()) {
        let (codes, days) = (&codes[rows.clone()], &days[rows]);
        tx.execute(&forget, &[&codes, &days]).await?;
    }
    Ok(())
}

/// Merges the people of each (code, day) into its row, which the upsert before has locked.
async fn add_people(
    tx: &Transaction<'_>,
    clicks: &ClickColumns,
) -> Result<(), tokio_postgres::Error> {
    if clicks.people.is_empty() {
        return Ok(());
    }
    let (all_codes, all_days): (Vec<&str>, Vec<i32>) = clicks
        .people
        .keys()
        .map(|(code, day)| (code.as_str(), *day))
        .unzip();
    let read = tx
        .prepare_cached(
            "SELECT d.code, d.day, d.visitors, d.tops FROM click_days AS d \
             JOIN unnest($1::TEXT[], $2::INT4[]) AS k (code, day) \
             ON d.code = k.code AND d.day = k.day",
        )
        .await?;
    let write = tx
        .prepare_cached(
            "UPDATE click_days AS d SET visitors = t.visitors, tops = t.tops \
             FROM unnest($1::TEXT[], $2::INT4[], $3::BYTEA[], $4::TEXT[]) \
                  AS t (code, day, visitors, tops) \
             WHERE d.code = t.code AND d.day = t.day",
        )
        .await?;
    for rows in statements(all_codes.len()) {
        let (codes, days) = (&all_codes[rows.clone()], &all_days[rows]);
        let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for row in tx.query(&read, &[&codes, &days]).await? {
            let key: (String, i32) = (row.try_get(0)?, row.try_get(1)?);
            let Some(delta) = clicks.people.get(&key) else {
                continue;
            };
            let stored = stored_people(row.try_get(2)?, row.try_get(3)?);
            let people = merged_people(stored, delta);
            columns.0.push(key.0);
            columns.1.push(key.1);
            columns.2.push(people.visitors.to_bytes());
            columns.3.push(people.tops_to_text());
        }
        tx.execute(&write, &[&columns.0, &columns.1, &columns.2, &columns.3])
            .await?;
    }
    Ok(())
}

async fn apply_clicks_once(
    client: &mut Object,
    clicks: &ClickColumns,
    bounded: bool,
) -> Result<(), tokio_postgres::Error> {
    let tx = background_transaction(client, bounded).await?;
    add_clicks(&tx, clicks).await?;
    tx.commit().await
}

/// Marks the batches applied and adds the clicks of those that were not, in one transaction;
/// returns how many were new. `batches` are distinct by id and in id order, so that racing
/// callers claim ids in one order.
async fn apply_batches_once(
    client: &mut Object,
    batches: &[&ClickBatch],
    today: i32,
    bounded: bool,
) -> Result<usize, tokio_postgres::Error> {
    let tx = background_transaction(client, bounded).await?;
    let ids: Vec<&str> = batches.iter().map(|b| b.id.as_str()).collect();
    // A batch id claimed by a concurrent transaction makes this one wait for its outcome:
    // committed → not new here; rolled back → ours to apply.
    let mark = tx
        .prepare_cached(
            "INSERT INTO applied_click_batches (id, day) \
             SELECT id, $2 FROM unnest($1::TEXT[]) AS b (id) \
             ON CONFLICT (id) DO NOTHING RETURNING id",
        )
        .await?;
    let fresh: HashSet<String> = tx
        .query(&mark, &[&ids, &today])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let clicks = ClickColumns::new(
        batches
            .iter()
            .filter(|b| fresh.contains(&b.id))
            .flat_map(|b| &b.deltas),
    );
    add_clicks(&tx, &clicks).await?;
    tx.commit().await?;
    Ok(fresh.len())
}

/// Clicks as column arrays: counts per (code, day), without duplicates (an upsert may not
/// touch one row twice) and in key order.
#[derive(Debug, Default)]
struct ClickColumns {
    day_codes: Vec<String>,
    days: Vec<i32>,
    day_human: Vec<i64>,
    day_bot: Vec<i64>,
    /// People per (code, day), where any clicked.
    people: BTreeMap<(String, i32), People>,
}

impl ClickColumns {
    fn new<'a>(deltas: impl IntoIterator<Item = &'a ClickDelta>) -> Self {
        let mut per_day: BTreeMap<(&str, Day), (u64, u64)> = BTreeMap::new();
        let mut batch = Self::default();
        for d in deltas {
            let entry = per_day.entry((&*d.code, d.day)).or_default();
            entry.0 = entry.0.saturating_add(d.human);
            entry.1 = entry.1.saturating_add(d.bot);
            if let Some(people) = d.people() {
                batch
                    .people
                    .entry((d.code.to_string(), d.day.number()))
                    .or_default()
                    .merge(people);
            }
        }
        for ((code, day), (human, bot)) in per_day {
            batch.day_codes.push(code.to_owned());
            batch.days.push(day.number());
            batch.day_human.push(to_i64(human));
            batch.day_bot.push(to_i64(bot));
        }
        batch
    }
}

#[async_trait]
impl ClickSink for PgStore {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        if deltas.is_empty() {
            return Ok(());
        }
        let clicks = ClickColumns::new(&deltas);
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match apply_clicks_once(&mut client, &clicks, self.bounded).await {
                Ok(()) => return Ok(()),
                // The transaction rolled back whole, so trying again cannot count twice.
                Err(e) if is_retryable(&e) && attempt < CLICK_ATTEMPTS => attempt += 1,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        // The first of several batches with one id counts, as if they had come one by one.
        let mut distinct: BTreeMap<&str, &ClickBatch> = BTreeMap::new();
        for batch in batches {
            distinct.entry(batch.id.as_str()).or_insert(batch);
        }
        if distinct.is_empty() {
            return Ok(0);
        }
        let batches: Vec<&ClickBatch> = distinct.into_values().collect();
        let today = Day::from_unix(crate::now()).number();
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match apply_batches_once(&mut client, &batches, today, self.bounded).await {
                Ok(fresh) => return Ok(fresh),
                Err(e) if is_retryable(&e) && attempt < CLICK_ATTEMPTS => attempt += 1,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = background_transaction(&mut client, self.bounded)
            .await
            .map_err(classify)?;
        tx.execute(
            "DELETE FROM applied_click_batches WHERE day < $1",
            &[&day.number()],
        )
        .await
        .map_err(classify)?;
        // What the deleted rows held, as deleted: a late batch that added to one of them before
        // the delete took it is in the sum; one after finds no row and starts the day anew.
        let pruned = tx
            .query_one(
                "WITH gone AS (DELETE FROM click_days WHERE day < $1 \
                               RETURNING code, clicks, bot_clicks), \
                 moved AS (INSERT INTO link_clicks (code, clicks, bot_clicks) \
                           SELECT code, sum(clicks)::INT8, sum(bot_clicks)::INT8 \
                           FROM gone GROUP BY code \
                           ON CONFLICT (code) DO UPDATE SET \
                           clicks = link_clicks.clicks + excluded.clicks, \
                           bot_clicks = link_clicks.bot_clicks + excluded.bot_clicks) \
                 SELECT count(*) FROM gone",
                &[&day.number()],
            )
            .await
            .and_then(|row| row.try_get::<_, i64>(0))
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(to_u64(pruned))
    }
}
