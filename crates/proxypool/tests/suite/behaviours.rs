//! One or more deterministic tests per behaviour of the spec, named after its P-number.
//! A manual clock and a fixed seed make every run identical and instant. The suite runs
//! against both stores: `tests/behaviours.rs` (memory) and `tests/behaviours_redis.rs`
//! include it, and every test runs on both.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::{addr, build, hit, ok, pool, pool_with, runtime, serve};
use proxypool::{
    AcquireError, Choice, HealthState, ManualClock, Outcome, Pool, PoolConfig, Strategy, Subject,
    Ticket,
};

const STEP: Duration = Duration::from_millis(100);

fn rr() -> PoolConfig {
    let mut c = PoolConfig::default();
    c.strategy = Strategy::RoundRobin;
    c
}

async fn state_of(pool: &Pool, a: &str) -> HealthState {
    pool.snapshot().await.address(a).unwrap().state
}

/// Address 0 fails with `bad`, the others succeed, round-robin over `n`, `rounds` rounds.
async fn fail_first(pool: &Pool, clock: &ManualClock, n: usize, rounds: usize, bad: Outcome) {
    let target = addr(0);
    serve(pool, clock, &Ticket::new(), n * rounds, STEP, |a| {
        if a == target { bad } else { ok() }
    })
    .await;
}

// ---- P1 -------------------------------------------------------------------------------------

#[tokio::test]
async fn p1_round_robin_visits_every_address_in_turn() {
    let clock = ManualClock::new();
    let pool = pool_with(4, &clock, rr()).await;
    let served = serve(&pool, &clock, &Ticket::new(), 8, STEP, |_| ok()).await;
    let expected: Vec<String> = (0..4).chain(0..4).map(addr).collect();
    assert_eq!(served, expected);
}

#[tokio::test]
async fn p1_weighted_prefers_fast_and_successful_addresses_without_starving_any() {
    let clock = ManualClock::new();
    let pool = pool(4, &clock).await;
    let slow = addr(0);
    let served = serve(&pool, &clock, &Ticket::new(), 2000, STEP, |a| {
        Outcome::Success {
            latency: Duration::from_millis(if a == slow { 400 } else { 100 }),
        }
    })
    .await;
    let mut count: HashMap<&str, usize> = HashMap::new();
    for a in &served[400..] {
        *count.entry(a.as_str()).or_default() += 1;
    }
    let slow_share = count[slow.as_str()] as f64 / 1600.0;
    // Four times slower: about a quarter of the others' weight, so about 1/13 of the traffic.
    assert!(slow_share > 0.04 && slow_share < 0.15, "{slow_share}");
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.count(HealthState::Healthy), 4);
}

#[tokio::test]
async fn p1_least_connections_spreads_open_leases() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    cfg.strategy = Strategy::LeastConnections;
    let pool = pool_with(4, &clock, cfg).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(pool.acquire(Ticket::new()).await.unwrap());
    }
    let snap = pool.snapshot().await;
    let loads: Vec<u32> = snap.addresses.iter().map(|a| a.active_leases).collect();
    assert!(loads.iter().all(|l| (1..=3).contains(l)), "{loads:?}");
    assert!(held.iter().all(|l| l.choice() == Choice::LeastConnections));
}

#[tokio::test]
async fn p1_keyed_tickets_hash_with_bounded_loads() {
    let clock = ManualClock::new();
    let pool = pool(10, &clock).await;
    for k in 0..1000 {
        let lease = pool
            .acquire(Ticket::new().key(format!("acct-{k}")))
            .await
            .unwrap();
        assert_eq!(lease.choice(), Choice::Hashed);
        lease.release(ok()).await.unwrap();
    }
    let snap = pool.snapshot().await;
    let max = snap.addresses.iter().map(|a| a.bound_keys).max().unwrap();
    assert!(max <= 125, "max bound keys {max} > ⌈1.25 × 100⌉");
    assert_eq!(snap.pool.bindings, 1000);
}

#[tokio::test]
async fn p1_sub_pools_serve_only_their_members() {
    let clock = ManualClock::new();
    let pool = build(
        Pool::builder()
            .sub_pool("accounts", Strategy::LeastConnections)
            .address("http://10.9.0.1:8080")
            .address_in("http://10.9.0.2:8080", &["accounts"])
            .address_in("http://10.9.0.3:8080", &["accounts"])
            .clock(clock.clone())
            .seed(1),
    )
    .await;
    let t = Ticket::new().sub_pool("accounts");
    let served = serve(&pool, &clock, &t, 20, STEP, |_| ok()).await;
    assert!(served.iter().all(|a| a != "http://10.9.0.1:8080"));
    let keyed = pool.acquire(t.clone().key("k")).await.unwrap();
    assert_ne!(keyed.address().as_str(), "http://10.9.0.1:8080");
    assert_eq!(
        pool.acquire(Ticket::new().sub_pool("nope"))
            .await
            .unwrap_err(),
        AcquireError::UnknownSubPool("nope".into())
    );
    for bad in ["", "two words", "tab\there"] {
        let built = Pool::builder()
            .sub_pool(bad, Strategy::Weighted)
            .address("http://10.9.0.1:8080")
            .build();
        let err = built.unwrap_err().to_string();
        assert!(err.contains("without spaces"), "{bad:?}: {err}");
    }
    let twice = Pool::builder()
        .sub_pool("a", Strategy::Weighted)
        .sub_pool("a", Strategy::RoundRobin)
        .build();
    assert!(twice.is_err());
}

