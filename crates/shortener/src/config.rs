//! The service's configuration: one typed struct resolved from flags, environment, a TOML
//! file and defaults, in that order of precedence.

use crate::cli::{AggregateArgs, ImportArgs, ServeArgs, StoreArgs};
use crate::scaleout::redis::RedisTarget;
use crate::store::guarded::DEFAULT_STORE_TIMEOUT;
use crate::store::postgres::{DEFAULT_POOL_SIZE, DatabaseUrl};
use anyhow::{Context, bail};
use serde::Deserialize;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub store: StoreConfig,
    /// `None` until the listener is bound: the default is `http://<bound address>`.
    pub base_url: Option<String>,
    pub no_anonymous: bool,
    pub anon_creates_per_hour: NonZeroU32,
    pub user_creates_per_hour: NonZeroU32,
    pub blocklist: Option<PathBuf>,
    /// Threat feed files (`--threat-feed`, repeatable).
    pub threat_feeds: Vec<PathBuf>,
    /// Abuse reports one client IP may file per hour.
    pub reports_per_hour: NonZeroU32,
    /// Reports from this many distinct addresses within 24 h disable a link.
    pub auto_disable_reports: u32,
    /// Domains whose links are never disabled automatically.
    pub trusted_domains: Option<PathBuf>,
    pub trust_forwarded_for: bool,
    /// The country database of analytics (`--geoip`).
    pub geoip: Option<PathBuf>,
    pub id_block_size: u64,
    pub redirect_max_age: u32,
    pub edge_cache_ttl: Option<u32>,
    /// Read replicas of the PostgreSQL store.
    pub replicas: Vec<DatabaseUrl>,
    /// Replicas further behind are skipped.
    pub replica_max_lag: Duration,
    /// 302 or 301 (301 only with `edge_cache_ttl`).
    pub edge_status: u16,
    /// Deadline of each store call of the request path.
    pub store_timeout: Duration,
    /// How long past its TTL a cached link may be served while the store is unavailable.
    pub stale_max_age: Duration,
    pub cache_mb: u64,
    pub cache_ttl: Duration,
    pub negative_cache_ttl: Duration,
    pub drop_bot_clicks: bool,
    pub click_queue: usize,
    pub click_flush: Duration,
    /// Audit rows older than this many days are pruned.
    pub audit_retention_days: u32,
    /// When anonymous creates need a solved CAPTCHA.
    pub captcha: crate::captcha::CaptchaMode,
    /// `--captcha-after`: fraction of the hourly budget.
    pub captcha_after: f64,
    /// `--captcha-max-number`: the difficulty.
    pub captcha_max_number: u64,
    /// Set: the scale-out mode's shared parts live there.
    pub(crate) redis: Option<RedisTarget>,
    /// With `redis`: whether this process applies the click stream.
    pub aggregator: bool,
    pub http: service_edge::HttpLimits,
}

/// Everything `aggregate` needs, validated.
#[derive(Debug, Clone)]
pub struct AggregateConfig {
    pub store: StoreConfig,
    pub(crate) redis: RedisTarget,
    pub consumer: String,
}

impl AggregateConfig {
    pub fn resolve(args: AggregateArgs) -> anyhow::Result<Self> {
        let file = service_edge::read_toml::<FileConfig>(args.store.config.as_deref())?;
        let Some(redis) = redis_target(&args.store, &file)? else {
            bail!("aggregate needs --redis (or SHORTENER_REDIS, or `redis` in the config file)");
        };
        let consumer = match args.consumer {
            Some(name) if name.trim().is_empty() || name.contains(char::is_whitespace) => {
                bail!("--consumer must be a non-empty name without spaces")
            }
            Some(name) => name,
            None => format!("aggregate-{}", hostname()),
        };
        let store = StoreConfig::from_layers(&args.store, &file)?;
        needs_database(&store)?;
        Ok(Self {
            store,
            redis,
            consumer,
        })
    }
}

/// Lines per import transaction unless `--batch` says otherwise. Large: a batch rewrites
/// most pages of the trees keyed by random codes, whatever its size, so the bigger the
/// batch the fewer page writes per link (BENCHMARKS.md, 2026-12-02 import entry).
pub const DEFAULT_IMPORT_BATCH: usize = 500_000;

/// Whether a file holds CSV or JSON lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportFormat {
    Csv,
    JsonLines,
}

