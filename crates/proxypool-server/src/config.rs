//! The server's configuration: one typed struct resolved from flags, environment, a TOML file
//! and defaults, in that order of precedence. The pool's tunables live in the file's `[pool]`
//! tables; durations are given in milliseconds (`*_ms`) so tests can shrink them.

use crate::cli::ServeArgs;
use anyhow::{Context, bail};
use proxypool::{PoolConfig, RedisOptions, Strategy};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub upstreams: PathBuf,
    pub proxy_listen: SocketAddr,
    pub api_listen: SocketAddr,
    pub auth_file: Option<PathBuf>,
    /// How often the upstream file's modification time is checked.
    pub upstreams_poll: Duration,
    pub gateway: GatewaySettings,
    pub pool: PoolConfig,
    /// Control URLs the active prober fetches through each upstream (majority rule); empty:
    /// probes are plain TCP connects to the upstream.
    pub probe_urls: Vec<url::Url>,
    /// Shared state: the pool lives in Redis, one pool for every server naming it.
    pub redis: Option<RedisOptions>,
    /// What one API client may hold or send: the gateway's limits (a count of its own)
    /// with the API's body size (`--api-max-body-bytes`).
    pub api_limits: service_edge::HttpLimits,
}

/// Largest API request body by default; API requests are a few hundred bytes.
pub const DEFAULT_API_MAX_BODY_BYTES: usize = 16 * 1024;

/// How the gateway talks to upstreams and judges answers.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// Reaching the upstream and opening the tunnel through it.
    pub connect_timeout: Duration,
    /// From sending a plain HTTP request to its response head.
    pub response_timeout: Duration,
    /// Byte strings that mark a plain HTTP response body as a captcha page.
    pub captcha_markers: Vec<String>,
    /// Only this many leading body bytes are searched for captcha markers.
    pub captcha_scan_bytes: usize,
    /// Used for a 429 without a usable `Retry-After`.
    pub default_retry_after: Duration,
    /// What one gateway client may hold or send.
    pub client_limits: service_edge::HttpLimits,
}

/// The TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    upstreams: Option<PathBuf>,
    proxy_listen: Option<SocketAddr>,
    api_listen: Option<SocketAddr>,
    auth_file: Option<PathBuf>,
    upstreams_poll_ms: Option<u64>,
    probe_urls: Option<Vec<String>>,
    redis: Option<String>,
    redis_pool: Option<String>,
    api_max_body_bytes: Option<usize>,
    #[serde(default)]
    gateway: GatewayFile,
    #[serde(default)]
    pool: PoolFile,
    /// What one gateway client may hold or send (`[http]`).
    #[serde(default)]
    http: service_edge::HttpLimitsFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    connect_timeout_ms: Option<u64>,
    response_timeout_ms: Option<u64>,
    captcha_markers: Option<Vec<String>>,
    captcha_scan_bytes: Option<usize>,
    default_retry_after_ms: Option<u64>,
}

