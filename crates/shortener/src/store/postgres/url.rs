//! `--database` URLs: parsed, refused with a reason, shown without the password.

use super::errors::describe;
use std::fmt;
use std::str::FromStr;
use tokio_postgres::{Config, config::Host};

/// A parsed `postgres://` URL. Shown without its password.
#[derive(Clone)]
pub struct DatabaseUrl {
    // Boxed: the parsed config is large and the URL travels inside small enums.
    pub(super) config: Box<Config>,
}

/// Why a `--database` value was refused.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    /// Not a `postgres://` or `postgresql://` URL.
    #[error(
        "database must be a postgres:// or postgresql:// URL (leave it unset for the embedded store)"
    )]
    Scheme,
    /// tokio-postgres could not parse it.
    #[error("database URL is invalid: {0}")]
    Invalid(String),
    /// `sslmode=require` or stronger: this build speaks plain TCP only.
    #[error("database URL asks for TLS (sslmode=require), which this build does not support")]
    TlsRequired,
}

impl FromStr for DatabaseUrl {
    type Err = DatabaseUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(DatabaseUrlError::Scheme);
        }
        // The parser's messages never quote the URL, so no password reaches a log.
        let config = Config::from_str(url).map_err(|e| DatabaseUrlError::Invalid(describe(&e)))?;
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(DatabaseUrlError::TlsRequired);
        }
        Ok(Self {
            config: Box::new(config),
        })
    }
}

impl fmt::Display for DatabaseUrl {
    /// `user@host:port/dbname`, never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = self.config.get_user() {
            write!(f, "{user}@")?;
        }
        let hosts = self.config.get_hosts();
        let ports = self.config.get_ports();
        for (i, host) in hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match host {
                Host::Tcp(name) => f.write_str(name)?,
                Host::Unix(path) => write!(f, "{}", path.display())?,
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                write!(f, ":{port}")?;
            }
        }
        if hosts.is_empty() {
            f.write_str("localhost")?;
        }
        write!(f, "/{}", self.config.get_dbname().unwrap_or(""))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}
