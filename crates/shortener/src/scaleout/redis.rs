//! One handle on Redis, standalone or Cluster, with short timeouts and a breaker.
//!
//! Redis is a helper in the scale-out mode, never a dependency of a redirect: every call is
//! bounded by [`TIMEOUT`] (reconnects included), and when Redis stops answering the first
//! failure opens the breaker (the same [`Breaker`] as the store's): for [`BREAKER_OPEN`] every
//! caller gets [`Unreachable`] at once, then a single caller probes (half-open) while the
//! others keep getting it; the probe's success closes the breaker.

use crate::breaker::{Breaker, Change, Pass, Phase};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use std::time::{Duration, Instant};

/// How long a request may wait for Redis (connect or answer) on the request path.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(250);
/// The same for background work that blocks in Redis on purpose (the click aggregator).
pub(crate) const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long Redis is left alone after a connection-level failure.
const BREAKER_OPEN: Duration = Duration::from_secs(1);

/// Where Redis is, parsed from `--redis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisTarget {
    /// `redis://host:port[/db]`.
    Standalone(String),
    /// `redis+cluster://host:port,host:port` or a comma-separated list of `redis://` nodes.
    Cluster(Vec<String>),
}

impl std::fmt::Display for RedisTarget {
    /// The nodes without credentials, for messages and logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = match self {
            Self::Standalone(url) => vec![url.clone()],
            Self::Cluster(nodes) => nodes.clone(),
        }
        .iter()
        .map(|node| match url::Url::parse(node) {
            Ok(u) => format!(
                "{}:{}",
                u.host_str().unwrap_or("?"),
                u.port().unwrap_or(6379)
            ),
            Err(_) => "?".to_owned(),
        })
        .collect();
        write!(f, "{}", hosts.join(","))
    }
}

/// A `--redis` value that cannot be used (shown without its credentials).
#[derive(Debug, thiserror::Error)]
#[error("invalid --redis {value:?}: {reason}")]
pub(crate) struct BadRedisUrl {
    value: String,
    reason: String,
}

/// `scheme://user:password@host` → `scheme://***@host`, for messages.
fn without_credentials(value: &str) -> String {
    match (value.find("://"), value.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}***{}", &value[..scheme_end + 3], &value[at..])
        }
        _ => value.to_owned(),
    }
}

