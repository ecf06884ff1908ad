//! Active probes (P12) against real tinyproxy instances on loopback and a control HTTP server
//! of the test's own; the schedule on a manual clock.
#![allow(clippy::unwrap_used)]

use std::net::TcpStream as StdStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proxypool::probe::{Check, CheckError, CheckFuture, HttpGet, Majority, ProbeSchedule, Prober};
use proxypool::{HealthState, ManualClock, Pool, PoolConfig, ProxyAddress, Subject, Ticket};
use rustls::pki_types::PrivatePkcs8KeyDer;
use testkit::Process;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use url::Url;

const MARKER: &str = "control-ok-42";

fn tinyproxy(dir: &Path, port: u16) -> Process {
    tinyproxy_with(dir, port, "")
}

/// tinyproxy with `extra` configuration lines (without any `ConnectPort`, it tunnels to every
/// port).
fn tinyproxy_with(dir: &Path, port: u16, extra: &str) -> Process {
    let conf = dir.join(format!("tinyproxy-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 5\nLogLevel Error\n{extra}"
        ),
    )
    .unwrap();
    let mut cmd = Command::new("tinyproxy");
    cmd.arg("-d").arg("-c").arg(&conf);
    let p = Process::spawn(&format!("tinyproxy-{port}"), cmd).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while StdStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tinyproxy on {port} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

/// Answers one request with 200 and the marker.
async fn answer(mut s: impl AsyncRead + AsyncWrite + Unpin) {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let body = MARKER;
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// A control endpoint answering every request with 200 and the marker.
async fn control_server() -> Url {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s));
        }
    });
    Url::parse(&format!("http://127.0.0.1:{port}/probe")).unwrap()
}

/// The same over TLS, with a self-signed certificate for 127.0.0.1; its URL and the
/// certificate (DER) to trust.
async fn tls_control_server() -> (Url, Vec<u8>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    answer(tls).await;
                }
            });
        }
    });
    let url = Url::parse(&format!("https://127.0.0.1:{port}/probe?x=1")).unwrap();
    (url, cert.der().to_vec())
}

