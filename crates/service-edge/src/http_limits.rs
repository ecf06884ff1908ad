//! What one HTTP client may hold or send, for the servers that speak HTTP/1.1 straight from
//! hyper (the shortener, the proxypool gateway): a cap on open connections, on requests per
//! connection, on the request head's size, the time a request head may take to arrive (which
//! is also how long an idle keep-alive connection stays open: hyper starts that one timer
//! whenever it waits for a head), the time a whole request may take (slow bodies), and the
//! size of a body.
//!
//! ```
//! let limits = service_edge::HttpLimits::resolve(&Default::default(), &Default::default(), 1024).unwrap();
//! assert_eq!(limits.max_connections, 10_000);
//! assert_eq!(limits.max_body_bytes, 1024);
//! let gate = limits.gate();
//! let permit = gate.admit().expect("room for one more");
//! drop(permit);
//! ```

use anyhow::bail;
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// hyper's smallest read buffer; a head must fit the buffer.
pub const MIN_HEADER_BYTES: usize = 8192;

// The defaults, written once: `HttpLimits::resolve` falls back to them and the flags' help
// texts (`http_limit_args!`) name them.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: u64 = 1000;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
pub const DEFAULT_HEADER_TIMEOUT_S: u64 = 30;
pub const DEFAULT_REQUEST_TIMEOUT_S: u64 = 60;

/// The limits, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open connections at most; one more is closed at once.
    pub max_connections: usize,
    /// Requests one connection may carry; the last answer says `Connection: close`.
    pub max_requests_per_connection: u64,
    /// Size of a request head (request line and headers); larger answers 431.
    pub max_header_bytes: usize,
    /// Time for a request head to arrive, counted from when the server waits for it: slow
    /// heads (slowloris) and idle keep-alive connections are closed after it.
    pub header_timeout: Duration,
    /// Time for one request, its body included; slower answers 408 and closes.
    pub request_timeout: Duration,
    /// Size of a request body; larger answers 413 (what a body is depends on the server: an
    /// API request's, or a request the gateway forwards).
    pub max_body_bytes: usize,
}

