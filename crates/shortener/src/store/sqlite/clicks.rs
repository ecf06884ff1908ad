//! Click writes of the embedded store: a flush adds its deltas to their days' rows, the only
//! table it writes; a prune moves the days it forgets into the links' pruned totals.
//!
//! A link's totals are `links.clicks` (what it was created or imported with, and what it had
//! counted before schema v7) + `link_clicks` (the days pruned since) + its rows of
//! `daily_clicks` (the live days, at most [`shortener_core::day::ANALYTICS_DAYS`] and the
//! days of late batches): the view `counted_links` adds them up (schema v9). A flush under a
//! spread-out load touches tens of thousands of codes a second, each a random B-tree leaf and
//! a WAL frame per table written: with the days alone a flush wrote 40 % fewer pages and took
//! 24–44 % fewer instructions a delta (BENCHMARKS.md).

use super::{merged_people, stored_people, to_i64};
use rusqlite::{Connection, params};
use shortener_core::day::Day;
use shortener_core::store::ClickDelta;
use std::time::{Duration, Instant};

/// Deltas written between two yields of the writer thread.
const CLICKS_PER_SLICE: usize = 64;
/// How long into a click batch the writer yields after each slice. A yield lets every waiting
/// thread go first, so on a machine busy with other work it stretched a batch threefold; past
/// this the batch runs to its end, and the fold waiting on it (while redirects fill the
/// click queue) waits at most this much longer.
const YIELDING_FOR: Duration = Duration::from_millis(250);

/// Adds click deltas to their days' rows (inside the caller's transaction); deltas of codes
/// no link has count nowhere.
///
/// A day already counted is one `UPDATE` of its row; only a code's first clicks of a day look
/// `links` up, to insert the row if the link exists.
///
/// The writer yields its core after each slice of deltas: a batch under Zipf traffic is tens
/// of thousands of codes, 100 ms and more of CPU on the cores the redirects run on, and the
/// scheduler lets a running thread use up its slice before a woken worker gets the core; those
/// waits (2–25 ms, the writer behind a third of the workers' waits over 1 ms) made Zipf's p99
/// (quiet A/B at 1 M links: Zipf 0.70–0.72 → 0.75–0.77 × bare, BENCHMARKS.md). With nobody
/// waiting the yield returns at once.
pub(super) fn add_clicks(c: &Connection, mut deltas: Vec<ClickDelta>) -> rusqlite::Result<()> {
    let started = Instant::now();
    // In key order, consecutive updates land on the same or the next B-tree leaf: a batch
    // over many codes reads each page once instead of once per code.
    deltas.sort_unstable_by(|a, b| (&a.code, a.day).cmp(&(&b.code, b.day)));
    let mut add = c.prepare_cached(
        "UPDATE daily_clicks SET clicks = clicks + ?3, bot_clicks = bot_clicks + ?4 \
         WHERE code = ?1 AND day = ?2",
    )?;
    let mut first = c.prepare_cached(
        "INSERT INTO daily_clicks (code, day, clicks, bot_clicks) \
         SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM links WHERE code = ?1)",
    )?;
    let mut read_people =
        c.prepare_cached("SELECT visitors, tops FROM daily_clicks WHERE code = ?1 AND day = ?2")?;
    let mut write_people = c.prepare_cached(
        "UPDATE daily_clicks SET visitors = ?3, tops = ?4 WHERE code = ?1 AND day = ?2",
    )?;
    for slice in deltas.chunks(CLICKS_PER_SLICE) {
        for d in slice {
            let key = (&*d.code, d.day.number());
            let counts = params![key.0, key.1, to_i64(d.human), to_i64(d.bot)];
            let counted = add.execute(counts)? == 1 || first.execute(counts)? == 1;
            let Some(delta_people) = d.people().filter(|_| counted) else {
                continue;
            };
            let stored = read_people.query_row(params![key.0, key.1], |r| {
                Ok(stored_people(
                    r.get_ref(0)?.as_blob_or_null()?,
                    r.get_ref(1)?.as_str_or_null()?,
                ))
            })?;
            let people = merged_people(stored, delta_people);
            write_people.execute(params![
                key.0,
                key.1,
                people.visitors.to_bytes(),
                people.tops_to_text()
            ])?;
        }
        if started.elapsed() < YIELDING_FOR {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Forgets the days before `day` and the ids of batches applied before it (inside the
/// caller's transaction); returns how many days' rows went. What the days held moves into
/// their links' pruned totals in the same transaction, so every total stays exact.
pub(super) fn prune_days_before(c: &Connection, day: Day) -> rusqlite::Result<u64> {
    c.execute(
        "DELETE FROM applied_click_batches WHERE day < ?1",
        [day.number()],
    )?;
    c.execute(
        "INSERT INTO link_clicks (code, clicks, bot_clicks) \
         SELECT code, sum(clicks), sum(bot_clicks) FROM daily_clicks WHERE day < ?1 \
         GROUP BY code \
         ON CONFLICT (code) DO UPDATE SET clicks = clicks + excluded.clicks, \
         bot_clicks = bot_clicks + excluded.bot_clicks",
        [day.number()],
    )?;
    c.execute("DELETE FROM daily_clicks WHERE day < ?1", [day.number()])
        .map(|n| n as u64)
}
