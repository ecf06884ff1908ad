//! `shortener serve`: wires the store, the pipeline and the router, and runs until a signal.

use crate::allocator::CodeAllocator;
use crate::api::{App, router};
use crate::bots::BotDetector;
use crate::cache::{CacheSettings, LinkCache, SharedLayer};
use crate::captcha::{Captcha, CaptchaSettings};
use crate::clicks;
use crate::config::{self, AggregateConfig, ServeConfig, StoreConfig};
use crate::feeds::{self, Swapped, Watched};
use crate::metrics::Metrics;
use crate::ratelimit::CreateLimits;
use crate::scaleout::Scaleout;
use crate::scaleout::clickstream;
use crate::scaleout::ratelimit::SharedLimits;
use crate::scaleout::redis::{self, Redis};
use crate::store::guarded::GuardedStore;
use crate::store::replicas::Replicated;
use crate::visits::{GeoIp, VisitFold};
use anyhow::Context;
use axum::http::{HeaderValue, StatusCode};
use shortener_core::listing::CursorCipher;
use shortener_core::long_url::{Blocklist, UrlPolicy, own_host_of};
use shortener_core::report::AutoDisable;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often idle rate-limit buckets are forgotten.
const LIMITER_SWEEP: Duration = Duration::from_secs(60);