/// Declares a service's HTTP limit flags (`--max-connections` …, flattened into its
/// `serve`), each also read from `PREFIX` + its name in capitals (`SHORTENER_MAX_CONNECTIONS`),
/// with the service's default and meaning of `--max-body-bytes`.
///
/// ```
/// service_edge::http_limit_args!(Flags, "DEMO_", 4096, "Largest request body in bytes");
/// let limits = Flags::default().resolve(&Default::default()).unwrap();
/// assert_eq!(limits.max_body_bytes, 4096);
/// ```
#[macro_export]
macro_rules! http_limit_args {
    ($name:ident, $prefix:literal, $body:literal, $body_help:literal) => {
        /// What one client may hold or send (each flag also an environment variable).
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct $name {
            // Help texts name the defaults from the consts `resolve` falls back to, so
            // `--help` cannot drift from them.
            #[arg(long, env = concat!($prefix, "MAX_CONNECTIONS"), value_name = "N", help = format!(
                "Open client connections at most; more are closed at once [default: {}].",
                $crate::http_limits::DEFAULT_MAX_CONNECTIONS
            ))]
            pub max_connections: Option<usize>,
            #[arg(long, env = concat!($prefix, "MAX_REQUESTS_PER_CONNECTION"), value_name = "N", help = format!(
                "Requests per client connection; the last answer closes it [default: {}].",
                $crate::http_limits::DEFAULT_MAX_REQUESTS_PER_CONNECTION
            ))]
            pub max_requests_per_connection: Option<u64>,
            #[arg(long, env = concat!($prefix, "MAX_HEADER_BYTES"), value_name = "BYTES", help = format!(
                "Largest request head (request line and headers) in bytes, at least {}; larger \
                 answers 431 [default: {}].",
                $crate::http_limits::MIN_HEADER_BYTES,
                $crate::http_limits::DEFAULT_MAX_HEADER_BYTES
            ))]
            pub max_header_bytes: Option<usize>,
            #[arg(long, env = concat!($prefix, "HEADER_TIMEOUT"), value_name = "SECONDS", help = format!(
                "Seconds for a request head to arrive once the server waits for one: slow heads \
                 (slowloris) and idle keep-alive connections are closed after it [default: {}].",
                $crate::http_limits::DEFAULT_HEADER_TIMEOUT_S
            ))]
            pub header_timeout: Option<u64>,
            #[arg(long, env = concat!($prefix, "REQUEST_TIMEOUT"), value_name = "SECONDS", help = format!(
                "Seconds for one request, its body included (slow bodies); slower answers 408 and \
                 closes the connection [default: {}].",
                $crate::http_limits::DEFAULT_REQUEST_TIMEOUT_S
            ))]
            pub request_timeout: Option<u64>,
            #[arg(
                long,
                env = concat!($prefix, "MAX_BODY_BYTES"),
                value_name = "BYTES",
                help = concat!($body_help, "; larger answers 413 and closes the connection [default: ", stringify!($body), "].")
            )]
            pub max_body_bytes: Option<usize>,
        }

        impl $name {
            /// These flags over the `[http]` table of the config file over the defaults.
            pub fn resolve(
                &self,
                file: &$crate::HttpLimitsFile,
            ) -> anyhow::Result<$crate::HttpLimits> {
                let flags = $crate::HttpLimitsFile {
                    max_connections: self.max_connections,
                    max_requests_per_connection: self.max_requests_per_connection,
                    max_header_bytes: self.max_header_bytes,
                    header_timeout: self.header_timeout,
                    request_timeout: self.request_timeout,
                    max_body_bytes: self.max_body_bytes,
                };
                $crate::HttpLimits::resolve(&flags, file, $body)
            }
        }
    };
}

/// The `[http]` table of a config file: the same settings, same names (also what the flags
/// resolve through).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpLimitsFile {
    pub max_connections: Option<usize>,
    pub max_requests_per_connection: Option<u64>,
    pub max_header_bytes: Option<usize>,
    pub header_timeout: Option<u64>,
    pub request_timeout: Option<u64>,
    pub max_body_bytes: Option<usize>,
}

impl HttpLimits {
    /// Flags over the file over the defaults (the body's default is the server's), checked.
    pub fn resolve(
        args: &HttpLimitsFile,
        file: &HttpLimitsFile,
        default_max_body_bytes: usize,
    ) -> anyhow::Result<Self> {
        let limits = Self {
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
            max_requests_per_connection: args
                .max_requests_per_connection
                .or(file.max_requests_per_connection)
                .unwrap_or(DEFAULT_MAX_REQUESTS_PER_CONNECTION),
            max_header_bytes: args
                .max_header_bytes
                .or(file.max_header_bytes)
                .unwrap_or(DEFAULT_MAX_HEADER_BYTES),
            header_timeout: Duration::from_secs(
                args.header_timeout
                    .or(file.header_timeout)
                    .unwrap_or(DEFAULT_HEADER_TIMEOUT_S),
            ),
            request_timeout: Duration::from_secs(
                args.request_timeout
                    .or(file.request_timeout)
                    .unwrap_or(DEFAULT_REQUEST_TIMEOUT_S),
            ),
            max_body_bytes: args
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(default_max_body_bytes),
        };
        if limits.max_connections == 0 || limits.max_requests_per_connection == 0 {
            bail!("--max-connections and --max-requests-per-connection must be at least 1");
        }
        if limits.max_header_bytes < MIN_HEADER_BYTES {
            bail!("--max-header-bytes must be at least {MIN_HEADER_BYTES}");
        }
        if limits.header_timeout.is_zero() || limits.request_timeout.is_zero() {
            bail!("--header-timeout and --request-timeout must be at least 1 second");
        }
        if limits.max_body_bytes == 0 {
            bail!("--max-body-bytes must be at least 1");
        }
        Ok(limits)
    }