/// Two sites, alternating; address 0 is blocked on `bad` from request `from` on, the rest
/// succeed. Returns, per site, how often address 0 served it after `from` + `settle`.
async fn bad_on_one_site(
    pool: &Pool,
    clock: &ManualClock,
    rounds: usize,
    from: usize,
    settle: usize,
    bad_everywhere: bool,
) -> (usize, usize) {
    let target = addr(0);
    let sites = [
        Ticket::new().site("a.example"),
        Ticket::new().site("b.example"),
    ];
    let mut served = [0, 0];
    for i in 0..rounds {
        let which = i % 2;
        let lease = pool.acquire(sites[which].clone()).await.unwrap();
        let is_target = lease.address().as_str() == target;
        let fails = is_target && i >= from && (which == 0 || bad_everywhere);
        if is_target && i >= from + settle {
            served[which] += 1;
        }
        let o = if fails { Outcome::Blocked } else { ok() };
        lease.release(o).await.unwrap();
        clock.advance(STEP);
    }
    (served[0], served[1])
}

#[tokio::test]
async fn p1_p9_weights_are_per_address_and_site_so_a_bad_pair_is_avoided_there_only() {
    let clock = ManualClock::new();
    let pool = pool(4, &clock).await;
    // 400 requests of good history on both sites, then address 0 is blocked on a.example.
    let (on_a, on_b) = bad_on_one_site(&pool, &clock, 2400, 400, 200, false).await;
    // 1 000 tickets per site after settling: a quarter would be 250.
    assert!(on_a <= 10, "address 0 still served a.example {on_a} times");
    assert!(on_b >= 150, "address 0 served b.example only {on_b} times");
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.quarantine_entries, 0, "{}", a.reason);
    let pair = |site: &str| {
        snap.matrix
            .iter()
            .find(|c| c.address == addr(0) && c.site == site)
            .unwrap()
            .avoided
    };
    assert!(pair("a.example") && !pair("b.example"));
    assert!(snap.decisions.iter().any(|d| d.to == "avoided"
        && d.subject
            == Subject::Cell {
                address: addr(0),
                site: "a.example".into()
            }));
}

#[tokio::test]
async fn p1_p9_an_address_bad_on_every_site_is_still_quarantined() {
    let clock = ManualClock::new();
    let pool = pool(4, &clock).await;
    bad_on_one_site(&pool, &clock, 600, 400, 0, true).await;
    let snap = pool.snapshot().await;
    assert_eq!(snap.address(&addr(0)).unwrap().quarantine_entries, 1);
}

#[tokio::test]
async fn p1_p9_without_enough_samples_on_a_site_the_address_weight_decides() {
    let clock = ManualClock::new();
    let pool = pool(4, &clock).await;
    let slow = addr(0);
    let latency = |a: &str| Outcome::Success {
        latency: Duration::from_millis(if a == slow { 800 } else { 100 }),
    };
    let a = Ticket::new().site("a.example");
    serve(&pool, &clock, &a, 800, STEP, latency).await;
    // A new site: no pair has evidence there, so the address's own (slow) record weighs it.
    let c = Ticket::new().site("c.example");
    let served = serve(&pool, &clock, &c, 40, STEP, latency).await;
    let share = served.iter().filter(|x| **x == slow).count();
    assert!(share <= 4, "the slow address took {share} of the first 40");
}

// ---- P2 -------------------------------------------------------------------------------------

#[tokio::test]
async fn p2_a_key_keeps_its_address_while_the_ttl_is_renewed() {
    let clock = ManualClock::new();
    let pool = pool(10, &clock).await;
    let t = Ticket::new().key("acct-1");
    let first = pool.acquire(t.clone()).await.unwrap();
    let bound = first.address().clone();
    first.release(ok()).await.unwrap();
    // Every 10 minutes for two hours: each use renews the 15-minute binding.
    for _ in 0..12 {
        clock.advance(Duration::from_secs(600));
        let l = pool.acquire(t.clone()).await.unwrap();
        assert_eq!((l.address(), l.choice()), (&bound, Choice::Bound));
        l.release(ok()).await.unwrap();
    }
    // Idle past the TTL: the binding is gone and the next acquire starts a new session.
    clock.advance(Duration::from_secs(16 * 60));
    assert_eq!(pool.snapshot().await.pool.bindings, 0);
    let l = pool.acquire(t).await.unwrap();
    assert_eq!(l.choice(), Choice::Hashed);
}

#[tokio::test]
async fn p2_quarantined_bound_address_breaks_the_session_once() {
    let clock = ManualClock::new();
    let pool = pool(10, &clock).await;
    let t = Ticket::new().key("acct-9");
    let mut bound = None;
    for _ in 0..3 {
        let l = pool.acquire(t.clone()).await.unwrap();
        bound = Some(l.address().clone());
        l.release(Outcome::ConnectError).await.unwrap();
    }
    let bound = bound.unwrap();
    assert_eq!(
        state_of(&pool, bound.as_str()).await,
        HealthState::Quarantined
    );
    let err = pool.acquire(t.clone()).await.unwrap_err();
    assert_eq!(
        err,
        AcquireError::SessionBroken {
            key: "acct-9".into(),
            address: bound.clone()
        }
    );
    let next = pool.acquire(t).await.unwrap();
    assert_eq!(next.choice(), Choice::Hashed);
    assert_ne!(next.address(), &bound);
    assert_eq!(pool.snapshot().await.pool.sessions_broken, 1);
}

#[tokio::test]
async fn p2_degraded_bound_address_keeps_the_session() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    cfg.quarantine_cap = 0.1; // one address may be quarantined
    let pool = pool_with(10, &clock, cfg).await;
    // Fill the cap with address 0.
    hit(&pool, &clock, &addr(0), Outcome::Timeout, 3).await;
    let t = Ticket::new().key("acct-2");
    let l = pool.acquire(t.clone()).await.unwrap();
    let bound = l.address().clone();
    l.release(Outcome::ConnectError).await.unwrap();
    for _ in 0..3 {
        let l = pool.acquire(t.clone()).await.unwrap();
        assert_eq!(l.address(), &bound);
        l.release(Outcome::ConnectError).await.unwrap();
    }
    // Past the cap it only lost weight, and the session stays on it.
    assert_eq!(state_of(&pool, bound.as_str()).await, HealthState::Degraded);
    assert_eq!(pool.acquire(t).await.unwrap().address(), &bound);
}