/// Everything `import` needs, validated.
#[derive(Debug, Clone)]
pub struct ImportConfig {
    pub store: StoreConfig,
    pub file: PathBuf,
    pub user: String,
    /// `None`: decided from the file (extension, then first line).
    pub format: Option<ImportFormat>,
    pub base_url: Option<String>,
    pub blocklist: Option<PathBuf>,
    pub threat_feeds: Vec<PathBuf>,
    pub batch: usize,
    pub restart: bool,
}

impl ImportConfig {
    pub fn resolve(args: ImportArgs) -> anyhow::Result<Self> {
        let file = service_edge::read_toml::<FileConfig>(args.store.config.as_deref())?;
        redis_target(&args.store, &file)?;
        shortener_core::token::validate_user_name(&args.user)?;
        let format = match args.format.as_deref() {
            None => None,
            Some("csv") => Some(ImportFormat::Csv),
            Some("jsonl" | "ndjson") => Some(ImportFormat::JsonLines),
            Some(other) => bail!("--format must be csv or jsonl, not {other:?}"),
        };
        let batch = args.batch.unwrap_or(DEFAULT_IMPORT_BATCH);
        if !(1..=1_000_000).contains(&batch) {
            bail!("--batch must be between 1 and 1000000");
        }
        let base_url = args.base_url.or(file.base_url.clone());
        if let Some(base) = &base_url {
            check_base_url(base)?;
        }
        Ok(Self {
            store: StoreConfig::from_layers(&args.store, &file)?,
            file: args.file,
            user: args.user,
            format,
            base_url,
            blocklist: args.blocklist.or(file.blocklist),
            threat_feeds: if args.threat_feed.is_empty() {
                file.threat_feed.unwrap_or_default()
            } else {
                args.threat_feed
            },
            batch,
            restart: args.restart,
        })
    }
}

/// The scale-out mode shares one PostgreSQL: instances on separate embedded files would
/// share L2 entries and click batches between unrelated stores.
fn needs_database(store: &StoreConfig) -> anyhow::Result<()> {
    match store {
        StoreConfig::Postgres { .. } => Ok(()),
        StoreConfig::Embedded { .. } => {
            bail!("--redis needs --database: the scale-out mode shares one PostgreSQL database")
        }
    }
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `--redis` over the file; an empty value means unset.
fn redis_target(args: &StoreArgs, file: &FileConfig) -> anyhow::Result<Option<RedisTarget>> {
    args.redis
        .as_deref()
        .or(file.redis.as_deref())
        .filter(|url| !url.is_empty())
        .map(RedisTarget::parse)
        .transpose()
        .map_err(Into::into)
}

/// Where the links live: `--database` chooses PostgreSQL, otherwise the embedded store.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// The embedded SQLite file in this directory.
    Embedded { data_dir: PathBuf },
    /// A PostgreSQL database that any number of instances share.
    Postgres { url: DatabaseUrl, pool_size: usize },
}

impl StoreConfig {
    /// Resolves the store flags (which already include the environment) over the file.
    pub fn resolve(args: &StoreArgs) -> anyhow::Result<Self> {
        let file = service_edge::read_toml::<FileConfig>(args.config.as_deref())?;
        // Every subcommand takes `--redis`; a wrong one is refused even where unused.
        redis_target(args, &file)?;
        Self::from_layers(args, &file)
    }

    fn from_layers(args: &StoreArgs, file: &FileConfig) -> anyhow::Result<Self> {
        // An empty value (`SHORTENER_DATABASE=`) means unset, as with libpq's variables.
        let database = args
            .database
            .as_deref()
            .or(file.database.as_deref())
            .filter(|url| !url.is_empty());
        let pool_size = args
            .database_pool_size
            .or(file.database_pool_size)
            .unwrap_or(DEFAULT_POOL_SIZE);
        if !(1..=1000).contains(&pool_size) {
            bail!("database-pool-size must be between 1 and 1000");
        }
        Ok(match database {
            Some(url) => Self::Postgres {
                url: url.parse()?,
                pool_size,
            },
            None => Self::Embedded {
                data_dir: args
                    .data_dir
                    .clone()
                    .or_else(|| file.data_dir.clone())
                    .unwrap_or_else(|| PathBuf::from("./data")),
            },
        })
    }
}

impl std::fmt::Display for StoreConfig {
    /// Names the store for logs and messages, never with a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded { data_dir } => write!(
                f,
                "{}",
                data_dir.join(crate::store::sqlite::DB_FILE).display()
            ),
            Self::Postgres { url, .. } => write!(f, "postgres {url}"),
        }
    }
}

