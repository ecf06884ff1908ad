//! `soak`: mixed load on one service for a long time, printing every `--every` seconds the
//! server's resident memory, its open file descriptors and the p99 of the window's requests,
//! so that growth without bound shows. Run it with `scripts/soak` (release binaries, 10 min
//! per service); it is not part of the test command.
//!
//! - shortener: redirects (80 %), creates (15 %), analytics (5 %), embedded store.
//! - proxypool: API acquire + release (50 %), plain HTTP through the gateway to a local
//!   target over a real tinyproxy upstream (50 %).

use anyhow::{Context, bail};
use clap::Parser;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::Process;

#[derive(Debug, Parser)]
#[command(about = "Soak: mixed load on one service, RSS / fds / p99 every window")]
struct Args {
    /// `shortener` or `proxypool`.
    service: String,
    /// The service's binary.
    #[arg(long)]
    bin: PathBuf,
    /// Total run time in seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Seconds per printed window.
    #[arg(long, default_value_t = 30)]
    every: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
}

/// Latencies (µs) and errors of the current window.
#[derive(Default)]
struct Window {
    latencies: Mutex<Vec<u32>>,
    errors: AtomicU64,
}

impl Window {
    fn record(&self, started: Instant, ok: bool) {
        let us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
        self.latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(us);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (requests, errors, p99 in ms) since the last call.
    fn take(&self) -> (usize, u64, f64) {
        let mut l = std::mem::take(
            &mut *self
                .latencies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        l.sort_unstable();
        let p99 = l
            .get((l.len() * 99 / 100).min(l.len().saturating_sub(1)))
            .map_or(0.0, |us| f64::from(*us) / 1000.0);
        (l.len(), self.errors.swap(0, Ordering::Relaxed), p99)
    }
}

/// Resident memory (MiB) and open descriptors of a process, from /proc.
fn rss_and_fds(pid: u32) -> (f64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    (kib / 1024.0, fds)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let window = Arc::new(Window::default());
    let (server, _helpers, load) = match args.service.as_str() {
        "shortener" => shortener(&args, dir.path(), &window).await?,
        "proxypool" => proxypool(&args, dir.path(), &window).await?,
        other => bail!("unknown service {other:?}: shortener or proxypool"),
    };
    println!(
        "{:>6}  {:>9}  {:>5}  {:>9}  {:>7}  {:>8}",
        "t (s)", "RSS (MiB)", "fds", "requests", "errors", "p99 (ms)"
    );
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(args.seconds) {
        tokio::time::sleep(Duration::from_secs(args.every)).await;
        let (rss, fds) = rss_and_fds(server.pid());
        let (requests, errors, p99) = window.take();
        println!(
            "{:>6}  {rss:>9.1}  {fds:>5}  {requests:>9}  {errors:>7}  {p99:>8.2}",
            started.elapsed().as_secs()
        );
        let _ = std::io::stdout().flush();
    }
    for task in load {
        task.abort();
    }
    drop(server);
    Ok(())
}

type Started = (Process, Vec<Process>, Vec<tokio::task::JoinHandle<()>>);

async fn shortener(args: &Args, dir: &Path, window: &Arc<Window>) -> anyhow::Result<Started> {
    let data = dir.join("data");
    let out = Command::new(&args.bin)
        .args(["token", "create", "--admin", "--user", "soak", "--data-dir"])
        .arg(&data)
        .output()
        .context("shortener token create")?;
    let token = String::from_utf8(out.stdout)?
        .lines()
        .last()
        .context("no token printed")?
        .to_owned();
    let mut cmd = Command::new(&args.bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("SHORTENER_LOG", "warn");
    let mut server = Process::spawn("shortener", cmd)?;
    let line = server
        .wait_for_line("listening on ", Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let base = line.trim_start_matches("listening on ").to_owned();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent("Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0")
        .build()?;
    let codes = Arc::new(Mutex::new(Vec::<String>::new()));
    let load = (0..args.clients)
        .map(|i| {
            let (client, base, token) = (client.clone(), base.clone(), token.clone());
            let (codes, window) = (codes.clone(), window.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                let mut n = 0u64;
                loop {
                    n += 1;
                    let roll: u32 = rng.random_range(0..100);
                    let picked = {
                        let codes = codes
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        (!codes.is_empty()).then(|| codes[rng.random_range(0..codes.len())].clone())
                    };
                    let started = Instant::now();
                    if roll < 15 || picked.is_none() {
                        let body =
                            serde_json::json!({"long_url": format!("https://example.com/{i}/{n}")});
                        let r = client
                            .post(format!("{base}/api/v1/links"))
                            .bearer_auth(&token)
                            .json(&body)
                            .send()
                            .await;
                        let ok = matches!(&r, Ok(r) if r.status() == 201);
                        if let Ok(r) = r
                            && let Ok(v) = r.json::<serde_json::Value>().await
                            && let Some(code) = v["short_code"].as_str()
                        {
                            let mut codes = codes
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            // A bounded working set: redirects hit links that exist.
                            if codes.len() < 10_000 {
                                codes.push(code.to_owned());
                            }
                        }
                        window.record(started, ok);
                    } else if let Some(code) = picked {
                        let (url, want) = if roll < 20 {
                            (format!("{base}/api/v1/links/{code}/analytics"), 200)
                        } else {
                            (format!("{base}/{code}"), 302)
                        };
                        let r = client.get(url).bearer_auth(&token).send().await;
                        window.record(started, matches!(r, Ok(r) if r.status() == want));
                    }
                }
            })
        })
        .collect();
    Ok((server, Vec::new(), load))
}

async fn proxypool(args: &Args, dir: &Path, window: &Arc<Window>) -> anyhow::Result<Started> {
    // A local target and a real upstream proxy in front of it.
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let target_addr = target.local_addr()?;
    tokio::spawn(serve_target(target));
    let proxy_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let conf = dir.join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!(
            "Port {proxy_port}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 30\nLogLevel Error\nMaxClients 512\n"
        ),
    )?;
    let mut cmd = Command::new("tinyproxy");
    cmd.arg("-d").arg("-c").arg(&conf);
    let tinyproxy =
        Process::spawn("tinyproxy", cmd).context("tinyproxy (Debian package tinyproxy)")?;
    let upstreams = dir.join("upstreams.txt");
    std::fs::write(&upstreams, format!("http://127.0.0.1:{proxy_port}\n"))?;
    let mut cmd = Command::new(&args.bin);
    cmd.args(["serve", "--upstreams"])
        .arg(&upstreams)
        .args([
            "--proxy-listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .env("PROXYPOOL_LOG", "warn");
    let mut server = Process::spawn("proxypool", cmd)?;
    let line = server
        .wait_for_line("gateway listening on ", Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let gateway = line["gateway listening on ".len()..].to_owned();
    let line = server
        .wait_for_line("api listening on ", Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    let api = line["api listening on ".len()..].to_owned();
    let api_client = reqwest::Client::new();
    let proxied = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{gateway}"))?)
        .build()?;
    let load = (0..args.clients)
        .map(|i| {
            let (api_client, proxied, api) = (api_client.clone(), proxied.clone(), api.clone());
            let window = window.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                loop {
                    n += 1;
                    let started = Instant::now();
                    if n.is_multiple_of(2) {
                        let ok = lease_round(&api_client, &api, i, n).await;
                        window.record(started, ok);
                    } else {
                        let r = proxied
                            .get(format!("http://{target_addr}/{i}/{n}"))
                            .send()
                            .await;
                        window.record(started, matches!(r, Ok(r) if r.status() == 200));
                    }
                }
            })
        })
        .collect();
    Ok((server, vec![tinyproxy], load))
}

/// An acquire (keyed every other time) and its release.
async fn lease_round(client: &reqwest::Client, api: &str, i: usize, n: u64) -> bool {
    let body = if n.is_multiple_of(4) {
        serde_json::json!({"key": format!("acct-{i}-{}", n % 64), "site": "soak.example"})
    } else {
        serde_json::json!({"site": "soak.example"})
    };
    let Ok(r) = client
        .post(format!("{api}/v1/acquire"))
        .json(&body)
        .send()
        .await
    else {
        return false;
    };
    let Ok(lease) = r.json::<serde_json::Value>().await else {
        return false;
    };
    let release =
        serde_json::json!({"lease_id": lease["lease_id"], "outcome": "success", "latency_ms": 20});
    matches!(
        client.post(format!("{api}/v1/release")).json(&release).send().await,
        Ok(r) if r.status() == 204
    )
}

/// Answers every request with a short 200, on keep-alive connections.
async fn serve_target(listener: tokio::net::TcpListener) {
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let service = service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"ok\n"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