#[tokio::test]
async fn p2_removing_the_bound_address_breaks_the_session_and_moves_no_other_key() {
    let clock = ManualClock::new();
    let pool = pool(20, &clock).await;
    let mut bound = HashMap::new();
    for k in 0..300 {
        let l = pool
            .acquire(Ticket::new().key(format!("k{k}")))
            .await
            .unwrap();
        bound.insert(k, l.address().as_str().to_owned());
    }
    let victim = bound[&0].clone();
    pool.remove(&victim).await.unwrap();
    pool.add("http://10.99.0.1:8080").await.unwrap();
    for (k, a) in &bound {
        match pool.acquire(Ticket::new().key(format!("k{k}"))).await {
            Ok(l) => {
                assert_ne!(a, &victim);
                assert_eq!(l.address().as_str(), a, "key {k} moved");
            }
            Err(AcquireError::SessionBroken { address, .. }) => {
                assert_eq!(address.as_str(), victim);
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Where each key would be placed now, measured without leaving a trace: acquire, drop the
/// lease, end the session.
async fn placements(pool: &Pool, keys: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let lease = pool.acquire(Ticket::new().key(k.as_str())).await.unwrap();
        assert_eq!(lease.choice(), Choice::Hashed);
        out.push(lease.address().as_str().to_owned());
        drop(lease);
        assert!(pool.end_session(k).await);
    }
    out
}

#[tokio::test]
async fn p1_p2_removing_one_of_n_moves_about_one_nth_of_unbound_keys_and_no_bound_one() {
    const N: usize = 100;
    let clock = ManualClock::new();
    let pool = pool(N, &clock).await;
    // A loaded pool: 10 000 live sessions, a mean of 100 bound keys per address.
    let mut bound = HashMap::new();
    for k in 0..10_000 {
        let l = pool
            .acquire(Ticket::new().key(format!("k{k}")))
            .await
            .unwrap();
        bound.insert(k, l.address().as_str().to_owned());
    }
    let snap = pool.snapshot().await;
    let max = snap.addresses.iter().map(|a| a.bound_keys).max().unwrap();
    assert!(max <= 125, "max bound keys {max} > ⌈1.25 × 100⌉");
    let probes: Vec<String> = (0..10_000).map(|k| format!("probe{k}")).collect();
    let before = placements(&pool, &probes).await;
    let victim = addr(37);
    pool.remove(&victim).await.unwrap();
    let after = placements(&pool, &probes).await;
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    // 1/N of 10 000 is 100: the probes that were placed on the removed address, and no
    // cascade through the others.
    let on_victim = before.iter().filter(|a| **a == victim).count();
    assert!(
        (50..=200).contains(&moved),
        "{moved} of 10 000 moved ({on_victim} were on it)"
    );
    assert!(
        moved <= on_victim + 20,
        "{moved} moved but only {on_victim} were on it"
    );
    for (k, a) in &bound {
        match pool.acquire(Ticket::new().key(format!("k{k}"))).await {
            Ok(l) => assert_eq!(
                (l.address().as_str(), l.choice()),
                (a.as_str(), Choice::Bound)
            ),
            Err(AcquireError::SessionBroken { address, .. }) => {
                assert_eq!(address.as_str(), victim)
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn p2_a_session_can_be_ended_before_its_ttl() {
    let clock = ManualClock::new();
    let pool = pool(10, &clock).await;
    let l = pool.acquire(Ticket::new().key("acct")).await.unwrap();
    l.release(ok()).await.unwrap();
    assert!(pool.end_session("acct").await);
    assert!(!pool.end_session("acct").await);
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.bindings, 0);
    assert!(snap.addresses.iter().all(|a| a.bound_keys == 0));
    let again = pool.acquire(Ticket::new().key("acct")).await.unwrap();
    assert_eq!(again.choice(), Choice::Hashed);
}

// ---- P3, P4, P5 -----------------------------------------------------------------------------

#[tokio::test]
async fn p3_a_new_address_starts_healthy_on_a_slow_start_ramp() {
    let clock = ManualClock::new();
    let pool = pool(3, &clock).await;
    pool.add("socks5://u:p@10.1.0.1:1080").await.unwrap();
    let snap = pool.snapshot().await;
    let new = snap.address("socks5://u:***@10.1.0.1:1080").unwrap();
    assert_eq!(new.state, HealthState::Healthy);
    assert_eq!(new.ramp_share, Some(0.10));
    clock.advance(Duration::from_secs(60));
    let snap = pool.snapshot().await;
    assert_eq!(
        snap.address("socks5://u:***@10.1.0.1:1080")
            .unwrap()
            .ramp_share,
        None
    );
    assert_eq!(
        pool.add("socks5://u:p@10.1.0.1:1080").await,
        Err(proxypool::PoolError::Duplicate(
            "socks5://u:p@10.1.0.1:1080".parse().unwrap()
        ))
    );
}

#[tokio::test]
async fn p4_one_error_is_noise() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let target = addr(0);
    let mut first = true;
    serve(&pool, &clock, &Ticket::new(), 200, STEP, |a| {
        if a == target && std::mem::take(&mut first) {
            Outcome::ConnectError
        } else {
            ok()
        }
    })
    .await;
    assert_eq!(state_of(&pool, &target).await, HealthState::Healthy);
}

#[tokio::test]
async fn p4_three_failures_of_the_last_five_quarantine() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    fail_first(&pool, &clock, 10, 2, Outcome::Timeout).await;
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Healthy);
    fail_first(&pool, &clock, 10, 1, Outcome::Timeout).await;
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.state, HealthState::Quarantined);
    assert!(
        a.reason.contains("3 failures in the last 3"),
        "{}",
        a.reason
    );
}

#[tokio::test]
async fn p4_p5_against_a_good_record_three_of_five_is_suspect_until_three_more_confirm_it() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let target = addr(0);
    // 40 good outcomes each, then address 0 meets a chance cluster: 3 timeouts in 5.
    serve(&pool, &clock, &Ticket::new(), 400, STEP, |_| ok()).await;
    let mut n = 0;
    serve(&pool, &clock, &Ticket::new(), 50, STEP, |a| {
        if a != target {
            return ok();
        }
        n += 1;
        if [1, 3, 4].contains(&n) {
            Outcome::Timeout
        } else {
            ok()
        }
    })
    .await;
    let snap = pool.snapshot().await;
    let a = snap.address(&target).unwrap();
    assert_eq!((a.state, a.quarantine_entries), (HealthState::Degraded, 0));
    assert!(a.reason.contains("suspect"), "{}", a.reason);
    // The signal cleared: after the dwell the address is healthy again, never quarantined.
    serve(&pool, &clock, &Ticket::new(), 400, STEP, |_| ok()).await;
    let a = pool.snapshot().await.address(&target).cloned().unwrap();
    assert_eq!((a.state, a.quarantine_entries), (HealthState::Healthy, 0));
    // A real break: three failures make it suspect again, three more quarantine it.
    fail_first(&pool, &clock, 10, 5, Outcome::Timeout).await;
    assert_eq!(state_of(&pool, &target).await, HealthState::Degraded);
    fail_first(&pool, &clock, 10, 1, Outcome::Timeout).await;
    let snap = pool.snapshot().await;
    let a = snap.address(&target).unwrap();
    assert_eq!(a.state, HealthState::Quarantined);
    assert!(
        a.reason.contains("confirmed by 3 more failures"),
        "{}",
        a.reason
    );
}

#[tokio::test]
async fn p4_success_rate_below_seventy_percent_over_ten_samples_quarantines() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let target = addr(0);
    // Address 0 fails every third request: never 3 of 5, but 67 % success.
    let mut n = 0;
    let mut outcome = |a: &str| {
        if a != target {
            return ok();
        }
        n += 1;
        if n % 3 == 0 { Outcome::Blocked } else { ok() }
    };
    for _ in 0..9 {
        let lease = pool.acquire(Ticket::new()).await.unwrap();
        let o = outcome(lease.address().as_str());
        lease.release(o).await.unwrap();
    }
    assert_eq!(state_of(&pool, &target).await, HealthState::Healthy);
    for _ in 0..200 {
        let lease = pool.acquire(Ticket::new()).await.unwrap();
        let o = outcome(lease.address().as_str());
        lease.release(o).await.unwrap();
        clock.advance(STEP);
    }
    let snap = pool.snapshot().await;
    let a = snap.address(&target).unwrap();
    assert_eq!(a.quarantine_entries, 1, "{}", a.reason);
    let d = snap
        .decisions
        .iter()
        .find(|d| d.to == "quarantined")
        .unwrap();
    assert!(d.reason.starts_with("success rate 6"), "{}", d.reason);
}

