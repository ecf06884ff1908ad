//! `proxypool serve`: wires the pool, its prober, the upstream file, the gateway and the API, and runs
//! until SIGTERM or SIGINT.

use crate::addresses::Registry;
use crate::api::{self, Api, LeaseBook};
use crate::auth::Credentials;
use crate::config::ServeConfig;
use crate::gateway::{self, Gateway};
use crate::sessions::SessionTable;
use crate::upstreams;
use anyhow::Context;
use metrics_exporter_prometheus::PrometheusBuilder;
use proxypool::Pool;
use proxypool::probe::{Check, HttpGet, Majority, ProbeSchedule, Prober, TcpConnect};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often idle sessions, expired API leases and metric histograms are tidied.
const HOUSEKEEPING: Duration = Duration::from_secs(10);
/// How often the prober looks for addresses due a probe.
const PROBE_TICK: Duration = Duration::from_secs(1);

pub(crate) async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    // The pool registers its metric handles when it is built: the recorder comes first.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let credentials = match &config.auth_file {
        Some(path) => Some(Arc::new(Credentials::load(path)?)),
        None => None,
    };
    let builder = Pool::builder().config(config.pool.clone());
    let pool = match &config.redis {
        Some(redis) => builder
            .redis(redis.clone())
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("[redis] {e}"))?,
        None => builder.build().map_err(|e| anyhow::anyhow!("[pool] {e}"))?,
    };
    let registry = Registry::new(pool.clone());
    upstreams::apply(&config.upstreams, &registry)
        .await
        .with_context(|| format!("cannot read upstreams {}", config.upstreams.display()))?;
    upstreams::spawn_reloader(
        config.upstreams.clone(),
        registry.clone(),
        config.upstreams_poll,
    );

    // Active probes (P12): idle, quarantined and dead upstreams are checked on a schedule.
    let check: Arc<dyn Check> = if config.probe_urls.is_empty() {
        Arc::new(TcpConnect::new(config.gateway.connect_timeout))
    } else {
        Arc::new(Majority::new(
            config
                .probe_urls
                .iter()
                .map(|url| Arc::new(HttpGet::new(url.clone())) as Arc<dyn Check>)
                .collect(),
        ))
    };
    let prober =
        tokio::spawn(Prober::new(pool.clone(), check, ProbeSchedule::default()).run(PROBE_TICK));

    let sessions = SessionTable::new(config.pool.sticky_ttl);
    let gateway = Arc::new(Gateway::new(
        pool.clone(),
        sessions.clone(),
        credentials.clone(),
        config.gateway.clone(),
    ));
    let api = Arc::new(Api {
        pool,
        registry,
        sessions: sessions.clone(),
        leases: LeaseBook::default(),
        credentials,
        prometheus: prometheus.clone(),
        lease_ttl: config.pool.lease_ttl,
        max_body_bytes: config.api_limits.max_body_bytes,
    });

    let proxy_listener = tokio::net::TcpListener::bind(config.proxy_listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.proxy_listen))?;
    let api_listener = tokio::net::TcpListener::bind(config.api_listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.api_listen))?;
    let proxy_bound = proxy_listener.local_addr().context("gateway address")?;
    let api_bound = api_listener.local_addr().context("API address")?;

    let housekeeping = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HOUSEKEEPING);
            loop {
                tick.tick().await;
                sessions.sweep();
                api.leases.sweep();
                prometheus.run_upkeep();
            }
        })
    };

    tracing::info!(gateway = %proxy_bound, api = %api_bound, "serving");
    // Tests and scripts read the bound ports from these lines.
    println!("gateway listening on {proxy_bound}");
    println!("api listening on http://{api_bound}");
    let _ = std::io::stdout().flush();

    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let gateway_task = tokio::spawn(gateway::serve(proxy_listener, gateway, stopped.clone()));
    let api_task = tokio::spawn(api::serve(
        api_listener,
        config.api_limits,
        api::router(api),
        wait(stopped),
    ));
    service_edge::shutdown_signal().await;
    prober.abort();
    let _ = stop.send(true);
    gateway_task.await.context("the gateway panicked")?;
    api_task.await.context("the API server panicked")?;
    housekeeping.abort();
    tracing::info!("shut down cleanly");
    Ok(())
}