impl RedisTarget {
    pub(crate) fn parse(value: &str) -> Result<Self, BadRedisUrl> {
        let bad = |reason: &str| BadRedisUrl {
            value: without_credentials(value),
            reason: without_credentials(reason),
        };
        let value = value.trim();
        let nodes: Vec<String> = if let Some(rest) = value.strip_prefix("redis+cluster://") {
            rest.split(',')
                .map(|node| format!("redis://{}", node.trim()))
                .collect()
        } else if value.contains(',') {
            value
                .split(',')
                .map(|node| node.trim().to_owned())
                .collect()
        } else {
            let url = url::Url::parse(value).map_err(|e| bad(&e.to_string()))?;
            if url.scheme() != "redis" {
                return Err(bad(
                    "expected redis://host:port, redis+cluster://host:port,host:port or a comma-separated list of redis:// nodes",
                ));
            }
            redis::Client::open(value).map_err(|e| bad(&e.to_string()))?;
            return Ok(Self::Standalone(value.to_owned()));
        };
        for node in &nodes {
            let url = url::Url::parse(node).map_err(|e| bad(&format!("{node}: {e}")))?;
            if url.scheme() != "redis" || url.host_str().is_none() {
                return Err(bad(&format!("{node} is not a redis://host:port node")));
            }
        }
        if nodes.is_empty() {
            return Err(bad("no cluster nodes"));
        }
        Ok(Self::Cluster(nodes))
    }
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Redis refused or did not answer; the caller falls back to its local path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unreachable {
    #[error("redis is unreachable (breaker open)")]
    BreakerOpen,
    #[error("redis: {0}")]
    Failed(#[from] RedisError),
}

/// The shared Redis handle of one process.
pub(crate) struct Redis {
    connection: Connection,
    timeout: Duration,
    /// Plain clients for subscriber connections, one per node: pub/sub is cluster-wide, so
    /// any node that answers will do.
    subscribers: Vec<redis::Client>,
    /// Opens on the first connection-level failure.
    breaker: Breaker,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").finish_non_exhaustive()
    }
}

impl Redis {
    /// Connects (failing if no node answers) so that a wrong address is caught at start.
    /// `timeout` bounds every call: [`TIMEOUT`] or [`BACKGROUND_TIMEOUT`].
    pub(crate) async fn connect(
        target: &RedisTarget,
        timeout: Duration,
    ) -> Result<Self, RedisError> {
        let (connection, subscribers) = match target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let manager = ConnectionManager::new_with_config(client.clone(), config).await?;
                (Connection::Standalone(manager), vec![client])
            }
            RedisTarget::Cluster(nodes) => {
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(TIMEOUT)
                        .response_timeout(TIMEOUT)
                        .retries(1)
                        .build()?;
                let connection = client.get_async_connection().await?;
                let subscribers = nodes
                    .iter()
                    .map(|node| redis::Client::open(node.as_str()))
                    .collect::<Result<_, _>>()?;
                (Connection::Cluster(connection), subscribers)
            }
        };
        let redis = Self {
            connection,
            timeout,
            subscribers,
            breaker: Breaker::new(1, BREAKER_OPEN),
        };
        redis
            .query::<String>(&redis::cmd("PING"))
            .await
            .map_err(|e| match e {
                Unreachable::Failed(e) => e,
                Unreachable::BreakerOpen => RedisError::from((redis::ErrorKind::Io, "unreachable")),
            })?;
        Ok(redis)
    }

    /// Whether the breaker is closed (the last attempt reached Redis).
    pub(crate) fn is_up(&self) -> bool {
        self.breaker.phase() == Phase::Closed
    }

    /// The connection, if the breaker lets this caller through.
    fn connection(&self) -> Result<(Connection, Pass), Unreachable> {
        let pass = self
            .breaker
            .admit(Instant::now())
            .map_err(|_| Unreachable::BreakerOpen)?;
        Ok((self.connection.clone(), pass))
    }

    /// Bounds `call` by the timeout.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, RedisError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::Io,
                "no answer within the timeout",
            ))),
        }
    }

    /// Bounds `call` by the timeout and feeds the breaker with its outcome.
    async fn run<T>(
        &self,
        pass: Pass,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, Unreachable> {
        let result = self.bounded(call).await;
        let healthy = match &result {
            Ok(_) => true,
            Err(e) => {
                !(e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal())
            }
        };
        match self.breaker.record(pass, healthy, Instant::now()) {
            Change::Opened => {
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "redis unreachable; using local fallbacks for a while");
                }
            }
            Change::Closed => tracing::info!("redis answers again"),
            Change::None => {}
        }
        result.map_err(Unreachable::Failed)
    }

    /// Runs one command.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> Result<T, Unreachable> {
        let (mut connection, pass) = self.connection()?;
        self.run(pass, cmd.query_async(&mut connection)).await
    }

    /// Runs a pipeline (commands on keys of one hash slot when on a Cluster).
    pub(crate) async fn pipeline<T: redis::FromRedisValue>(
        &self,
        pipeline: &Pipeline,
    ) -> Result<T, Unreachable> {
        let (mut connection, pass) = self.connection()?;
        self.run(pass, pipeline.query_async(&mut connection)).await
    }

    /// Runs a Lua script by its digest, loading it first if the server does not know it.
    pub(crate) async fn script<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Unreachable> {
        let (mut connection, pass) = self.connection()?;
        self.run(pass, invocation.invoke_async(&mut connection))
            .await
    }

    /// Whether Redis answers a `PING` now, breaker or not (for `/readyz`).
    pub(crate) async fn ping(&self) -> bool {
        let mut connection = self.connection.clone();
        self.bounded(redis::cmd("PING").query_async::<String>(&mut connection))
            .await
            .is_ok()
    }

    /// A fresh subscriber connection, from the `attempt`-th node on (round robin).
    pub(crate) async fn pubsub(&self, attempt: usize) -> Result<redis::aio::PubSub, RedisError> {
        let client = &self.subscribers[attempt % self.subscribers.len()];
        self.bounded(client.get_async_pubsub()).await
    }
}
