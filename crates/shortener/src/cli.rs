//! Command line: `shortener serve`, `shortener aggregate`, `shortener migrate` and
//! `shortener token create`.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// A URL shortener: short links, fast redirects, per-day click analytics.
#[derive(Debug, Parser)]
#[command(name = "shortener", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and the redirects.
    Serve(Box<ServeArgs>),
    /// Apply clicks from the Redis click stream to the store, without serving (scale-out).
    Aggregate(AggregateArgs),
    /// Create or update the store's schema (PostgreSQL; the embedded store does it on open).
    Migrate(MigrateArgs),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Disable or enable a link, as an admin (actor `cli` in the audit trail). Serving
    /// processes on the same store notice within about a second.
    #[command(subcommand)]
    Link(LinkCommand),
    /// Read the audit trail, newest first.
    Audit(AuditArgs),
    /// Create links in bulk from a file: CSV (`long_url[,custom_alias[,expires_at]]`) or
    /// JSON lines (`{"long_url": …, "custom_alias": …, "expires_at": …}`), validated as
    /// creates are, owned by --user. An interrupted import resumes where it stopped.
    Import(ImportArgs),
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The file; `expires_at` is RFC 3339 (default: 1825 days from now).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Who owns the links (and is the actor of their audit rows).
    #[arg(long, value_name = "NAME")]
    pub user: String,
    /// `csv` or `jsonl` [default: by the file's extension, else by its first line].
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// The service's public base URL: destinations on its host are refused, as by `serve`.
    #[arg(long, env = "SHORTENER_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,
    /// File of blocked domains, one more threat feed (as `serve --blocklist`).
    #[arg(long, env = "SHORTENER_BLOCKLIST", value_name = "FILE")]
    pub blocklist: Option<PathBuf>,
    /// Threat feed file (repeatable; as `serve --threat-feed`): matching lines are refused.
    #[arg(long, value_name = "FILE")]
    pub threat_feed: Vec<PathBuf>,
    /// Lines per transaction [default: 500000]. Larger is faster on a large store but takes
    /// more memory (about 600 bytes a line) and holds the store's write lock longer: a
    /// serving process's writes wait for each batch.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Import from the first line even if an earlier import of this file stopped midway
    /// or finished.
    #[arg(long)]
    pub restart: bool,
}

#[derive(Debug, Subcommand)]
pub enum LinkCommand {
    /// Disable a link: it answers 410 until enabled.
    Disable(LinkDisableArgs),
    /// Enable a disabled link again.
    Enable(LinkArgs),
}

#[derive(Debug, Args)]
pub struct LinkArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The short code or alias.
    pub code: String,
}

#[derive(Debug, Args)]
pub struct LinkDisableArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The short code or alias.
    pub code: String,
    /// Why (1 to 500 characters); kept with the link and in the audit trail.
    #[arg(long)]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only this link.
    #[arg(long, value_name = "CODE")]
    pub code: Option<String>,
    /// Only this actor (a user, `anonymous`, `cli`, `auto-reports`, `threat-feed`).
    #[arg(long, value_name = "NAME")]
    pub actor: Option<String>,
    /// Only this action (created, edited, disabled, enabled, deleted, reported,
    /// token_issued, token_revoked).
    #[arg(long, value_name = "ACTION")]
    pub action: Option<String>,
    /// From this instant on (RFC 3339, e.g. 2026-12-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Before this instant (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Most rows printed [default: 100].
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a new bearer token; it is printed alone on the last line of stdout.
    Create(TokenCreateArgs),
    /// List every token: id, user, name, admin, created, last used (to the minute). Never
    /// the secret.
    List(TokenListArgs),
    /// Revoke a token by the id `token create` and `token list` print; every serving
    /// process refuses it within half a second (tokens are cached ≤ 500 ms).
    Revoke(TokenRevokeArgs),
}

/// Where the links live; every subcommand takes these. Unset flags fall back to the
/// environment (handled by clap), then to the `--config` file, then to the defaults.
#[derive(Debug, Args, Default)]
pub struct StoreArgs {
    /// TOML file with any of the settings (flags and environment win over it).
    #[arg(long, env = "SHORTENER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of the embedded store [default: ./data]; unused with --database.
    #[arg(long, env = "SHORTENER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL instead of the embedded store: postgres://user[:password]@host[:port]/dbname
    /// (`connect_timeout=SECONDS` and the other libpq URL parameters are accepted).
    #[arg(long, env = "SHORTENER_DATABASE", value_name = "URL")]
    pub database: Option<String>,
    /// Connections to PostgreSQL per process [default: 16].
    #[arg(long, env = "SHORTENER_DATABASE_POOL_SIZE", value_name = "N")]
    pub database_pool_size: Option<usize>,
    /// Redis shared by every instance (scale-out): L2 link cache, invalidations, create
    /// limits and the click stream. `redis://host:port`, or for a Cluster
    /// `redis+cluster://host:port,host:port` or a comma-separated list of redis:// nodes.
    #[arg(long, env = "SHORTENER_REDIS", value_name = "URL")]
    pub redis: Option<String>,
}