pub(crate) async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let feed_files = feeds::files(config.blocklist.as_deref(), &config.threat_feeds);
    let threats = Swapped::new(feeds::load_all(&feed_files)?);
    let trusted_domains = Swapped::new(match &config.trusted_domains {
        Some(path) => feeds::load_trusted(path)
            .with_context(|| format!("cannot read trusted domains {}", path.display()))?,
        None => Blocklist::default(),
    });
    let geoip = config
        .geoip
        .as_deref()
        .map(GeoIp::open)
        .transpose()?
        .map(Arc::new);
    let metrics = Arc::new(Metrics::new());
    metrics
        .trusted_domains
        .set(crate::metrics::gauge(trusted_domains.get().len()));
    let mut store = crate::store::open(&config.store, Some(config.store_timeout)).await?;
    if let StoreConfig::Postgres { .. } = config.store {
        // The embedded store has no server that could stop answering: its writer thread
        // and SQLite's busy timeout bound it, and a deadline would only fail slow fsyncs.
        store = Arc::new(GuardedStore::new(
            store,
            config.store_timeout,
            metrics.clone(),
        ));
    }
    let (mut replica_monitor, mut replicated) = (None, None);
    if let StoreConfig::Postgres { url, pool_size } = &config.store
        && !config.replicas.is_empty()
    {
        let router = Arc::new(
            Replicated::open(
                store,
                url,
                &config.replicas,
                *pool_size,
                config.store_timeout,
                config.replica_max_lag,
                metrics.clone(),
            )
            .await?,
        );
        replica_monitor = Some(tokio::spawn(router.clone().monitor_forever()));
        store = router.clone();
        replicated = Some(router);
    }
    let scaleout = match &config.redis {
        Some(target) => {
            Some(Scaleout::connect(target, config.negative_cache_ttl, config.stale_max_age).await?)
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let base_url = config
        .base_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"))
        .trim_end_matches('/')
        .to_owned();

    let mut own_hosts: Vec<String> = own_host_of(&base_url).into_iter().collect();
    if !bound.ip().is_unspecified() {
        own_hosts.push(bound.ip().to_string());
    }
    let policy = UrlPolicy { own_hosts };

    let visitor_key: [u8; 16] = store
        .secret(crate::visits::KEY_NAME, rand::random::<[u8; 16]>().to_vec())
        .await?
        .try_into()
        .map_err(|_| anyhow::anyhow!("the stored visitor key is not 16 bytes"))?;
    let (stop_clicks, stop_rx) = watch::channel(false);
    let (recorder, click_writer) = clicks::start(
        store.clone(),
        scaleout.as_ref().map(|s| s.shipper.clone()),
        VisitFold::new(visitor_key, geoip.clone()),
        metrics.clone(),
        // A lane per thread that serves redirects.
        clicks::ClickQueue::new(
            config.click_queue,
            tokio::runtime::Handle::current().metrics().num_workers(),
        ),
        config.click_flush,
        stop_rx,
    );
    let cache = LinkCache::new(
        store.clone(),
        scaleout.as_ref().map(|s| SharedLayer {
            l2: s.l2.clone(),
            invalidations: s.invalidations.clone(),
        }),
        metrics.clone(),
        CacheSettings {
            max_bytes: config.cache_mb * 1024 * 1024,
            ttl: config.cache_ttl,
            negative_ttl: config.negative_cache_ttl,
            stale_max_age: config.stale_max_age,
        },
    )?;
    let cache_control = match config.edge_cache_ttl {
        Some(ttl) => format!("public, max-age={ttl}"),
        None => format!("private, max-age={}", config.redirect_max_age),
    };
    let mut limits = CreateLimits::new(
        config.anon_creates_per_hour,
        config.user_creates_per_hour,
        config.reports_per_hour,
    );
    if let Some(scaleout) = &scaleout {
        limits = limits.shared(SharedLimits::new(scaleout.redis.clone()));
    }
    let captcha_key = store
        .secret(
            crate::captcha::KEY_NAME,
            rand::random::<[u8; 32]>().to_vec(),
        )
        .await?;
    let captcha = Captcha::new(
        captcha_key,
        CaptchaSettings {
            mode: config.captcha,
            after: config.captcha_after,
            max_number: config.captcha_max_number,
        },
        scaleout.as_ref().map(|s| s.redis.clone()),
        store.clone(),
    );
    let web_key = store
        .secret(
            crate::api::WEB_KEY_NAME,
            rand::random::<[u8; 32]>().to_vec(),
        )
        .await?;
    let cursor_key: [u8; 16] = store
        .secret(
            crate::api::CURSOR_KEY_NAME,
            rand::random::<[u8; 16]>().to_vec(),
        )
        .await?
        .try_into()
        .map_err(|key: Vec<u8>| {
            anyhow::anyhow!(
                "the store's {} is {} bytes, not 16",
                crate::api::CURSOR_KEY_NAME,
                key.len()
            )
        })?;
    let app = Arc::new(App {
        web_key,
        cursor_cipher: CursorCipher::new(cursor_key),
        captcha,
        allocator: CodeAllocator::new(store.clone(), config.id_block_size).await?,
        store,
        cache,
        bots: BotDetector::default(),
        drop_bot_clicks: config.drop_bot_clicks,
        countries: geoip.is_some(),
        clicks: recorder,
        limits,
        policy,
        threats: threats.clone(),
        trusted_domains: trusted_domains.clone(),
        auto_disable: AutoDisable {
            threshold: config.auto_disable_reports,
        },
        metrics,
        base_url,
        no_anonymous: config.no_anonymous,
        trust_forwarded_for: config.trust_forwarded_for,
        redirect_status: StatusCode::from_u16(config.edge_status)
            .context("invalid redirect status")?,
        // Static bytes: every redirect clones this value, and cloning shared bytes is an
        // atomic count that both worker threads would write on each request. One short
        // string per `serve`, leaked on purpose.
        cache_control: HeaderValue::from_maybe_shared(bytes::Bytes::from_static(
            Box::leak(cache_control.into_boxed_str()).as_bytes(),
        ))
        .context("invalid Cache-Control")?,
        scaleout: scaleout.clone(),
        replicas: replicated.clone(),
        max_body_bytes: config.http.max_body_bytes,
        token_uses: Default::default(),
        tokens: Default::default(),
    });
    let (stop_stream, stream_stopped) = watch::channel(false);
    let mut background = Vec::new();
    let mut stream_aggregator = None;
    if let Some(scaleout) = &scaleout {
        let listener = scaleout.invalidations.clone().listen_forever(
            {
                let app = app.clone();
                move |code: &str, version| {
                    app.cache.invalidate_below(code, version);
                    // Another instance's change: replicas may not have it yet.
                    if let Some(replicated) = &replicated {
                        replicated.changed(code);
                    }
                }
            },
            {
                let app = app.clone();
                move || app.cache.invalidate_all()
            },
        );
        background.push(tokio::spawn(listener));
        background.push(tokio::spawn(scaleout.invalidations.clone().retry_forever()));
        if config.aggregator {
            let own = Redis::connect(&scaleout.target, redis::BACKGROUND_TIMEOUT)
                .await
                .with_context(|| format!("cannot reach Redis at {}", scaleout.target))?;
            stream_aggregator = Some(tokio::spawn(clickstream::aggregate(
                Arc::new(own),
                app.store.clone(),
                app.metrics.clone(),
                format!("serve-{}-{}", config::hostname(), std::process::id()),
                clickstream::CLAIM_IDLE,
                stream_stopped,
            )));
        }
    }

    background.push(tokio::spawn({
        let app = app.clone();
        async move { crate::change_poll::follow_forever(&app.cache, app.store.as_ref()).await }
    }));

    let sweep = Arc::new(tokio::sync::Notify::new());
    if !feed_files.is_empty() || config.trusted_domains.is_some() {
        let watched = Watched {
            feed_files,
            feeds: threats,
            trusted_file: config.trusted_domains.clone(),
            trusted: trusted_domains,
            metrics: app.metrics.clone(),
        };
        background.push(tokio::spawn(feeds::reload_forever(watched, sweep.clone())));
    }
    background.push(tokio::spawn(feeds::sweep_forever(app.clone(), sweep)));
    background.push(tokio::spawn({
        let app = app.clone();
        async move {
            let mut tick = tokio::time::interval(crate::cache::IDLE_SWEEP);
            loop {
                tick.tick().await;
                let app = app.clone();
                // A blocking task: the sweep holds each shard's write lock while it walks it.
                let swept = tokio::task::spawn_blocking(move || app.cache.drop_idle(crate::now()));
                if let Err(e) = swept.await {
                    tracing::error!(error = %e, "the cache's idle sweep failed");
                }
            }
        }
    }));
    background.push(tokio::spawn({
        let app = app.clone();
        async move {
            let mut tick = tokio::time::interval(crate::cache::RENEWAL_TICK);
            // After a slow batch, the next one waits a whole tick: no burst of catching up.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = app.cache.renew_unknown(crate::now()).await {
                    tracing::debug!(error = %e, "cannot read unknown codes again");
                }
            }
        }
    }));
    background.push(tokio::spawn({
        let (store, days) = (app.store.clone(), config.audit_retention_days);
        async move { crate::retention::prune_forever(store.as_ref(), days).await }
    }));

    let sweeper = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(LIMITER_SWEEP);
            loop {
                tick.tick().await;
                app.limits.forget_idle();
            }
        })
    };

    tracing::info!(listen = %bound, store = %config.store, "serving");
    // Tests and scripts read the bound port from this line.
    println!("listening on http://{bound}");
    let _ = std::io::stdout().flush();

    crate::http::serve(
        listener,
        config.http,
        app.clone(),
        router(app.clone()),
        service_edge::shutdown_signal(),
    )
    .await;

    sweeper.abort();
    tracing::info!("stopped accepting requests; flushing clicks");
    let _ = stop_clicks.send(true);
    click_writer.await.context("the click writer panicked")?;
    // After the last shipment, so that a lone instance applies its own last clicks.
    let _ = stop_stream.send(true);
    if let Some(aggregator) = stream_aggregator {
        aggregator.await.context("the click aggregator panicked")?;
    }
    for task in background.into_iter().chain(replica_monitor) {
        task.abort();
    }
    if let Some(scaleout) = &app.scaleout {
        // Link changes other instances have not heard of yet: a last bounded try.
        for _ in 0..5 {
            if scaleout.invalidations.retry_pending().await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let left = scaleout.invalidations.pending();
        if left > 0 {
            tracing::error!(
                changes = left,
                "exiting with link changes unannounced; other instances see them when their caches expire"
            );
        }
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// `shortener aggregate`: applies the click stream until a signal.
pub(crate) async fn aggregate(config: AggregateConfig) -> anyhow::Result<()> {
    let store = crate::store::open(&config.store, None).await?;
    let connection = Redis::connect(&config.redis, redis::BACKGROUND_TIMEOUT)
        .await
        .with_context(|| format!("cannot reach Redis at {}", config.redis))?;
    let (stop, stopped) = watch::channel(false);
    let aggregator = tokio::spawn(clickstream::aggregate(
        Arc::new(connection),
        store,
        Arc::new(Metrics::new()),
        config.consumer.clone(),
        clickstream::CLAIM_IDLE,
        stopped,
    ));
    tracing::info!(consumer = %config.consumer, store = %config.store, redis = %config.redis, "aggregating clicks");
    println!("aggregating as {}", config.consumer);
    let _ = std::io::stdout().flush();
    service_edge::shutdown_signal().await;
    let _ = stop.send(true);
    aggregator.await.context("the click aggregator panicked")?;
    Ok(())
}