#[tokio::test]
async fn p4_captcha_rate_above_twenty_percent_quarantines() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let target = addr(0);
    let mut n = 0;
    serve(&pool, &clock, &Ticket::new(), 150, STEP, |a| {
        if a != target {
            return ok();
        }
        n += 1;
        // One captcha in four: 25 %, yet 75 % success and never 3 failures of 5.
        if n % 4 == 0 { Outcome::Captcha } else { ok() }
    })
    .await;
    let snap = pool.snapshot().await;
    let d = snap
        .decisions
        .iter()
        .find(|d| d.to == "quarantined")
        .unwrap();
    assert!(d.reason.starts_with("captcha rate"), "{}", d.reason);
}

#[tokio::test]
async fn p4_a_latency_tail_degrades_and_p5_recovery_waits_for_the_dwell() {
    let clock = ManualClock::new();
    let pool = pool_with(4, &clock, rr()).await;
    let target = addr(0);
    let mut n = 0;
    // Address 0: every fifth request takes 2 s against a 100 ms norm: p95 > 3 × median.
    serve(
        &pool,
        &clock,
        &Ticket::new(),
        400,
        Duration::from_secs(1),
        |a| {
            n += 1;
            let slow = a == target && n % 20 < 4;
            Outcome::Success {
                latency: Duration::from_millis(if slow { 2000 } else { 100 }),
            }
        },
    )
    .await;
    let snap = pool.snapshot().await;
    let a = snap.address(&target).unwrap();
    assert_eq!(a.state, HealthState::Degraded, "{}", a.reason);
    assert!(a.reason.starts_with("latency p95"));
    // Back to a steady 100 ms: the tail leaves the window, then the dwell must pass.
    serve(
        &pool,
        &clock,
        &Ticket::new(),
        400,
        Duration::from_secs(1),
        |_| ok(),
    )
    .await;
    assert_eq!(state_of(&pool, &target).await, HealthState::Healthy);
    let snap = pool.snapshot().await;
    let up = snap
        .decisions
        .iter()
        .find(|d| d.from == "degraded")
        .unwrap();
    let down = snap.decisions.iter().find(|d| d.to == "degraded").unwrap();
    assert!(up.at_ms - down.at_ms >= 30_000);
}

#[tokio::test]
async fn p4_outcomes_older_than_the_window_age_stop_counting() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let t = Ticket::new().site("shop.example");
    let target = addr(0);
    // Two failures, then eleven quiet minutes, then a third: only one is recent.
    serve(&pool, &clock, &t, 20, STEP, |a| {
        if a == target { Outcome::Timeout } else { ok() }
    })
    .await;
    clock.advance(Duration::from_secs(11 * 60));
    serve(&pool, &clock, &t, 10, STEP, |a| {
        if a == target { Outcome::Timeout } else { ok() }
    })
    .await;
    let snap = pool.snapshot().await;
    let a = snap.address(&target).unwrap();
    assert_eq!(a.state, HealthState::Healthy, "{}", a.reason);
    assert_eq!(a.window_samples, 1);
    let pair = snap
        .matrix
        .iter()
        .find(|c| c.address == target && c.site == "shop.example")
        .unwrap();
    assert_eq!(pair.window_samples, 1);
}