/// The TOML file: the same settings as the flags, with snake_case names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    database: Option<String>,
    database_pool_size: Option<usize>,
    redis: Option<String>,
    base_url: Option<String>,
    no_anonymous: Option<bool>,
    anon_creates_per_hour: Option<u32>,
    user_creates_per_hour: Option<u32>,
    blocklist: Option<PathBuf>,
    threat_feed: Option<Vec<PathBuf>>,
    reports_per_hour: Option<u32>,
    auto_disable_reports: Option<u32>,
    trusted_domains: Option<PathBuf>,
    trust_forwarded_for: Option<bool>,
    geoip: Option<PathBuf>,
    id_block_size: Option<u64>,
    redirect_max_age: Option<u32>,
    edge_cache_ttl: Option<u32>,
    edge_status: Option<u16>,
    database_replica: Option<Vec<String>>,
    replica_max_lag_ms: Option<u64>,
    store_timeout_ms: Option<u64>,
    stale_max_age: Option<u64>,
    cache_mb: Option<u64>,
    cache_ttl: Option<u64>,
    negative_cache_ttl: Option<u64>,
    drop_bot_clicks: Option<bool>,
    click_queue: Option<usize>,
    click_flush_ms: Option<u64>,
    no_aggregator: Option<bool>,
    audit_retention_days: Option<u32>,
    captcha: Option<String>,
    captcha_after: Option<f64>,
    captcha_max_number: Option<u64>,
    /// What one client may hold or send (`[http]`).
    #[serde(default)]
    http: service_edge::HttpLimitsFile,
}

fn positive(name: &str, value: u32) -> anyhow::Result<NonZeroU32> {
    NonZeroU32::new(value).with_context(|| format!("{name} must be at least 1"))
}

