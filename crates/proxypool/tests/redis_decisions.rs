//! The shared pool's decisions reach the logs of the process whose prober probes it. A binary
//! of its own: the test installs a global `tracing` subscriber, which other tests' events
//! (on other threads) must not reach or race.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxypool::probe::{Check, CheckFuture, ProbeSchedule, Prober};
use proxypool::{ManualClock, Outcome, Pool, PoolConfig, ProxyAddress, RedisOptions, Ticket};
use testkit::RedisServer;

/// Log lines written by `tracing`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Every probe passes.
#[derive(Debug)]
struct Pass;

impl Check for Pass {
    fn check<'a>(&'a self, _: &'a ProxyAddress) -> CheckFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

async fn process(redis: &RedisServer, clock: &ManualClock) -> Pool {
    Pool::builder()
        .addresses((1..=6).map(|i| format!("http://10.0.0.{i}:3128")))
        .config(PoolConfig::default())
        .clock(clock.clone())
        .redis(RedisOptions::new(redis.url(), "decisions"))
        .connect()
        .await
        .unwrap()
}

/// The process holding the prober role passes the shared pool's new decisions to its logs
/// (`proxypool::decision`), as the memory store does as it makes them — once, and none from
/// before it started; a prober without the role logs none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probers_process_logs_the_pools_decisions() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("proxypool-decisions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let pool = process(&redis, &clock).await;
    let prober = Prober::new(pool.clone(), Arc::new(Pass), ProbeSchedule::default()).seed(5);
    prober.round().await.unwrap();
    let other = process(&redis, &clock).await;
    let bystander = Prober::new(other.clone(), Arc::new(Pass), ProbeSchedule::default()).seed(6);
    bystander.round().await.unwrap();

    // Made through the other pool ("process"): three failures quarantine an address.
    let mut address = String::new();
    for _ in 0..3 {
        let lease = other.acquire(Ticket::new().key("acct")).await.unwrap();
        address = lease.address().redacted().to_owned();
        lease.release(Outcome::ConnectError).await.unwrap();
    }
    bystander.round().await.unwrap();
    assert!(!logs.text().contains("-> quarantined"), "{}", logs.text());
    prober.round().await.unwrap();
    let text = logs.text();
    let line = format!("address {address}: healthy -> quarantined");
    assert_eq!(text.matches(&line).count(), 1, "{text}");
    assert!(
        !text.contains("absent -> healthy"),
        "old decisions logged: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