/// An `https://` control URL through tinyproxy: a tunnel (CONNECT), then TLS verified against
/// the roots — the test's own certificate only when told to trust it — and the GET inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_control_urls_go_through_a_verified_tunnel() {
    let dir = std::env::temp_dir().join(format!("proxypool-probes-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = testkit::free_port("127.0.0.1");
    let _proxy = tinyproxy(&dir, port);
    let proxy = ProxyAddress::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let (url, certificate) = tls_control_server().await;

    let trusted = HttpGet::new(url.clone())
        .body_marker(MARKER)
        .trust(certificate.clone());
    trusted.check(&proxy).await.unwrap();
    let wrong_marker = trusted.clone().body_marker("not-there");
    assert!(matches!(
        wrong_marker.check(&proxy).await,
        Err(CheckError::MarkerMissing(_))
    ));
    let err = HttpGet::new(url.clone()).check(&proxy).await.unwrap_err();
    assert!(matches!(err, CheckError::Tls(_)), "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    // A proxy that tunnels to port 443 only refuses this one.
    let strict_port = testkit::free_port("127.0.0.1");
    let _strict = tinyproxy_with(&dir, strict_port, "ConnectPort 443\n");
    let strict = ProxyAddress::parse(&format!("http://127.0.0.1:{strict_port}")).unwrap();
    let err = trusted.check(&strict).await.unwrap_err();
    assert!(matches!(err, CheckError::Tunnel(403)), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn decisions_of(s: &proxypool::Snapshot, address: &str) -> Vec<(String, String, String)> {
    s.decisions
        .iter()
        .filter(|d| matches!(&d.subject, Subject::Address { address: a } if a == address))
        .map(|d| (d.from.clone(), d.to.clone(), d.reason.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_proxy_is_quarantined_and_comes_back_through_probing_and_the_ramp() {
    let dir = std::env::temp_dir().join(format!("proxypool-probes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| testkit::free_port("127.0.0.1")).collect();
    let mut proxies: Vec<Process> = ports.iter().map(|&p| tinyproxy(&dir, p)).collect();
    let addresses: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();

    // Two good control endpoints and one broken one: the majority still passes.
    let (a, b) = (control_server().await, control_server().await);
    let broken = Url::parse(&format!(
        "http://127.0.0.1:{}/",
        testkit::free_port("127.0.0.1")
    ))
    .unwrap();
    let check = Majority::new(vec![
        Arc::new(
            HttpGet::new(a)
                .body_marker(MARKER)
                .timeout(Duration::from_secs(5)),
        ),
        Arc::new(
            HttpGet::new(b)
                .body_marker(MARKER)
                .timeout(Duration::from_secs(5)),
        ),
        Arc::new(HttpGet::new(broken).timeout(Duration::from_secs(5))),
    ]);

    let clock = ManualClock::new();
    let mut config = PoolConfig::default();
    // One of three may be quarantined (the default 30 % rounds to none of three… at least one).
    config.quarantine_cap = 0.5;
    let pool = Pool::builder()
        .addresses(addresses.clone())
        .config(config.clone())
        .clock(clock.clone())
        .seed(3)
        .build()
        .unwrap();
    let prober = Prober::new(pool.clone(), Arc::new(check), ProbeSchedule::default()).seed(3);

    // The first round schedules; idle healthy addresses are probed within 60 s; all pass.
    assert!(prober.round().await.unwrap().probed.is_empty());
    clock.advance(Duration::from_secs(61));
    let round = prober.round().await.unwrap();
    assert_eq!(round.probed.len(), 3, "{round:?}");
    assert!(round.probed.iter().all(|(_, ok)| *ok), "{round:?}");

    // Stop proxy 0: three failed probes (the fall threshold) quarantine it.
    proxies[0].kill();
    let target = &addresses[0];
    let mut rounds = 0;
    while pool.snapshot().await.address(target).unwrap().state != HealthState::Quarantined {
        rounds += 1;
        assert!(rounds <= 3, "not quarantined after {rounds} rounds");
        clock.advance(Duration::from_secs(61));
        let round = prober.round().await.unwrap();
        assert!(!round.our_side, "{round:?}");
        assert!(round.probed.contains(&(target.clone(), false)), "{round:?}");
    }
    assert_eq!(rounds, 3);
    let snap = pool.snapshot().await;
    let until = snap.address(target).unwrap().quarantined_until_ms.unwrap();

    // While quarantined it is not probed.
    clock.advance(Duration::from_secs(20));
    let round = prober.round().await.unwrap();
    assert!(round.probed.iter().all(|(a, _)| a != target), "{round:?}");

    // Start it again; when the wait ends it is probed every 10 s: five passes in a row (and
    // the 30 s dwell) send it to the ramp, which ends at full weight.
    proxies[0] = tinyproxy(&dir, ports[0]);
    clock.set(proxypool::Timestamp::from_millis(until));
    let mut passes = 0;
    loop {
        let round = prober.round().await.unwrap();
        if round.probed.contains(&(target.clone(), true)) {
            passes += 1;
        }
        let row = pool.snapshot().await.address(target).unwrap().clone();
        if row.state == HealthState::Healthy {
            assert!(row.ramp_share.is_some_and(|s| s < 1.0), "{row:?}");
            break;
        }
        assert_eq!(row.state, HealthState::Probing);
        assert!(passes <= 5, "still probing after {passes} passes");
        clock.advance(config.health.min_dwell / 3);
    }
    assert_eq!(passes, config.health.rise_successes);
    clock.advance(config.health.ramp_duration);
    let snap = pool.snapshot().await;
    assert_eq!(snap.address(target).unwrap().ramp_share, None);

    let steps: Vec<_> = decisions_of(&snap, target)
        .into_iter()
        .map(|(from, to, _)| format!("{from}->{to}"))
        .collect();
    assert_eq!(
        steps,
        [
            "absent->healthy",
            "healthy->quarantined",
            "quarantined->probing",
            "probing->healthy"
        ],
        "{:#?}",
        decisions_of(&snap, target)
    );
    for other in &addresses[1..] {
        assert_eq!(snap.address(other).unwrap().state, HealthState::Healthy);
    }
    for (from, to, reason) in decisions_of(&snap, target) {
        eprintln!("decision: {from} -> {to}: {reason}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A check whose verdict the test sets, counting its calls.
#[derive(Debug, Default)]
struct Scripted {
    pass: bool,
    calls: AtomicUsize,
}

impl Check for Scripted {
    fn check<'a>(&'a self, _proxy: &'a ProxyAddress) -> CheckFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let pass = self.pass;
        Box::pin(async move {
            if pass {
                Ok(())
            } else {
                Err(CheckError::Timeout(Duration::ZERO))
            }
        })
    }
}

fn scripted_pool(clock: &ManualClock) -> Pool {
    Pool::builder()
        .addresses((1..=4).map(|i| format!("http://10.0.0.{i}:3128")))
        .clock(clock.clone())
        .seed(1)
        .build()
        .unwrap()
}

#[tokio::test]
async fn every_probe_failing_at_once_is_our_side_and_quarantines_nothing() {
    let clock = ManualClock::new();
    let pool = scripted_pool(&clock);
    let prober = Prober::new(
        pool.clone(),
        Arc::new(Scripted::default()),
        ProbeSchedule::default(),
    );
    prober.round().await.unwrap();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(61));
        let round = prober.round().await.unwrap();
        assert_eq!(round.probed.len(), 4);
        assert!(round.our_side);
    }
    let snap = pool.snapshot().await;
    assert!(
        snap.addresses
            .iter()
            .all(|a| a.state == HealthState::Healthy)
    );
}

#[tokio::test]
async fn schedule_spreads_idle_probes_over_30_to_60_s_and_skips_busy_addresses() {
    let clock = ManualClock::new();
    let pool = scripted_pool(&clock);
    let check = Arc::new(Scripted {
        pass: true,
        ..Scripted::default()
    });
    let prober = Prober::new(pool.clone(), check.clone(), ProbeSchedule::default()).seed(9);
    // Nothing is due before 30 s: the first round only schedules.
    assert!(prober.round().await.unwrap().probed.is_empty());
    clock.advance(Duration::from_secs(29));
    assert!(prober.round().await.unwrap().probed.is_empty());
    // Held leases make an address busy: it is not probed.
    let lease = pool.acquire(Ticket::new()).await.unwrap();
    let busy = lease.address().redacted().to_owned();
    clock.advance(Duration::from_secs(32));
    let round = prober.round().await.unwrap();
    assert_eq!(round.probed.len(), 3, "{round:?}");
    assert!(round.probed.iter().all(|(a, _)| *a != busy));
    assert_eq!(check.calls.load(Ordering::SeqCst), 3);
    drop(lease);
    // Its timer restarted when it was seen busy; idle now, it is probed within 60 s.
    clock.advance(Duration::from_secs(61));
    let round = prober.round().await.unwrap();
    assert!(round.probed.iter().any(|(a, _)| *a == busy), "{round:?}");
}