    /// An HTTP/1.1 connection builder with the head limits and hyper's head timer.
    pub fn http1(&self) -> http1::Builder {
        let mut builder = self.http1_untimed();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        builder
    }

    /// The head limits without hyper's head timer, for a server that times heads itself
    /// ([`crate::serve_connections`]). Answers are written from one buffer (a body is copied
    /// behind its head) rather than as a list of buffers: most answers these servers send are
    /// short, and the list's bookkeeping cost a short answer more than the copy; a long one
    /// (a snapshot, an export) is copied too, once, which costs little beside producing it.
    pub(crate) fn http1_untimed(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .header_read_timeout(None)
            .max_buf_size(self.max_header_bytes)
            .writev(false);
        builder
    }

    /// The cap on open connections, shared by every accept.
    pub fn gate(&self) -> ConnectionGate {
        ConnectionGate(Arc::new(Semaphore::new(self.max_connections)))
    }

    /// A counter for one new connection.
    pub fn requests(&self) -> Arc<RequestBudget> {
        Arc::new(RequestBudget {
            left: AtomicU64::new(self.max_requests_per_connection),
        })
    }
}

/// Room for open connections; each admitted one holds a permit until it closes.
#[derive(Debug, Clone)]
pub struct ConnectionGate(Arc<Semaphore>);

impl ConnectionGate {
    /// A permit for one more connection, or `None` at the cap (close it).
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// Requests one connection may still carry.
#[derive(Debug)]
pub struct RequestBudget {
    left: AtomicU64,
}

impl RequestBudget {
    /// Counts a request; `true` when it is the connection's last (answer it with
    /// `Connection: close`, which makes hyper close after the answer). An HTTP/1.1 connection
    /// answers one request at a time, so no two counts race: a load and a store, not the
    /// compare-and-swap loop every request paid for.
    pub fn take_is_last(&self) -> bool {
        let before = self.left.load(Ordering::Relaxed);
        self.left.store(before.saturating_sub(1), Ordering::Relaxed);
        before <= 1
    }
}

/// Marks an answer as the connection's last.
pub fn close_after<B>(response: &mut hyper::Response<B>) {
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_bad_values_are_refused() {
        let file = HttpLimitsFile {
            max_connections: Some(5),
            header_timeout: Some(7),
            ..Default::default()
        };
        let args = HttpLimitsFile {
            max_connections: Some(3),
            ..Default::default()
        };
        let limits = HttpLimits::resolve(&args, &file, 99).unwrap();
        assert_eq!(limits.max_connections, 3);
        assert_eq!(limits.header_timeout, Duration::from_secs(7));
        assert_eq!(limits.max_body_bytes, 99);
        for bad in [
            HttpLimitsFile {
                max_connections: Some(0),
                ..Default::default()
            },
            HttpLimitsFile {
                max_header_bytes: Some(100),
                ..Default::default()
            },
            HttpLimitsFile {
                request_timeout: Some(0),
                ..Default::default()
            },
            HttpLimitsFile {
                max_body_bytes: Some(0),
                ..Default::default()
            },
        ] {
            assert!(HttpLimits::resolve(&bad, &HttpLimitsFile::default(), 99).is_err());
        }
    }

    #[test]
    fn the_budget_marks_the_last_request_and_the_gate_its_cap() {
        let limits = HttpLimits::resolve(
            &HttpLimitsFile {
                max_requests_per_connection: Some(2),
                max_connections: Some(1),
                ..Default::default()
            },
            &HttpLimitsFile::default(),
            1,
        )
        .unwrap();
        let budget = limits.requests();
        assert!(!budget.take_is_last());
        assert!(budget.take_is_last());
        assert!(budget.take_is_last());
        let gate = limits.gate();
        let first = gate.admit().unwrap();
        assert!(gate.admit().is_none());
        drop(first);
        assert!(gate.admit().is_some());
    }
}