#[tokio::test]
async fn p4_p9_an_avoided_pair_is_forgiven_once_its_window_ages_out() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    cfg.health.window_max_age = Duration::from_secs(120);
    let pool = pool_with(4, &clock, cfg).await;
    bad_on_one_site(&pool, &clock, 1200, 400, 0, false).await;
    let avoided = |snap: &proxypool::Snapshot| {
        snap.matrix
            .iter()
            .find(|c| c.address == addr(0) && c.site == "a.example")
            .map(|c| (c.avoided, c.window_samples))
    };
    let snap = pool.snapshot().await;
    assert!(avoided(&snap).unwrap().0);
    // The configured two minutes without an outcome there: the pair starts afresh and the
    // address takes its share of a.example again.
    clock.advance(Duration::from_secs(120));
    assert_eq!(avoided(&pool.snapshot().await), Some((false, 0)));
    let served = serve(
        &pool,
        &clock,
        &Ticket::new().site("a.example"),
        40,
        STEP,
        |_| ok(),
    )
    .await;
    let share = served.iter().filter(|a| **a == addr(0)).count();
    assert!(
        share >= 5,
        "address 0 took {share} of 40 after being forgiven"
    );
}

async fn quarantine_first(pool: &Pool, clock: &ManualClock) -> u64 {
    fail_first(pool, clock, 10, 3, Outcome::ConnectError).await;
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.state, HealthState::Quarantined);
    let entered = snap
        .decisions
        .iter()
        .rev()
        .find(|d| d.to == "quarantined")
        .unwrap()
        .at_ms;
    // The clock has moved on since: return what is left of the wait, check the whole wait.
    let wait = a.quarantined_until_ms.unwrap() - entered;
    assert!(
        (48_000..=72_000).contains(&wait) || a.backoff_level > 1,
        "{wait}"
    );
    a.quarantined_until_ms.unwrap() - snap.at_ms
}

#[tokio::test]
async fn p5_probing_needs_five_successes_in_a_row() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let wait = quarantine_first(&pool, &clock).await;
    clock.advance(Duration::from_millis(wait));
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Probing);
    for _ in 0..4 {
        pool.report_probe(&addr(0), true).await.unwrap();
    }
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Probing);
    // The dwell of 30 s in probing is not over yet: a fifth success waits for it.
    pool.report_probe(&addr(0), true).await.unwrap();
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Probing);
    clock.advance(Duration::from_secs(30));
    pool.report_probe(&addr(0), true).await.unwrap();
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.state, HealthState::Healthy);
    assert_eq!(a.ramp_share, Some(0.10));
}

#[tokio::test]
async fn p5_probing_takes_passive_traffic_as_half_open_probes() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let wait = quarantine_first(&pool, &clock).await;
    clock.advance(Duration::from_millis(wait + 31_000));
    serve(&pool, &clock, &Ticket::new(), 60, STEP, |_| ok()).await;
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Healthy);
}

// ---- P6 -------------------------------------------------------------------------------------

#[tokio::test]
async fn p6_backoff_doubles_with_jitter_and_resets_after_ten_stable_minutes() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let first = quarantine_first(&pool, &clock).await;
    clock.advance(Duration::from_millis(first));
    pool.report_probe(&addr(0), false).await.unwrap();
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    let second = a.quarantined_until_ms.unwrap() - snap.at_ms;
    assert!((96_000..=144_000).contains(&second), "{second}");
    // Recover, stay healthy for ten minutes, fall again: the wait is back to about a minute.
    clock.advance(Duration::from_millis(second + 31_000));
    for _ in 0..5 {
        pool.report_probe(&addr(0), true).await.unwrap();
    }
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Healthy);
    clock.advance(Duration::from_secs(10 * 60));
    quarantine_first(&pool, &clock).await;
    let snap = pool.snapshot().await;
    assert_eq!(
        snap.address(&addr(0)).unwrap().backoff_level,
        1,
        "reset, then one entry"
    );
}

// ---- P7, P8 ---------------------------------------------------------------------------------

#[tokio::test]
async fn p7_at_most_thirty_percent_quarantined_the_rest_lose_weight() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let bad: HashSet<String> = (0..4).map(addr).collect();
    serve(&pool, &clock, &Ticket::new(), 100, STEP, |a| {
        if bad.contains(a) {
            Outcome::ConnectError
        } else {
            ok()
        }
    })
    .await;
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.quarantine_cap, 3);
    assert_eq!(snap.pool.quarantined, 3);
    let held: Vec<_> = snap
        .addresses
        .iter()
        .filter(|a| a.state == HealthState::Degraded)
        .collect();
    assert_eq!(held.len(), 1);
    assert!(
        held[0].reason.contains("quarantine cap of 3 reached"),
        "{}",
        held[0].reason
    );
    assert!(held[0].weight < 0.5);
}

#[tokio::test]
async fn p8_at_least_two_addresses_stay_offered() {
    let clock = ManualClock::new();
    let mut cfg = rr();
    cfg.quarantine_cap = 1.0;
    cfg.judgement.site_min_addresses = 100; // isolate P8 from site judgement
    let pool = pool_with(3, &clock, cfg).await;
    serve(&pool, &clock, &Ticket::new(), 300, STEP, |_| {
        Outcome::ConnectError
    })
    .await;
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.offered, 2);
    assert!(
        snap.addresses
            .iter()
            .any(|a| a.reason.contains("fewer than 2 in service"))
    );
    assert!(pool.acquire(Ticket::new()).await.is_ok());
}

#[tokio::test]
async fn p8_removing_an_address_brings_a_quarantined_one_back_early() {
    let clock = ManualClock::new();
    let mut cfg = rr();
    cfg.quarantine_cap = 1.0;
    let pool = pool_with(3, &clock, cfg).await;
    fail_first(&pool, &clock, 3, 3, Outcome::ConnectError).await;
    assert_eq!(state_of(&pool, &addr(0)).await, HealthState::Quarantined);
    pool.remove(&addr(1)).await.unwrap();
    let snap = pool.snapshot().await;
    assert_eq!(snap.address(&addr(0)).unwrap().state, HealthState::Probing);
    assert_eq!(snap.pool.offered, 2);
}

