//! Acquire + release pairs of one bench case, for instruction counts under callgrind (which,
//! unlike the timings of `benches/pool.rs`, do not depend on the machine's load):
//!
//! `valgrind --tool=callgrind --toggle-collect='pairs::timed' target/release/examples/pairs
//! weighted 10000 21000` — the case (weighted, round-robin, least-connections, keyed), the
//! number of addresses and of counted pairs (their mean time is printed, for a rough look);
//! the pairs before them (one per address, or per key when keyed) warm the pool up and are
//! not counted.
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../benches/support/mod.rs"]
#[allow(
    dead_code,
    reason = "the bench's helpers for placements are not needed here"
)]
mod support;

use proxypool::{Pool, Strategy, Ticket};
use support::{pair, pool};

const KEYS: usize = 100_000;

/// The counted pairs: callgrind collects inside this function only.
#[inline(never)]
fn timed(pool: &Pool, tickets: &[Ticket], from: usize, count: usize) {
    for i in 0..count {
        pair(pool, tickets[(from + i) % tickets.len()].clone());
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [case, n, count] = args.as_slice() else {
        return Err(
            "usage: pairs weighted|round-robin|least-connections|keyed ADDRESSES PAIRS".into(),
        );
    };
    let n: usize = n.parse()?;
    let count: usize = count.parse()?;
    let (strategy, keyed) = match case.as_str() {
        "weighted" => (Strategy::Weighted, false),
        "round-robin" => (Strategy::RoundRobin, false),
        "least-connections" => (Strategy::LeastConnections, false),
        "keyed" => (Strategy::Weighted, true),
        other => return Err(format!("unknown case {other}").into()),
    };
    let pool = pool(n, strategy);
    let tickets: Vec<Ticket> = if keyed {
        (0..KEYS)
            .map(|k| Ticket::new().key(format!("account-{k}")))
            .collect()
    } else {
        vec![Ticket::new()]
    };
    let warm = if keyed { KEYS } else { n };
    for i in 0..warm {
        pair(&pool, tickets[i % tickets.len()].clone());
    }
    let start = std::time::Instant::now();
    timed(&pool, &tickets, warm, count);
    let ns = start.elapsed().as_nanos() as f64 / count.max(1) as f64;
    println!("{case} {n}: {count} pairs, {ns:.0} ns per pair");
    Ok(())
}
