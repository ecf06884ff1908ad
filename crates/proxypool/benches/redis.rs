//! Acquire + release pairs per second through the Redis store, next to `redis-benchmark`
//! running a trivial EVALSHA against the same server in the same run (the ceiling of one
//! script call on this machine). Rounds alternate the two, each pool phase compared with the
//! ceiling measured just before it, and the median ratio is the result: on a shared machine
//! the noise moves both by ±30 % from one minute to the next.
//! Run: `cargo bench -p proxypool --bench redis`.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proxypool::{Outcome, Pool};
use redis_support::{TASKS, latency, ticket};
use testkit::RedisServer;

mod redis_support;

const RUN: Duration = Duration::from_secs(3);
/// Unmeasured pairs of each kind before the first round: the first seconds of a pool (its
/// caches in the script and in this process filling, the server's memory settling) are not
/// its steady state, and the first round measured them (keyless 0.40–0.45 where the next
/// ones gave 0.49–0.50).
const WARM_UP: Duration = Duration::from_secs(1);
const ROUNDS: usize = 3;

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Trivial EVALSHA calls per second, 50 connections, as `redis-benchmark` measures them.
fn evalsha_ceiling(port: u16) -> f64 {
    let sha = cli(port, &["SCRIPT", "LOAD", "return 1"]);
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-c", "50", "-n", "150000", "-q"])
        .args(["EVALSHA", &sha, "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The last report line: "EVALSHA …: 98039.22 requests per second, p50=…".
    let line = text.rsplit('\r').next().unwrap_or_default();
    let rate = line
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|r| r.parse().ok());
    rate.unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text:?}"))
}

/// Server-side time per script call since the last reset, to tell the server's share of a
/// pair from the client's; then resets the counters.
fn print_script_cost(port: u16, what: &str) {
    let stats = cli(port, &["INFO", "commandstats"]);
    // Calls made inside scripts are counted too: where a script's time goes.
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        let line = line.split(",rejected").next().unwrap_or(line);
        println!("{what}: {line}");
    }
    cli(port, &["CONFIG", "RESETSTAT"]);
}

/// Microseconds the server spent in FCALLs since the last reset (`INFO commandstats`).
fn script_usec(port: u16) -> f64 {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .and_then(|l| l.split("usec=").nth(1)?.split(',').next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn pairs_per_second(pool: &Pool, keyed: bool, run: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (pool, stop, done) = (pool.clone(), Arc::clone(&stop), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let lease = pool.acquire(ticket(keyed, t, i)).await.unwrap();
                let latency = latency(t, i);
                lease.release(Outcome::Success { latency }).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// CPU seconds the server has used (user + system), from `INFO cpu`.
fn server_cpu(port: u16) -> f64 {
    cli(port, &["INFO", "cpu"])
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("proxypool-redis-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    let rt = redis_support::runtime();
    let pool = rt.block_on(redis_support::pool(redis.url()));
    for keyed in [false, true] {
        rt.block_on(pairs_per_second(&pool, keyed, WARM_UP));
    }
    let mut ratios = [Vec::new(), Vec::new()];
    for round in 1..=ROUNDS {
        for (i, keyed) in [false, true].into_iter().enumerate() {
            let ceiling = evalsha_ceiling(redis.port());
            cli(redis.port(), &["CONFIG", "RESETSTAT"]);
            let cpu = server_cpu(redis.port());
            let rate = rt.block_on(pairs_per_second(&pool, keyed, RUN));
            let cpu = server_cpu(redis.port()) - cpu;
            let busy = cpu / RUN.as_secs_f64();
            // The server's cost of a pair, less noisy than the rate: its CPU time (what a
            // loaded machine moves least) and the script's time.
            let pairs = rate * RUN.as_secs_f64();
            let cpu_per_pair = cpu * 1e6 / pairs;
            let per_pair = script_usec(redis.port()) / pairs;
            let ratio = rate / ceiling;
            ratios[i].push(ratio);
            println!(
                "round {round}: redis-benchmark EVALSHA \"return 1\" (50 connections) {ceiling:.0} calls/s; \
                 acquire+release, {TASKS} tasks, 50 addresses, {}: {rate:.0} pairs/s, ratio {ratio:.2} \
                 (server busy {:.0} % of one core, CPU {cpu_per_pair:.1} µs and script {per_pair:.1} µs per pair)",
                if keyed {
                    "keyed (2 000 keys)"
                } else {
                    "keyless"
                },
                busy * 100.0,
            );
            if round == ROUNDS {
                print_script_cost(redis.port(), if keyed { "keyed" } else { "keyless" });
            }
        }
    }
    println!(
        "median ratio over {ROUNDS} rounds: keyless {:.2}, keyed {:.2} (bar 0.70, every round ≥ 0.60)",
        median(ratios[0].clone()),
        median(ratios[1].clone())
    );
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}