/// `[pool]`: the library's `PoolConfig`, every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    strategy: Option<Strategy>,
    sticky_ttl_ms: Option<u64>,
    lease_ttl_ms: Option<u64>,
    max_leases_per_address: Option<u32>,
    min_in_service: Option<u32>,
    quarantine_cap: Option<f64>,
    ring_vnodes: Option<u32>,
    load_factor: Option<f64>,
    decision_log_len: Option<usize>,
    #[serde(default)]
    health: HealthFile,
    #[serde(default)]
    backoff: BackoffFile,
    #[serde(default)]
    judgement: JudgementFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    window: Option<usize>,
    recent: Option<usize>,
    recent_failures: Option<usize>,
    min_success_rate: Option<f64>,
    min_samples: Option<usize>,
    max_captcha_rate: Option<f64>,
    latency_factor: Option<f64>,
    rise_successes: Option<u32>,
    min_dwell_ms: Option<u64>,
    degraded_weight: Option<f64>,
    probing_weight: Option<f64>,
    ramp_steps: Option<Vec<f64>>,
    ramp_duration_ms: Option<u64>,
    dead_after_cycles: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffFile {
    base_ms: Option<u64>,
    cap_ms: Option<u64>,
    jitter: Option<f64>,
    reset_after_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JudgementFile {
    site_window: Option<usize>,
    site_recent: Option<usize>,
    site_min_samples: Option<usize>,
    site_min_addresses: Option<usize>,
    site_spread: Option<f64>,
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

fn set_ms(field: &mut Duration, value: Option<u64>) {
    if let Some(ms) = value {
        *field = Duration::from_millis(ms);
    }
}

impl PoolFile {
    /// The library's defaults with the file's values laid over them.
    fn apply(self) -> PoolConfig {
        let mut c = PoolConfig::default();
        set(&mut c.strategy, self.strategy);
        set_ms(&mut c.sticky_ttl, self.sticky_ttl_ms);
        set_ms(&mut c.lease_ttl, self.lease_ttl_ms);
        set(&mut c.max_leases_per_address, self.max_leases_per_address);
        set(&mut c.min_in_service, self.min_in_service);
        set(&mut c.quarantine_cap, self.quarantine_cap);
        set(&mut c.ring_vnodes, self.ring_vnodes);
        set(&mut c.load_factor, self.load_factor);
        set(&mut c.decision_log_len, self.decision_log_len);
        let (h, f) = (&mut c.health, self.health);
        set(&mut h.window, f.window);
        set(&mut h.recent, f.recent);
        set(&mut h.recent_failures, f.recent_failures);
        set(&mut h.min_success_rate, f.min_success_rate);
        set(&mut h.min_samples, f.min_samples);
        set(&mut h.max_captcha_rate, f.max_captcha_rate);
        set(&mut h.latency_factor, f.latency_factor);
        set(&mut h.rise_successes, f.rise_successes);
        set_ms(&mut h.min_dwell, f.min_dwell_ms);
        set(&mut h.degraded_weight, f.degraded_weight);
        set(&mut h.probing_weight, f.probing_weight);
        set(&mut h.ramp_steps, f.ramp_steps);
        set_ms(&mut h.ramp_duration, f.ramp_duration_ms);
        set(&mut h.dead_after_cycles, f.dead_after_cycles);
        let (b, f) = (&mut c.backoff, self.backoff);
        set_ms(&mut b.base, f.base_ms);
        set_ms(&mut b.cap, f.cap_ms);
        set(&mut b.jitter, f.jitter);
        set_ms(&mut b.reset_after, f.reset_after_ms);
        let (j, f) = (&mut c.judgement, self.judgement);
        set(&mut j.site_window, f.site_window);
        set(&mut j.site_recent, f.site_recent);
        set(&mut j.site_min_samples, f.site_min_samples);
        set(&mut j.site_min_addresses, f.site_min_addresses);
        set(&mut j.site_spread, f.site_spread);
        c
    }
}

/// Markers of the common captcha and challenge pages, used unless the file sets its own.
const DEFAULT_CAPTCHA_MARKERS: [&str; 4] = [
    "g-recaptcha",
    "h-captcha",
    "cf-challenge",
    "/cdn-cgi/challenge-platform/",
];

impl ServeConfig {
    /// Resolves the flags (which already include the environment) over the file and defaults.
    pub fn resolve(args: ServeArgs) -> anyhow::Result<Self> {
        let file = service_edge::read_toml::<FileConfig>(args.config.as_deref())?;
        let redis = match args.redis.or(file.redis) {
            Some(url) => {
                let name = args
                    .redis_pool
                    .or(file.redis_pool)
                    .unwrap_or_else(|| "proxypool".to_owned());
                Some(
                    RedisOptions::from_url(&url, &name)
                        .map_err(|e| anyhow::anyhow!("--redis / --redis-pool: {e}"))?,
                )
            }
            None => None,
        };
        let g = file.gateway;
        let client_limits = args.http.resolve(&file.http)?;
        let api_max_body_bytes = args
            .api_max_body_bytes
            .or(file.api_max_body_bytes)
            .unwrap_or(DEFAULT_API_MAX_BODY_BYTES);
        if api_max_body_bytes == 0 {
            bail!("--api-max-body-bytes must be at least 1");
        }
        let config = Self {
            upstreams: args
                .upstreams
                .or(file.upstreams)
                .context("--upstreams FILE is required (or `upstreams` in the config file)")?,
            proxy_listen: args
                .proxy_listen
                .or(file.proxy_listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8899))),
            api_listen: args
                .api_listen
                .or(file.api_listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8898))),
            auth_file: args.auth_file.or(file.auth_file),
            upstreams_poll: Duration::from_millis(file.upstreams_poll_ms.unwrap_or(2000)),
            gateway: GatewaySettings {
                connect_timeout: Duration::from_millis(g.connect_timeout_ms.unwrap_or(10_000)),
                response_timeout: Duration::from_millis(g.response_timeout_ms.unwrap_or(30_000)),
                captcha_markers: g
                    .captcha_markers
                    .unwrap_or_else(|| DEFAULT_CAPTCHA_MARKERS.map(str::to_owned).to_vec()),
                captcha_scan_bytes: g.captcha_scan_bytes.unwrap_or(64 * 1024),
                default_retry_after: Duration::from_millis(
                    g.default_retry_after_ms.unwrap_or(60_000),
                ),
                client_limits,
            },
            api_limits: service_edge::HttpLimits {
                max_body_bytes: api_max_body_bytes,
                ..client_limits
            },
            pool: file.pool.apply(),
            probe_urls: file
                .probe_urls
                .unwrap_or_default()
                .iter()
                .map(|u| match url::Url::parse(u) {
                    Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {
                        Ok(url)
                    }
                    Ok(_) => bail!("probe_urls: {u:?} must be an http:// or https:// URL"),
                    Err(e) => bail!("probe_urls: {u:?} is not a URL: {e}"),
                })
                .collect::<anyhow::Result<_>>()?,
            redis,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let g = &self.gateway;
        if g.connect_timeout.is_zero() || g.response_timeout.is_zero() {
            bail!("gateway.connect_timeout_ms and gateway.response_timeout_ms must be at least 1");
        }
        if g.captcha_markers.iter().any(String::is_empty) {
            bail!("gateway.captcha_markers must not contain an empty marker");
        }
        if !(Duration::from_millis(50)..=Duration::from_secs(3600)).contains(&self.upstreams_poll) {
            bail!("upstreams_poll_ms must be between 50 and 3600000");
        }
        if self.auth_file.is_none() {
            for (name, addr) in [
                ("--proxy-listen", self.proxy_listen),
                ("--api-listen", self.api_listen),
            ] {
                if !addr.ip().is_loopback() {
                    bail!(
                        "{name} {addr} is not a loopback address: give --auth-file so that the server is not open to anyone"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pool_tables_override_library_defaults() {
        let file: FileConfig = toml::from_str(
            "[pool]\nstrategy = \"round_robin\"\nmin_in_service = 1\n[pool.health]\nmin_dwell_ms = 500\n[pool.backoff]\nbase_ms = 2000\n",
        )
        .unwrap();
        let pool = file.pool.apply();
        assert_eq!(pool.strategy, Strategy::RoundRobin);
        assert_eq!(pool.min_in_service, 1);
        assert_eq!(pool.health.min_dwell, Duration::from_millis(500));
        assert_eq!(pool.backoff.base, Duration::from_secs(2));
        assert_eq!(pool.lease_ttl, PoolConfig::default().lease_ttl);
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<FileConfig>("[pool]\nquarantine_capp = 0.2\n").is_err());
    }

    #[test]
    fn public_listen_without_credentials_is_refused() {
        let args = ServeArgs {
            upstreams: Some("u.txt".into()),
            proxy_listen: Some("0.0.0.0:8899".parse().unwrap()),
            ..ServeArgs::default()
        };
        let err = ServeConfig::resolve(args).unwrap_err().to_string();
        assert!(err.contains("--auth-file"), "{err}");
    }

    #[test]
    fn probe_urls_are_http_or_https() {
        let dir = std::env::temp_dir().join(format!("proxypool-probe-urls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let resolve = |urls: &str| {
            let file = dir.join("c.toml");
            std::fs::write(&file, format!("probe_urls = [{urls}]\n")).unwrap();
            ServeConfig::resolve(ServeArgs {
                config: Some(file),
                upstreams: Some("u.txt".into()),
                ..ServeArgs::default()
            })
        };
        let ok = resolve(r#""http://a.example/p", "https://b.example:8443/generate_204""#);
        assert_eq!(ok.unwrap().probe_urls.len(), 2);
        for bad in [r#""ftp://a.example/""#, r#""https://""#, r#""a.example/p""#] {
            let err = resolve(bad).unwrap_err().to_string();
            assert!(err.contains("probe_urls"), "{bad}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn redis_urls_and_pool_names_are_checked() {
        let resolve = |url: &str, pool: Option<&str>| {
            ServeConfig::resolve(ServeArgs {
                upstreams: Some("u.txt".into()),
                redis: Some(url.into()),
                redis_pool: pool.map(str::to_owned),
                ..ServeArgs::default()
            })
        };
        assert!(
            resolve("redis://127.0.0.1:6379/2", None)
                .unwrap()
                .redis
                .is_some()
        );
        assert!(
            resolve(
                "redis+cluster://127.0.0.1:7001,127.0.0.1:7002",
                Some("scrape")
            )
            .is_ok()
        );
        for bad in [
            "127.0.0.1:6379",
            "http://127.0.0.1",
            "redis+cluster://127.0.0.1",
        ] {
            let err = resolve(bad, None).unwrap_err().to_string();
            assert!(err.contains("expected redis://"), "{bad}: {err}");
        }
        let err = resolve("redis://127.0.0.1", Some("a{b}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--redis-pool"), "{err}");
    }
}
