//! The `redis=` URL of a pool: `redis://HOST:PORT[/DB]` (or `rediss://`) for one server,
//! `redis+cluster://HOST:PORT,HOST:PORT,…` for a Redis Cluster (some of its nodes; the client
//! finds the rest). The URL forms of `proxypool serve --redis`. Shared by the Python and the
//! Node bindings (the Node crate includes this file).

use std::num::NonZeroUsize;
use std::time::Duration;

use proxypool::RedisOptions;

/// Batched Redis calls out at once: a binding's calls come from its event loop's thread in
/// bursts, and at the library's default of 2 the server idled a third of the time (the Python
/// bench, 50 asyncio tasks: 0.57 × the Rust caller's pairs at 2, 0.62 at 4, 0.58 at 8).
const BATCHES_IN_FLIGHT: NonZeroUsize = NonZeroUsize::MIN.saturating_add(3);

/// The Redis options for `url` holding the pool `name`, or why they are refused.
pub(crate) fn options(url: &str, name: &str, timeout: f64) -> Result<RedisOptions, String> {
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| format!("redis timeout is seconds > 0, not {timeout}"))?;
    RedisOptions::from_url(url, name)
        .map(|options| {
            options
                .timeout(timeout)
                .batches_in_flight(BATCHES_IN_FLIGHT)
        })
        .map_err(|e| e.to_string())
}