// ---- P9 -------------------------------------------------------------------------------------

#[tokio::test]
async fn p9_a_site_failing_on_every_address_is_blamed_not_the_addresses() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let (flaky, good) = (
        Ticket::new().site("flaky.example"),
        Ticket::new().site("good.example"),
    );
    for i in 0..400 {
        let t = if i % 2 == 0 { &flaky } else { &good };
        let lease = pool.acquire(t.clone()).await.unwrap();
        let o = if i % 2 == 0 && i % 6 != 0 {
            Outcome::Timeout
        } else {
            ok()
        };
        lease.release(o).await.unwrap();
        clock.advance(STEP);
    }
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.quarantine_entries, 0);
    assert!(snap.site("flaky.example").unwrap().degraded);
    assert!(!snap.site("good.example").unwrap().degraded);
    assert!(!snap.pool.frozen);
    let d = snap
        .decisions
        .iter()
        .find(|d| matches!(&d.subject, Subject::Site { site } if site == "flaky.example"))
        .unwrap();
    assert_eq!((d.from.as_str(), d.to.as_str()), ("ok", "degraded"));
    // The matrix shows the column.
    let cell = snap
        .matrix
        .iter()
        .find(|c| c.site == "flaky.example")
        .unwrap();
    assert!(cell.success_rate.unwrap() < 0.5);
}

#[tokio::test]
async fn p9_failures_towards_every_site_freeze_quarantining() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let sites = [
        Ticket::new().site("a.example"),
        Ticket::new().site("b.example"),
    ];
    for i in 0..300 {
        let lease = pool.acquire(sites[i % 2].clone()).await.unwrap();
        lease.release(Outcome::ConnectError).await.unwrap();
        clock.advance(STEP);
    }
    let snap = pool.snapshot().await;
    assert!(snap.pool.frozen);
    assert_eq!(snap.pool.quarantine_entries, 0);
    assert!(
        snap.decisions
            .iter()
            .any(|d| d.subject == Subject::Pool && d.to == "frozen")
    );
}

#[tokio::test]
async fn p9_one_bad_address_among_good_ones_is_still_quarantined() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let t = Ticket::new().site("shop.example");
    let target = addr(3);
    serve(&pool, &clock, &t, 50, STEP, |a| {
        if a == target { Outcome::Blocked } else { ok() }
    })
    .await;
    let snap = pool.snapshot().await;
    assert_eq!(
        snap.address(&target).unwrap().state,
        HealthState::Quarantined
    );
    assert!(!snap.site("shop.example").unwrap().degraded);
}

// ---- P10, P11 -------------------------------------------------------------------------------

#[tokio::test]
async fn p10_ramp_then_a_failure_during_it_sends_back_with_a_longer_wait() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    let first = quarantine_first(&pool, &clock).await;
    clock.advance(Duration::from_millis(first + 30_000));
    for _ in 0..5 {
        pool.report_probe(&addr(0), true).await.unwrap();
    }
    let share = |s: proxypool::Snapshot| s.address(&addr(0)).unwrap().ramp_share;
    assert_eq!(share(pool.snapshot().await), Some(0.10));
    clock.advance(Duration::from_secs(20));
    assert_eq!(share(pool.snapshot().await), Some(0.25));
    clock.advance(Duration::from_secs(20));
    assert_eq!(share(pool.snapshot().await), Some(0.50));
    // One failure during the ramp: straight back, with the next (doubled) wait.
    hit(&pool, &clock, &addr(0), Outcome::ConnectError, 1).await;
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.state, HealthState::Quarantined);
    assert!(
        a.reason.starts_with("failure during the ramp"),
        "{}",
        a.reason
    );
    let wait = a.quarantined_until_ms.unwrap() - snap.at_ms;
    assert!((96_000..=144_000).contains(&wait), "{wait}");
    assert_eq!(a.failed_cycles, 1);
}

#[tokio::test]
async fn p11_dead_after_five_failed_cycles_and_only_probes_revive() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    quarantine_first(&pool, &clock).await;
    for cycle in 1..=5 {
        let snap = pool.snapshot().await;
        let until = snap
            .address(&addr(0))
            .unwrap()
            .quarantined_until_ms
            .unwrap();
        clock.set(proxypool::Timestamp::from_millis(until));
        assert_eq!(
            state_of(&pool, &addr(0)).await,
            HealthState::Probing,
            "cycle {cycle}"
        );
        pool.report_probe(&addr(0), false).await.unwrap();
    }
    let snap = pool.snapshot().await;
    let a = snap.address(&addr(0)).unwrap();
    assert_eq!(a.state, HealthState::Dead);
    assert!(
        a.reason.contains("5 failed quarantine cycles in a row"),
        "{}",
        a.reason
    );
    // Passive traffic never reaches it; five probe passes bring it back on a ramp.
    let served = serve(&pool, &clock, &Ticket::new(), 50, STEP, |_| ok()).await;
    assert!(!served.contains(&addr(0)));
    clock.advance(Duration::from_secs(30));
    for _ in 0..5 {
        pool.report_probe(&addr(0), true).await.unwrap();
    }
    let snap = pool.snapshot().await;
    assert_eq!(snap.address(&addr(0)).unwrap().state, HealthState::Healthy);
}

// ---- P13, P14, leases -----------------------------------------------------------------------

#[tokio::test]
async fn p13_an_address_at_its_lease_cap_is_skipped() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 2;
    let pool = pool_with(2, &clock, cfg).await;
    let bound = pool.acquire(Ticket::new().key("k")).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(pool.acquire(Ticket::new()).await.unwrap());
    }
    assert_eq!(
        pool.acquire(Ticket::new()).await.unwrap_err(),
        AcquireError::NoAddressAvailable
    );
    assert!(matches!(
        pool.acquire(Ticket::new().key("k")).await.unwrap_err(),
        AcquireError::BoundAddressBusy { .. }
    ));
    drop(held.pop());
    drop(bound);
    assert!(pool.acquire(Ticket::new().key("k")).await.is_ok());
}

