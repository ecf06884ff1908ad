//! The `redis=` URL of a pool: `redis://HOST:PORT[/DB]` (or `rediss://`) for one server,
//! `redis+cluster://HOST:PORT,HOST:PORT,…` for a Redis Cluster (some of its nodes; the client
//! finds the rest). The URL forms of `proxypool serve --redis`. Shared by the Python and the
//! Node bindings (the Node crate includes this file).

use std::time::Duration;

use proxypool::RedisOptions;

/// The Redis options for `url` holding the pool `name`, or why they are refused.
pub(crate) fn options(url: &str, name: &str, timeout: f64) -> Result<RedisOptions, String> {
    // The name becomes the hash tag of the pool's keys (`proxypool:{NAME}:…`).
    if name.is_empty() || name.contains(['{', '}']) || name.contains(char::is_whitespace) {
        return Err(format!(
            "name {name:?}: a pool name is non-empty, without braces or spaces"
        ));
    }
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| format!("redis timeout is seconds > 0, not {timeout}"))?;
    let bad = || {
        format!(
            "redis {url:?}: expected redis://HOST:PORT[/DB], rediss://… or \
             redis+cluster://HOST:PORT,HOST:PORT,…"
        )
    };
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes = nodes
            .split(',')
            .map(|node| {
                let node = node.trim();
                node.rsplit_once(':')
                    .filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                    .map(|_| format!("redis://{node}"))
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(RedisOptions::cluster(nodes, name).timeout(timeout));
    }
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .ok_or_else(bad)?;
    // A host is what comes before the path, after any credentials.
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(bad());
    }
    Ok(RedisOptions::new(url, name).timeout(timeout))
}