impl ServeConfig {
    /// Resolves the flags (which already include the environment) over the file and defaults.
    pub fn resolve(args: ServeArgs) -> anyhow::Result<Self> {
        let file = service_edge::read_toml::<FileConfig>(args.store.config.as_deref())?;
        let redis = redis_target(&args.store, &file)?;
        let store = StoreConfig::from_layers(&args.store, &file)?;
        if redis.is_some() {
            needs_database(&store)?;
        }
        let replicas = replicas(args.database_replica, file.database_replica.clone(), &store)?;
        let config = Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
            store,
            base_url: args.base_url.or(file.base_url),
            no_anonymous: args.no_anonymous.or(file.no_anonymous).unwrap_or(false),
            anon_creates_per_hour: positive(
                "anon-creates-per-hour",
                args.anon_creates_per_hour
                    .or(file.anon_creates_per_hour)
                    .unwrap_or(100),
            )?,
            user_creates_per_hour: positive(
                "user-creates-per-hour",
                args.user_creates_per_hour
                    .or(file.user_creates_per_hour)
                    .unwrap_or(1000),
            )?,
            blocklist: args.blocklist.or(file.blocklist),
            threat_feeds: if args.threat_feed.is_empty() {
                file.threat_feed.unwrap_or_default()
            } else {
                args.threat_feed
            },
            reports_per_hour: positive(
                "reports-per-hour",
                args.reports_per_hour
                    .or(file.reports_per_hour)
                    .unwrap_or(10),
            )?,
            auto_disable_reports: args
                .auto_disable_reports
                .or(file.auto_disable_reports)
                .unwrap_or(5),
            trusted_domains: args.trusted_domains.or(file.trusted_domains),
            trust_forwarded_for: args
                .trust_forwarded_for
                .or(file.trust_forwarded_for)
                .unwrap_or(false),
            geoip: args.geoip.or(file.geoip),
            id_block_size: args.id_block_size.or(file.id_block_size).unwrap_or(10_000),
            redirect_max_age: args
                .redirect_max_age
                .or(file.redirect_max_age)
                .unwrap_or(60),
            edge_cache_ttl: args.edge_cache_ttl.or(file.edge_cache_ttl),
            replicas,
            replica_max_lag: Duration::from_millis(
                args.replica_max_lag_ms
                    .or(file.replica_max_lag_ms)
                    .unwrap_or(5000),
            ),
            edge_status: args.edge_status.or(file.edge_status).unwrap_or(302),
            store_timeout: args
                .store_timeout_ms
                .or(file.store_timeout_ms)
                .map_or(DEFAULT_STORE_TIMEOUT, Duration::from_millis),
            stale_max_age: Duration::from_secs(
                args.stale_max_age.or(file.stale_max_age).unwrap_or(86_400),
            ),
            cache_mb: args.cache_mb.or(file.cache_mb).unwrap_or(64),
            cache_ttl: Duration::from_secs(args.cache_ttl.or(file.cache_ttl).unwrap_or(300)),
            negative_cache_ttl: Duration::from_secs(
                args.negative_cache_ttl
                    .or(file.negative_cache_ttl)
                    .unwrap_or(60),
            ),
            drop_bot_clicks: args
                .drop_bot_clicks
                .or(file.drop_bot_clicks)
                .unwrap_or(false),
            click_queue: args.click_queue.or(file.click_queue).unwrap_or(65_536),
            click_flush: Duration::from_millis(
                args.click_flush_ms.or(file.click_flush_ms).unwrap_or(1000),
            ),
            redis,
            aggregator: !args.no_aggregator.or(file.no_aggregator).unwrap_or(false),
            audit_retention_days: args
                .audit_retention_days
                .or(file.audit_retention_days)
                .unwrap_or(shortener_core::audit::DEFAULT_RETENTION_DAYS),
            captcha: args
                .captcha
                .or(file.captcha)
                .as_deref()
                .unwrap_or("auto")
                .parse()
                .map_err(anyhow::Error::msg)?,
            captcha_after: args.captcha_after.or(file.captcha_after).unwrap_or(0.8),
            captcha_max_number: args
                .captcha_max_number
                .or(file.captcha_max_number)
                .unwrap_or(100_000),
            http: args.http.resolve(&file.http)?,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if !(1..=1_000_000).contains(&self.id_block_size) {
            bail!("id-block-size must be between 1 and 1000000");
        }
        if !(1..=1_000_000).contains(&self.cache_mb) {
            bail!("cache-mb must be between 1 and 1000000");
        }
        if self.cache_ttl.is_zero() || self.negative_cache_ttl.is_zero() {
            bail!("cache-ttl and negative-cache-ttl must be at least 1 second");
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&self.replica_max_lag)
        {
            bail!("replica-max-lag-ms must be between 100 and 600000");
        }
        match (self.edge_status, self.edge_cache_ttl) {
            (302, _) | (301, Some(_)) => {}
            (301, None) => bail!(
                "edge-status 301 needs --edge-cache-ttl: without it browsers keep a 301 forever"
            ),
            (other, _) => bail!("edge-status must be 301 or 302, not {other}"),
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&self.store_timeout) {
            bail!("store-timeout-ms must be between 10 and 60000");
        }
        if self.stale_max_age > Duration::from_secs(30 * 86_400) {
            bail!("stale-max-age must be at most 2592000 seconds (30 days)");
        }
        if !(1..=10_000).contains(&self.auto_disable_reports) {
            bail!("auto-disable-reports must be between 1 and 10000");
        }
        if !(self.captcha_after > 0.0 && self.captcha_after <= 1.0) {
            bail!("captcha-after must be a fraction above 0 and at most 1");
        }
        if !(1..=100_000_000).contains(&self.captcha_max_number) {
            bail!("captcha-max-number must be between 1 and 100000000");
        }
        if !(1..=36_500).contains(&self.audit_retention_days) {
            bail!("audit-retention-days must be between 1 and 36500");
        }
        if self.click_queue == 0 {
            bail!("click-queue must be at least 1");
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&self.click_flush) {
            bail!("click-flush-ms must be between 10 and 60000");
        }
        if let Some(base) = &self.base_url {
            check_base_url(base)?;
        }
        Ok(())
    }
}

/// `--database-replica` (flags and environment) over the file; empty values are unset.
fn replicas(
    args: Vec<String>,
    file: Option<Vec<String>>,
    store: &StoreConfig,
) -> anyhow::Result<Vec<DatabaseUrl>> {
    let urls: Vec<String> = if args.is_empty() {
        file.unwrap_or_default()
    } else {
        args
    };
    let urls: Vec<DatabaseUrl> = urls
        .iter()
        .filter(|url| !url.trim().is_empty())
        .map(|url| url.trim().parse().context("database-replica"))
        .collect::<anyhow::Result<_>>()?;
    if !urls.is_empty() && !matches!(store, StoreConfig::Postgres { .. }) {
        bail!("--database-replica needs --database: replicas are of a PostgreSQL primary");
    }
    Ok(urls)
}

/// The base URL must be an absolute http(s) URL without query or fragment.
pub fn check_base_url(base: &str) -> anyhow::Result<()> {
    let url = url::Url::parse(base).with_context(|| format!("base-url {base:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        bail!("base-url {base:?} must be an http or https URL with a host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("base-url {base:?} must not have a query or fragment");
    }
    Ok(())
}