#[tokio::test]
async fn p14_an_unreleased_lease_expires_after_five_minutes() {
    let clock = ManualClock::new();
    let pool = pool(2, &clock).await;
    let lease = pool.acquire(Ticket::new()).await.unwrap();
    clock.advance(Duration::from_secs(299));
    assert_eq!(pool.snapshot().await.pool.active_leases, 1);
    clock.advance(Duration::from_secs(1));
    let snap = pool.snapshot().await;
    assert_eq!((snap.pool.active_leases, snap.pool.expired), (0, 1));
    assert!(snap.addresses.iter().all(|a| a.active_leases == 0));
    // A late release still reports its outcome and frees nothing twice.
    lease.release(ok()).await.unwrap();
    let snap = pool.snapshot().await;
    assert!(snap.addresses.iter().all(|a| a.active_leases == 0));
    assert_eq!(snap.pool.released, 1);
}

#[tokio::test]
async fn a_dropped_lease_is_recorded_as_abandoned_and_frees_its_slot() {
    let clock = ManualClock::new();
    let pool = pool(2, &clock).await;
    let lease = pool.acquire(Ticket::new()).await.unwrap();
    let a = lease.address().redacted().to_owned();
    drop(lease);
    let snap = pool.snapshot().await;
    assert_eq!((snap.pool.active_leases, snap.pool.abandoned), (0, 1));
    assert_eq!(snap.address(&a).unwrap().totals.abandoned, 1);
}

#[tokio::test]
async fn an_abandoned_lease_is_recorded_as_abandoned_and_frees_its_slot() {
    let clock = ManualClock::new();
    let pool = pool(2, &clock).await;
    let lease = pool.acquire(Ticket::new()).await.unwrap();
    let a = lease.address().redacted().to_owned();
    lease.abandon().await.unwrap();
    let snap = pool.snapshot().await;
    assert_eq!((snap.pool.active_leases, snap.pool.abandoned), (0, 1));
    assert_eq!(snap.address(&a).unwrap().totals.abandoned, 1);
}

#[tokio::test]
async fn rate_limited_cools_the_address_for_that_site_only() {
    let clock = ManualClock::new();
    let pool = pool_with(2, &clock, rr()).await;
    let shop = Ticket::new().site("shop.example");
    let l = pool.acquire(shop.clone()).await.unwrap();
    let cooled = l.address().clone();
    l.release(Outcome::RateLimited {
        retry_after: Duration::from_secs(30),
    })
    .await
    .unwrap();
    for _ in 0..4 {
        let l = pool.acquire(shop.clone()).await.unwrap();
        assert_ne!(l.address(), &cooled);
    }
    let other: HashSet<_> = serve(
        &pool,
        &clock,
        &Ticket::new().site("news.example"),
        4,
        STEP,
        |_| ok(),
    )
    .await
    .into_iter()
    .collect();
    assert!(other.contains(cooled.as_str()));
    clock.advance(Duration::from_secs(30));
    let served = serve(&pool, &clock, &shop, 4, STEP, |_| ok()).await;
    assert!(served.contains(&cooled.as_str().to_owned()));
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.quarantine_entries, 0);
    assert_eq!(
        snap.address(cooled.as_str()).unwrap().totals.rate_limited,
        1
    );
}

#[tokio::test]
async fn p16_the_matrix_column_of_site_less_tickets_and_their_rate_limits() {
    let clock = ManualClock::new();
    let pool = pool_with(2, &clock, rr()).await;
    let shop = Ticket::new().site("shop.example");
    // Address 0: 2 site-less successes, 1 site-less timeout, 1 success on the shop.
    for (t, o) in [
        (Ticket::new(), ok()),
        (Ticket::new(), ok()),
        (Ticket::new(), Outcome::Timeout),
        (shop.clone(), ok()),
    ] {
        let l = pool.acquire(t).await.unwrap();
        assert_eq!(l.address().as_str(), addr(0));
        l.release(o).await.unwrap();
        let other = pool
            .acquire(Ticket::new().site("other.example"))
            .await
            .unwrap();
        other.release(ok()).await.unwrap();
    }
    let snap = pool.snapshot().await;
    let row = |site: &str| {
        snap.matrix
            .iter()
            .find(|c| c.address == addr(0) && c.site == site)
            .cloned()
            .unwrap()
    };
    let unsited = row("-");
    assert_eq!((unsited.totals.successes, unsited.totals.failures), (2, 1));
    assert_eq!(unsited.window_samples, 3);
    assert_eq!(row("shop.example").totals.successes, 1);
    // A rate limit on a site-less ticket cools the address for site-less tickets only.
    let l = pool.acquire(Ticket::new()).await.unwrap();
    let cooled = l.address().clone();
    l.release(Outcome::RateLimited {
        retry_after: Duration::from_secs(10),
    })
    .await
    .unwrap();
    for _ in 0..3 {
        assert_ne!(
            pool.acquire(Ticket::new()).await.unwrap().address(),
            &cooled
        );
    }
    let on_shop = serve(&pool, &clock, &shop, 4, STEP, |_| ok()).await;
    assert!(on_shop.contains(&cooled.as_str().to_owned()));
    let snap = pool.snapshot().await;
    let c = snap
        .matrix
        .iter()
        .find(|c| c.address == cooled.redacted() && c.site == "-")
        .unwrap();
    assert!(c.cooling_until_ms.is_some());
    assert_eq!(c.totals.rate_limited, 1);
}

#[tokio::test]
async fn a_rate_limited_bound_address_keeps_the_session_and_says_how_long() {
    let clock = ManualClock::new();
    let pool = pool(4, &clock).await;
    let t = Ticket::new().key("k").site("shop.example");
    let l = pool.acquire(t.clone()).await.unwrap();
    l.release(Outcome::RateLimited {
        retry_after: Duration::from_secs(20),
    })
    .await
    .unwrap();
    clock.advance(Duration::from_secs(5));
    match pool.acquire(t.clone()).await.unwrap_err() {
        AcquireError::BoundAddressCooling { retry_in, .. } => {
            assert_eq!(retry_in, Duration::from_secs(15));
        }
        e => panic!("{e}"),
    }
    clock.advance(Duration::from_secs(15));
    assert_eq!(pool.acquire(t).await.unwrap().choice(), Choice::Bound);
}