/// Flags of `serve`. Each is optional here: unset flags fall back to the environment
/// (handled by clap), then to the `--config` file, then to the defaults in `config.rs`.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "SHORTENER_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Public base of short links [default: http://<listen>].
    #[arg(long, env = "SHORTENER_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,
    /// Refuse link creation without a token.
    #[arg(long, env = "SHORTENER_NO_ANONYMOUS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub no_anonymous: Option<bool>,
    /// Links an anonymous client IP may create per hour [default: 100].
    #[arg(long, env = "SHORTENER_ANON_CREATES_PER_HOUR", value_name = "N")]
    pub anon_creates_per_hour: Option<u32>,
    /// Links a user may create per hour [default: 1000].
    #[arg(long, env = "SHORTENER_USER_CREATES_PER_HOUR", value_name = "N")]
    pub user_creates_per_hour: Option<u32>,
    /// File of blocked domains, one per line: one more threat feed (see --threat-feed).
    #[arg(long, env = "SHORTENER_BLOCKLIST", value_name = "FILE")]
    pub blocklist: Option<PathBuf>,
    /// Threat feed file (repeatable; a list in the config file): domains, hosts-file lines
    /// or URLs, one per line. Creates of matching destinations get 400 `url_blocked`;
    /// re-read on change and on SIGHUP, after which active links that match are disabled.
    #[arg(long, value_name = "FILE")]
    pub threat_feed: Vec<PathBuf>,
    /// Abuse reports one client IP may file per hour [default: 10].
    #[arg(long, env = "SHORTENER_REPORTS_PER_HOUR", value_name = "N")]
    pub reports_per_hour: Option<u32>,
    /// Reports from this many distinct client IPs within 24 h disable a link pending review
    /// (actor `auto-reports`) [default: 5].
    #[arg(long, env = "SHORTENER_AUTO_DISABLE_REPORTS", value_name = "N")]
    pub auto_disable_reports: Option<u32>,
    /// File of trusted domains, one per line (subdomains included): their links are never
    /// disabled automatically. Read at start.
    #[arg(long, env = "SHORTENER_TRUSTED_DOMAINS", value_name = "FILE")]
    pub trusted_domains: Option<PathBuf>,
    /// A MaxMind-format database (GeoLite2/GeoIP2 Country or City, `.mmdb`): adds the
    /// `countries` breakdown to analytics. Read at start; a file that is not one is an error.
    #[arg(long, env = "SHORTENER_GEOIP", value_name = "FILE.mmdb")]
    pub geoip: Option<PathBuf>,
    /// Take the client IP from the last X-Forwarded-For entry (only behind a trusted proxy).
    #[arg(long, env = "SHORTENER_TRUST_FORWARDED_FOR", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub trust_forwarded_for: Option<bool>,
    /// Ids leased from the store per block [default: 10000].
    #[arg(long, env = "SHORTENER_ID_BLOCK_SIZE", value_name = "N")]
    pub id_block_size: Option<u64>,
    /// max-age of the private Cache-Control sent with redirects, in seconds [default: 60].
    #[arg(long, env = "SHORTENER_REDIRECT_MAX_AGE", value_name = "SECONDS")]
    pub redirect_max_age: Option<u32>,
    /// Let CDNs cache redirects: `Cache-Control: public, max-age=SECONDS` (clicks served by
    /// the CDN are not counted).
    #[arg(long, env = "SHORTENER_EDGE_CACHE_TTL", value_name = "SECONDS")]
    pub edge_cache_ttl: Option<u32>,
    /// A read replica of --database (repeatable; the environment takes a comma-separated
    /// list): redirect misses, link reads, analytics and token lookups go to a healthy one.
    #[arg(
        long,
        env = "SHORTENER_DATABASE_REPLICA",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub database_replica: Vec<String>,
    /// A replica further behind the primary than this is skipped until it catches up, in
    /// milliseconds [default: 5000].
    #[arg(long, env = "SHORTENER_REPLICA_MAX_LAG_MS", value_name = "MS")]
    pub replica_max_lag_ms: Option<u64>,
    /// Status of redirects: 302 (default) or 301. 301 needs --edge-cache-ttl, so that
    /// browsers and CDNs keep it only that long.
    #[arg(long, env = "SHORTENER_EDGE_STATUS", value_name = "301|302")]
    pub edge_status: Option<u16>,
    /// On PostgreSQL, the deadline of every store call of a request, waiting for a pooled
    /// connection included, and the statement_timeout [default: 250].
    #[arg(long, env = "SHORTENER_STORE_TIMEOUT_MS", value_name = "MS")]
    pub store_timeout_ms: Option<u64>,
    /// While the store is unavailable, links whose cache entry is past its TTL are still
    /// served for this long past it (never past their expiry), in seconds [default: 86400].
    #[arg(long, env = "SHORTENER_STALE_MAX_AGE", value_name = "SECONDS")]
    pub stale_max_age: Option<u64>,
    /// Memory for the in-process link cache, in MiB [default: 64].
    #[arg(long, env = "SHORTENER_CACHE_MB", value_name = "MIB")]
    pub cache_mb: Option<u64>,
    /// How long a cached link is trusted, in seconds [default: 300].
    #[arg(long, env = "SHORTENER_CACHE_TTL", value_name = "SECONDS")]
    pub cache_ttl: Option<u64>,
    /// How long an unknown code is remembered as unknown, in seconds [default: 60]: each code
    /// up to a quarter less, by its hash, so that codes first seen together are not all read
    /// again in the same second; one asked for in the last quarter of its time (a TTL of 4 s
    /// or more) is read again in the background, so that steady requests for it never wait on
    /// the store. Creating the code clears it: at once in this process (or one
    /// sharing its Redis), within about a second elsewhere on the same store (creates write
    /// change notes, which every process polls); the TTL only bounds memory and how long a
    /// missed note could matter.
    #[arg(long, env = "SHORTENER_NEGATIVE_CACHE_TTL", value_name = "SECONDS")]
    pub negative_cache_ttl: Option<u64>,
    /// Do not record clicks of bots, link previews and HEAD requests at all (by default they
    /// are counted apart, as `bot_clicks`).
    #[arg(long, env = "SHORTENER_DROP_BOT_CLICKS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub drop_bot_clicks: Option<bool>,
    /// Click events buffered in memory before new ones are dropped (and counted), split evenly
    /// between the worker threads [default: 65536].
    #[arg(long, env = "SHORTENER_CLICK_QUEUE", value_name = "N")]
    pub click_queue: Option<usize>,
    /// Longest wait before buffered clicks are written, in milliseconds [default: 1000].
    #[arg(long, env = "SHORTENER_CLICK_FLUSH_MS", value_name = "MS")]
    pub click_flush_ms: Option<u64>,
    /// With --redis: do not apply the click stream in this process (run `shortener
    /// aggregate` somewhere instead).
    #[arg(long, env = "SHORTENER_NO_AGGREGATOR", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub no_aggregator: Option<bool>,
    /// When anonymous creates must carry a solved ALTCHA challenge: off, auto (past
    /// --captcha-after of the hourly budget) or always [default: auto].
    #[arg(long, env = "SHORTENER_CAPTCHA", value_name = "MODE")]
    pub captcha: Option<String>,
    /// Fraction of an anonymous client's hourly create budget used before a CAPTCHA is
    /// asked for (auto mode) [default: 0.8].
    #[arg(long, env = "SHORTENER_CAPTCHA_AFTER", value_name = "FRACTION")]
    pub captcha_after: Option<f64>,
    /// Difficulty: the largest secret number of a challenge [default: 100000].
    #[arg(long, env = "SHORTENER_CAPTCHA_MAX_NUMBER", value_name = "N")]
    pub captcha_max_number: Option<u64>,
    /// Audit rows older than this many days are deleted (in small batches) [default: 400].
    #[arg(long, env = "SHORTENER_AUDIT_RETENTION_DAYS", value_name = "DAYS")]
    pub audit_retention_days: Option<u32>,
    #[command(flatten)]
    pub http: HttpArgs,
}

// A maximal create request is about 2.2 KiB.
service_edge::http_limit_args!(
    HttpArgs,
    "SHORTENER_",
    16384,
    "Largest API request body in bytes"
);

#[derive(Debug, Args)]
pub struct AggregateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Name of this aggregator in the Redis consumer group; a restarted aggregator with the
    /// same name resumes its unacknowledged batches at once [default: aggregate-<hostname>].
    #[arg(long, env = "SHORTENER_CONSUMER", value_name = "NAME")]
    pub consumer: Option<String>,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Who the token belongs to.
    #[arg(long, value_name = "NAME")]
    pub user: String,
    /// Admin tokens read and delete every link.
    #[arg(long)]
    pub admin: bool,
    /// A label for the operator ("ci", "alice's laptop"), shown by `token list`.
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct TokenListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct TokenRevokeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The token's id (12 hex digits).
    #[arg(value_name = "ID")]
    pub id: String,
}

/// Parses the command line, or explains the mistake in one line and exits 2.
pub fn parse() -> Cli {
    service_edge::parse_cli()
}
