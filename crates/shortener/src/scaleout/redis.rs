//! One handle on Redis, standalone or Cluster, with short timeouts and a breaker.
//!
//! Redis is a helper in the scale-out mode, never a dependency of a redirect: when it stops
//! answering, the first failure opens the breaker and for [`BREAKER_OPEN`] every caller gets
//! [`Unreachable`] at once instead of waiting for a timeout, then one request tries again.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a request may wait for Redis (connect or answer).
const TIMEOUT: Duration = Duration::from_millis(250);
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

/// A `--redis` value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid --redis {value:?}: {reason}")]
pub(crate) struct BadRedisUrl {
    value: String,
    reason: String,
}

impl RedisTarget {
    pub(crate) fn parse(value: &str) -> Result<Self, BadRedisUrl> {
        let bad = |reason: &str| BadRedisUrl {
            value: value.to_owned(),
            reason: reason.to_owned(),
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
    /// A plain client for the subscriber connection (pub/sub is cluster-wide, so one node of
    /// a cluster is enough).
    subscriber: redis::Client,
    epoch: Instant,
    /// Milliseconds since `epoch` until which the breaker stays open.
    open_until: AtomicU64,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").finish_non_exhaustive()
    }
}

impl Redis {
    /// Connects (failing if no node answers) so that a wrong address is caught at start.
    pub(crate) async fn connect(target: &RedisTarget) -> Result<Self, RedisError> {
        let (connection, subscriber) = match target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let manager = ConnectionManager::new_with_config(client.clone(), config).await?;
                (Connection::Standalone(manager), client)
            }
            RedisTarget::Cluster(nodes) => {
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(TIMEOUT)
                        .response_timeout(TIMEOUT)
                        .retries(1)
                        .build()?;
                let connection = client.get_async_connection().await?;
                (
                    Connection::Cluster(connection),
                    redis::Client::open(nodes[0].as_str())?,
                )
            }
        };
        let redis = Self {
            connection,
            subscriber,
            epoch: Instant::now(),
            open_until: AtomicU64::new(0),
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

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the last attempt reached Redis (the breaker is closed).
    pub(crate) fn is_up(&self) -> bool {
        self.open_until.load(Ordering::Relaxed) <= self.now_ms()
    }

    fn connection(&self) -> Result<Connection, Unreachable> {
        if self.is_up() {
            Ok(self.connection.clone())
        } else {
            Err(Unreachable::BreakerOpen)
        }
    }

    fn judge<T>(&self, result: Result<T, RedisError>) -> Result<T, Unreachable> {
        result.map_err(|e| {
            if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
                let until = self.now_ms().saturating_add(BREAKER_OPEN.as_millis() as u64);
                if self.open_until.swap(until, Ordering::Relaxed) <= self.now_ms() {
                    tracing::warn!(error = %e, "redis unreachable; using local fallbacks for a while");
                }
            }
            Unreachable::Failed(e)
        })
    }

    /// Runs one command.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> Result<T, Unreachable> {
        let mut connection = self.connection()?;
        let result = cmd.query_async(&mut connection).await;
        self.judge(result)
    }

    /// Runs a pipeline (commands on keys of one hash slot when on a Cluster).
    pub(crate) async fn pipeline<T: redis::FromRedisValue>(
        &self,
        pipeline: &Pipeline,
    ) -> Result<T, Unreachable> {
        let mut connection = self.connection()?;
        let result = pipeline.query_async(&mut connection).await;
        self.judge(result)
    }

    /// Runs a Lua script by its digest, loading it first if the server does not know it.
    pub(crate) async fn script<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Unreachable> {
        let mut connection = self.connection()?;
        let result = invocation.invoke_async(&mut connection).await;
        self.judge(result)
    }

    /// Whether Redis answers a `PING` now (the breaker aside: this is the probe).
    pub(crate) async fn ping(&self) -> bool {
        let mut connection = self.connection.clone();
        let result = redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await;
        self.judge(result).is_ok()
    }

    /// A fresh connection for a subscriber.
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        self.subscriber.get_async_pubsub().await
    }
}
