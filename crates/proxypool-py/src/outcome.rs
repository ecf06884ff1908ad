//! Outcomes by their JSON API names, with the JSON API's defaults. Shared by the Python and
//! the Node bindings (the Node crate includes this file).

use std::time::{Duration, Instant};

use proxypool::Outcome;

/// How long a rate-limiting site asked to wait when the caller does not say.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The outcome `name`: a success's latency (seconds) defaults to the time since `acquired`, a
/// rate limit's wait (seconds) to 60 s; a wait given with any other outcome is refused.
pub(crate) fn parse(
    name: &str,
    latency: Option<f64>,
    retry_after: Option<f64>,
    acquired: Instant,
) -> Result<Outcome, String> {
    let secs = |v: f64, what: &str| {
        Duration::try_from_secs_f64(v).map_err(|_| format!("{what} is seconds >= 0, not {v}"))
    };
    if retry_after.is_some() && name != "rate_limited" {
        return Err("retry_after goes with the outcome \"rate_limited\" only".into());
    }
    Ok(match name {
        "success" => Outcome::Success {
            latency: match latency {
                Some(v) => secs(v, "latency")?,
                None => acquired.elapsed(),
            },
        },
        "connect_error" => Outcome::ConnectError,
        "timeout" => Outcome::Timeout,
        "blocked" => Outcome::Blocked,
        "captcha" => Outcome::Captcha,
        "rate_limited" => Outcome::RateLimited {
            retry_after: match retry_after {
                Some(v) => secs(v, "retry_after")?,
                None => DEFAULT_RETRY_AFTER,
            },
        },
        other => {
            return Err(format!(
                "unknown outcome {other:?}: expected success, connect_error, timeout, blocked, \
                 captcha or rate_limited"
            ));
        }
    })
}