// ---- P16 ------------------------------------------------------------------------------------

#[tokio::test]
async fn p16_snapshot_is_plain_serialisable_data_without_passwords() {
    let clock = ManualClock::new();
    let pool = build(
        Pool::builder()
            .address("http://user:s3cret@10.0.0.1:8080")
            .address("socks5://10.0.0.2:1080")
            .clock(clock.clone())
            .seed(3),
    )
    .await;
    let l = pool.acquire(Ticket::new().site("x.example")).await.unwrap();
    l.release(ok()).await.unwrap();
    let snap = pool.snapshot().await;
    let json = serde_json::to_string(&snap).unwrap();
    assert!(!json.contains("s3cret"));
    let back: proxypool::Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    assert_eq!(snap.pool.count(HealthState::Healthy), 2);
    assert_eq!(snap.pool.acquired, 1);
}

/// A recorder's samples (name, labels, value: counters and gauges by value, histograms by
/// their number of samples). Reading resets them.
fn drain(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, Vec<String>, f64)> {
    use metrics_util::debugging::DebugValue;
    let samples = snapshotter.snapshot().into_vec().into_iter();
    samples
        .map(|(key, .., value)| {
            let key = key.key();
            let labels = key.labels().map(|l| format!("{}={}", l.key(), l.value()));
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (key.name().to_owned(), labels.collect(), value)
        })
        .collect()
}

/// The sum of the samples named `name` (with label `label`, `key=value`, if given).
fn total(samples: &[(String, Vec<String>, f64)], name: &str, label: Option<&str>) -> f64 {
    samples
        .iter()
        .filter(|(n, labels, _)| n == name && label.is_none_or(|l| labels.iter().any(|x| x == l)))
        .map(|(.., v)| v)
        .sum()
}

#[test]
fn p16_metrics_go_through_the_facade() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut samples = metrics::with_local_recorder(&recorder, || {
        // The recorder is this thread's, so every task runs here.
        runtime().block_on(async {
            let clock = ManualClock::new();
            let pool = pool_with(10, &clock, rr()).await;
            fail_first(&pool, &clock, 10, 3, Outcome::ConnectError).await;
            let l = pool.acquire(Ticket::new().site("s.example")).await.unwrap();
            // Pool-wide gauges as of this snapshot (a shared store sets them from it).
            let snap = pool.snapshot().await.pool;
            let gauges = drain(&snapshotter);
            assert_eq!(total(&gauges, "proxypool_address_active_leases", None), 1.0);
            assert_eq!(total(&gauges, "proxypool_addresses", None), 10.0);
            assert_eq!(
                total(&gauges, "proxypool_addresses", Some("state=quarantined")),
                snap.quarantined as f64
            );
            assert_eq!(
                total(&gauges, "proxypool_quarantine_cap_occupancy", None),
                snap.quarantined as f64 / snap.quarantine_cap as f64
            );
            l.release(ok()).await.unwrap();
            let unknown = pool.acquire(Ticket::new().sub_pool("nowhere")).await;
            assert!(matches!(unknown, Err(AcquireError::UnknownSubPool(_))));
            gauges
        })
    });
    samples.extend(drain(&snapshotter));
    let total = |name, label| total(&samples, name, label);
    assert_eq!(
        total("proxypool_acquires_total", Some("choice=round_robin")),
        31.0
    );
    let failures = total(
        "proxypool_address_outcomes_total",
        Some("outcome=connect_error"),
    );
    assert_eq!(failures, 3.0);
    assert_eq!(total("proxypool_address_outcomes_total", None), 31.0);
    assert_eq!(total("proxypool_address_latency_seconds", None), 28.0);
    assert_eq!(
        total("proxypool_cell_outcomes_total", Some("site=s.example")),
        1.0
    );
    assert_eq!(total("proxypool_quarantine_entries_total", None), 1.0);
    assert_eq!(total("proxypool_address_quarantines_total", None), 1.0);
    assert_eq!(
        total(
            "proxypool_acquire_failures_total",
            Some("reason=unknown_sub_pool")
        ),
        1.0
    );
}

#[test]
fn p16_an_expired_lease_is_counted_lost_once() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let lost = metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let clock = ManualClock::new();
            let pool = pool(2, &clock).await;
            // Never released nor dropped: only its deadline ends it.
            std::mem::forget(pool.acquire(Ticket::new()).await.unwrap());
            clock.advance(Duration::from_secs(300));
            // Read twice: the second finds nothing new to count.
            assert_eq!(pool.snapshot().await.pool.expired, 1);
            assert_eq!(pool.snapshot().await.pool.expired, 1);
            drain(&snapshotter)
        })
    });
    let label = Some("how=expired");
    assert_eq!(total(&lost, "proxypool_leases_lost_total", label), 1.0);
}

#[tokio::test]
async fn p16_the_decision_log_has_transitions_not_requests() {
    let clock = ManualClock::new();
    let pool = pool_with(10, &clock, rr()).await;
    serve(&pool, &clock, &Ticket::new(), 500, STEP, |_| ok()).await;
    let before = pool.snapshot().await.decisions.len();
    assert_eq!(
        before, 10,
        "one 'added' decision per address, none per request"
    );
    // After 50 good outcomes, six failures: suspect, then confirmed — two transitions.
    fail_first(&pool, &clock, 10, 6, Outcome::ConnectError).await;
    let snap = pool.snapshot().await;
    assert_eq!(snap.decisions.len(), before + 2);
    let last = snap.decisions.last().unwrap();
    assert_eq!(last.to, "quarantined");
    assert!(last.reason.contains("quarantined for"), "{}", last.reason);
}
