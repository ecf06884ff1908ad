//! `proxypool-sim`: a deterministic simulator of the seed's four cases. Each address has a
//! hidden true profile per site that changes over time; the simulator replays the same
//! workload against naive random choice, round-robin and the pool, on a virtual clock, and
//! reports how each did.
//!
//! Usage: `proxypool-sim [--json] [--seed N] [--requests N] [--case 1-4]`

mod cases;
mod policy;
mod truth;

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use proxypool::{Clock, ManualClock, Outcome, Pool, PoolConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use policy::{Kind, Pick, Policy};
use truth::Truth;

/// Virtual time between two requests.
const STEP_MS: u64 = 100;
/// Extra chance of failure when an account is seen from a new address mid-session.
const SWITCH_PENALTY: f64 = 0.5;

#[derive(Debug, Serialize)]
struct Report {
    case: u8,
    policy: &'static str,
    requests: u64,
    success_rate: f64,
    oracle_success_rate: f64,
    false_quarantines: u64,
    sticky_violations: u64,
    min_in_service_violations: u64,
    max_quarantined_fraction: f64,
}

struct Args {
    json: bool,
    seed: u64,
    requests: u64,
    case: Option<u8>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        json: false,
        seed: 1,
        requests: 20_000,
        case: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--json" => args.json = true,
            "--seed" => args.seed = value("--seed")?,
            "--requests" => args.requests = value("--requests")?,
            "--case" => {
                let c = value("--case")?;
                if !(1..=4).contains(&c) {
                    return Err("--case is 1 to 4".into());
                }
                args.case = Some(c as u8);
            }
            "-h" | "--help" => {
                return Err(
                    "usage: proxypool-sim [--json] [--seed N] [--requests N] [--case 1-4]".into(),
                );
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn url(i: usize) -> String {
    format!("http://sim:pw@10.{}.{}.1:3128", i / 200, i % 200)
}

/// The key's current session: its addresses so far.
#[derive(Default)]
struct Session {
    addresses: HashSet<usize>,
    last: Option<usize>,
    until_ms: u64,
}

async fn run(case: u8, kind: Kind, requests: u64, seed: u64) -> Report {
    let horizon = requests * STEP_MS;
    let truth: Box<dyn Truth> = match case {
        1 => Box::new(cases::Scraping),
        2 => Box::new(cases::Accounts),
        3 => Box::new(cases::Tightening {
            from: horizon / 3,
            to: horizon * 2 / 3,
        }),
        _ => Box::new(cases::FlakySite),
    };
    let n = truth.addresses();
    let urls: Vec<String> = (0..n).map(url).collect();
    let index: HashMap<String, usize> = urls
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, u)| (u, i))
        .collect();
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    // The simulator reads a snapshot per request: keep the copied decision log short.
    cfg.decision_log_len = 8;
    let pool = Pool::builder()
        .addresses(urls.iter().cloned())
        .config(cfg)
        .clock(clock.clone())
        .seed(seed)
        .build()
        .ok();
    let mut policy = match (kind, pool.clone()) {
        (Kind::Random, _) => Policy::Random(Box::new(StdRng::seed_from_u64(seed ^ 0x5eed))),
        (Kind::RoundRobin, _) => Policy::RoundRobin(0),
        (Kind::Pool, Some(p)) => Policy::Pool(p),
        (Kind::Pool, None) => unreachable!("the default configuration is valid"),
    };
    // The same world for every policy: outcome and workload draws come from their own seeds.
    let mut world = StdRng::seed_from_u64(seed);
    let mut work = StdRng::seed_from_u64(seed.wrapping_add(1));
    let mut sessions: HashMap<usize, Session> = HashMap::new();
    let mut violated: HashSet<(usize, u64)> = HashSet::new();
    let (mut successes, mut oracle) = (0u64, 0.0);
    let (mut false_q, mut min_violations, mut max_q) = (0u64, 0u64, 0.0f64);
    let mut quarantines: Vec<u32> = vec![0; n];

    for _ in 0..requests {
        let t = clock.now().as_millis();
        let site = work.random_range(0..truth.sites().len());
        let key = (case == 2).then(|| work.random_range(0..cases::Accounts::KEYS));
        let session_len = work.random_range(5 * 60_000..20 * 60_000);
        oracle += (0..n)
            .map(|a| truth.profile(a, site, t).success)
            .fold(0.0, f64::max);
        let key_name = key.map(|k| format!("account-{k}"));
        let pick = policy
            .pick(n, key_name.as_deref(), truth.sites()[site], |u| {
                index.get(u).copied().unwrap_or(0)
            })
            .await;
        let (address, lease) = match pick {
            Pick::Address(a, l) => (a, l),
            Pick::SessionBroken => {
                // The caller ends the session; the next request for the key starts a new one.
                if let Some(k) = key {
                    sessions.remove(&k);
                }
                clock.advance(Duration::from_millis(STEP_MS));
                continue;
            }
            Pick::Unavailable => {
                clock.advance(Duration::from_millis(STEP_MS));
                continue;
            }
        };
        let mut profile = truth.profile(address, site, t);
        if let Some(k) = key {
            let s = sessions.entry(k).or_default();
            if s.until_ms <= t {
                *s = Session {
                    until_ms: t + session_len,
                    ..Session::default()
                };
            }
            if s.last.is_some_and(|l| l != address) {
                profile.success *= 1.0 - SWITCH_PENALTY;
            }
            s.addresses.insert(address);
            s.last = Some(address);
            if s.addresses.len() > 1 {
                violated.insert((k, s.until_ms));
            }
        }
        let r: f64 = world.random();
        let outcome = if r < profile.success {
            successes += 1;
            let jitter: f64 = world.random_range(0.7..1.6);
            Outcome::Success {
                latency: Duration::from_millis((profile.latency_ms * jitter) as u64),
            }
        } else if r < profile.success + profile.captcha {
            Outcome::Captcha
        } else {
            Outcome::Timeout
        };
        if let Some(lease) = lease {
            let _ = lease.release(outcome).await;
        }
        if let Some(pool) = &pool
            && kind == Kind::Pool
        {
            let snap = pool.snapshot().await;
            if snap.pool.offered < n.min(2) {
                min_violations += 1;
            }
            max_q = max_q.max(snap.pool.quarantined as f64 / n as f64);
            for (i, a) in snap.addresses.iter().enumerate() {
                if a.quarantine_entries > quarantines[i] {
                    quarantines[i] = a.quarantine_entries;
                    if truth.address_fine(i, t) {
                        false_q += 1;
                    }
                }
            }
        }
        clock.advance(Duration::from_millis(STEP_MS));
    }
    Report {
        case,
        policy: kind.name(),
        requests,
        success_rate: successes as f64 / requests.max(1) as f64,
        oracle_success_rate: oracle / requests.max(1) as f64,
        false_quarantines: false_q,
        sticky_violations: violated.len() as u64,
        min_in_service_violations: min_violations,
        max_quarantined_fraction: max_q,
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        eprintln!("cannot start the runtime");
        return ExitCode::FAILURE;
    };
    let cases: Vec<u8> = args.case.map_or_else(|| vec![1, 2, 3, 4], |c| vec![c]);
    if !args.json {
        println!(
            "{:<4} {:<12} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7}",
            "case", "policy", "requests", "success", "oracle", "falseQ", "sticky", "minSvc", "maxQ"
        );
    }
    for case in cases {
        for kind in Kind::ALL {
            let r = rt.block_on(run(case, kind, args.requests, args.seed));
            if args.json {
                match serde_json::to_string(&r) {
                    Ok(line) => println!("{line}"),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                println!(
                    "{:<4} {:<12} {:>8} {:>8.3} {:>8.3} {:>7} {:>7} {:>7} {:>7.2}",
                    r.case,
                    r.policy,
                    r.requests,
                    r.success_rate,
                    r.oracle_success_rate,
                    r.false_quarantines,
                    r.sticky_violations,
                    r.min_in_service_violations,
                    r.max_quarantined_fraction
                );
            }
        }
    }
    ExitCode::SUCCESS
}
