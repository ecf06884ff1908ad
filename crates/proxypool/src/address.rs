//! The identity of a proxy address: its full URL, scheme and credentials included.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use thiserror::Error;
use url::Url;

/// Schemes the pool accepts; the gateway that will use the addresses speaks these.
const SCHEMES: [&str; 4] = ["http", "https", "socks5", "socks5h"];

/// Why a string is not a usable proxy address.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddressError {
    /// Not a URL at all.
    #[error("not a proxy URL: {0}")]
    Malformed(String),
    /// A scheme other than http, https, socks5 or socks5h.
    #[error("unsupported proxy scheme {0:?} (expected http, https, socks5 or socks5h)")]
    Scheme(String),
    /// No host, or a path, query or fragment that would make two spellings of one proxy differ.
    #[error("a proxy URL is scheme://[user[:password]@]host[:port] and nothing more: {0}")]
    Shape(String),
    /// A host that is neither an IP address nor a DNS name (letters, digits, `-`, `_`, dots).
    #[error("not an IP address or a DNS name: {0:?}")]
    Host(String),
}

/// Whether a host the URL parser accepted can name a machine: an IP literal, or a DNS name of
/// non-empty labels. The parser keeps characters such as `*` that no resolver would take, and
/// hosts of the non-special `socks5` schemes are opaque to it.
fn is_machine_name(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Ipv4(_) | url::Host::Ipv6(_) => true,
        url::Host::Domain(name) => {
            let name = name.strip_suffix('.').unwrap_or(name);
            !name.is_empty()
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
        }
    }
}

/// One outbound proxy, identified by its full URL (`http://user:pass@host:port`,
/// `socks5://host:port`).
///
/// Two addresses are the same address exactly when their normalised URLs are equal, so one host
/// reached with two sets of credentials is two addresses. [`fmt::Display`] and [`fmt::Debug`]
/// hide the password: logs, metrics and snapshots never carry it; [`ProxyAddress::as_str`] does.
#[derive(Clone)]
pub struct ProxyAddress(Arc<Spellings>);

/// Behind one `Arc`: every lease carries an address, so a clone is one reference count.
struct Spellings {
    full: Box<str>,
    redacted: Box<str>,
}

impl ProxyAddress {
    /// Parses and normalises (lower-case scheme and host, default port dropped) a proxy URL.
    ///
    /// ```
    /// use proxypool::ProxyAddress;
    /// let a = ProxyAddress::parse("HTTP://bob:secret@Proxy.example:8080").unwrap();
    /// assert_eq!(a.as_str(), "http://bob:secret@proxy.example:8080");
    /// assert_eq!(a.to_string(), "http://bob:***@proxy.example:8080");
    /// assert!(ProxyAddress::parse("ftp://proxy.example:21").is_err());
    /// ```
    pub fn parse(input: &str) -> Result<Self, AddressError> {
        let url = Url::parse(input.trim()).map_err(|_| AddressError::Malformed(input.into()))?;
        if !SCHEMES.contains(&url.scheme()) {
            return Err(AddressError::Scheme(url.scheme().into()));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| AddressError::Shape(input.into()))?;
        if !url.host().is_some_and(|h| is_machine_name(&h)) {
            return Err(AddressError::Host(host.into()));
        }
        let bare_path = matches!(url.path(), "" | "/");
        if !bare_path || url.query().is_some() || url.fragment().is_some() {
            return Err(AddressError::Shape(input.into()));
        }
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        let (user, password) = (url.username(), url.password());
        let (full, redacted) = match (user.is_empty(), password) {
            (true, None) => {
                let s = format!("{}://{host}{port}", url.scheme());
                (s.clone(), s)
            }
            (_, None) => {
                let s = format!("{}://{user}@{host}{port}", url.scheme());
                (s.clone(), s)
            }
            (_, Some(pass)) => (
                format!("{}://{user}:{pass}@{host}{port}", url.scheme()),
                format!("{}://{user}:***@{host}{port}", url.scheme()),
            ),
        };
        Ok(Self(Arc::new(Spellings {
            full: full.into(),
            redacted: redacted.into(),
        })))
    }

    /// The full URL, credentials included: what a client needs to connect.
    pub fn as_str(&self) -> &str {
        &self.0.full
    }

    /// Reads the word a clone writes (the reference count), so that a caller can load its
    /// cache line ahead of the clone (see `AddressRecord::prefetch`).
    pub(crate) fn prefetch(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Starts loading the line a clone writes (see `hint`), without waiting for it. The hint
    /// names the shared spellings; the reference count sits just before them, on the same
    /// line unless they start one.
    pub(crate) fn prefetch_shared(&self) {
        crate::hint::prefetch(&*self.0);
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.0.redacted
    }
}

impl PartialEq for ProxyAddress {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.full == other.0.full
    }
}

impl Eq for ProxyAddress {}

impl Hash for ProxyAddress {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.full.hash(state);
    }
}

impl fmt::Display for ProxyAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.redacted)
    }
}

impl fmt::Debug for ProxyAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ProxyAddress")
            .field(&&*self.0.redacted)
            .finish()
    }
}

impl std::str::FromStr for ProxyAddress {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_includes_scheme_and_credentials() {
        let a = ProxyAddress::parse("http://u:p@h:1").unwrap();
        let b = ProxyAddress::parse("http://u:q@h:1").unwrap();
        let c = ProxyAddress::parse("socks5://u:p@h:1").unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.redacted(), b.redacted());
        assert_eq!(a, ProxyAddress::parse("http://u:p@H:1/").unwrap());
    }

    #[test]
    fn rejects_paths_and_queries() {
        assert!(ProxyAddress::parse("http://h:1/x").is_err());
        assert!(ProxyAddress::parse("http://h:1?x=1").is_err());
        assert!(ProxyAddress::parse("h:1").is_err());
        assert_eq!(
            ProxyAddress::parse("socks5h://h:1080").unwrap().as_str(),
            "socks5h://h:1080"
        );
    }

    #[test]
    fn rejects_hosts_no_resolver_takes() {
        for bad in [
            "http://1.2.3.4*:80",
            "socks5://a*b:1080",
            "http://a..b:1",
            "socks5h://%41:1",
        ] {
            assert!(
                matches!(ProxyAddress::parse(bad), Err(AddressError::Host(_))),
                "{bad}"
            );
        }
        for good in [
            "http://[::1]:8080",
            "socks5://proxy_1.example:1080",
            "http://127.0.0.1:3128",
        ] {
            assert!(ProxyAddress::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let a = ProxyAddress::parse("http://u:secret@h:1").unwrap();
        assert!(!format!("{a:?}").contains("secret"));
    }
}
