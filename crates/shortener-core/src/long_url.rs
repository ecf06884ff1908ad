//! Rules for destination URLs, and sets of domains (threat feeds, trusted domains).

use std::collections::HashSet;
use url::{Host, Url};

/// Longest accepted destination, before and after normalisation.
pub const MAX_URL_LEN: usize = 2048;

/// Why a destination URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Longer than [`MAX_URL_LEN`].
    #[error("long_url is longer than {MAX_URL_LEN} characters")]
    TooLong,
    /// Not an absolute URL at all.
    #[error("long_url is not a valid absolute URL: {0}")]
    Unparsable(String),
    /// A scheme other than http or https.
    #[error("long_url must use http or https, not {0:?}")]
    Scheme(String),
    /// No host to send anyone to.
    #[error("long_url has no host")]
    NoHost,
    /// `user:password@` in the URL: a phishing favourite.
    #[error("long_url must not contain user information (user:password@)")]
    UserInfo,
    /// Points back at this service: it would redirect in a loop.
    #[error("long_url points at this service itself")]
    OwnHost,
}

/// A set of domains; a domain covers its subdomains too.
///
/// ```
/// use shortener_core::long_url::Blocklist;
/// let list = Blocklist::parse("# spam\nbad.example\n\n");
/// assert!(list.blocks("bad.example"));
/// assert!(list.blocks("www.BAD.example"));
/// assert!(!list.blocks("notbad.example"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blocklist {
    domains: HashSet<String>,
}

impl Blocklist {
    /// Parses a blocklist file: one domain per line, `#` comments and blank lines ignored.
    /// Domains are lowercased and IDN domains are stored in their ASCII (punycode) form.
    pub fn parse(text: &str) -> Self {
        let domains = text
            .lines()
            .map(|line| line.split('#').next().unwrap_or("").trim())
            .filter(|line| !line.is_empty())
            .map(|d| {
                let d = d.trim_end_matches('.');
                idna::domain_to_ascii(d).unwrap_or_else(|_| d.to_ascii_lowercase())
            })
            .collect();
        Self { domains }
    }

    /// A set of domains already in their ASCII form.
    pub fn from_domains(domains: impl IntoIterator<Item = String>) -> Self {
        Self {
            domains: domains.into_iter().collect(),
        }
    }

    /// Number of domains on the list.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `host` or one of its parent domains is on the list.
    pub fn blocks(&self, host: &str) -> bool {
        if self.domains.is_empty() {
            return false;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let mut rest = host.as_str();
        loop {
            if self.domains.contains(rest) {
                return true;
            }
            match rest.split_once('.') {
                Some((_, parent)) => rest = parent,
                None => return false,
            }
        }
    }
}

/// What a destination is checked against besides its own syntax.
#[derive(Debug, Clone, Default)]
pub struct UrlPolicy {
    /// Hosts of this service (lowercase, ASCII); links to them would loop.
    pub own_hosts: Vec<String>,
}

/// Validates a destination and returns its normalised form (lowercase scheme and host,
/// punycode for IDN hosts, percent-encoded path), which is what the redirect sends.
///
/// ```
/// use shortener_core::long_url::{validate_long_url, UrlError, UrlPolicy};
/// let policy = UrlPolicy { own_hosts: vec!["sho.rt".into()], ..Default::default() };
/// assert_eq!(validate_long_url("https://Bücher.example/a b", &policy).unwrap(),
///            "https://xn--bcher-kva.example/a%20b");
/// assert_eq!(validate_long_url("ftp://x.example", &policy), Err(UrlError::Scheme("ftp".into())));
/// assert_eq!(validate_long_url("https://sho.rt/abc", &policy), Err(UrlError::OwnHost));
/// ```
pub fn validate_long_url(input: &str, policy: &UrlPolicy) -> Result<String, UrlError> {
    if input.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let url = Url::parse(input).map_err(|e| UrlError::Unparsable(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme(url.scheme().to_owned()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::UserInfo);
    }
    let host = match url.host() {
        None => return Err(UrlError::NoHost),
        Some(Host::Domain("")) => return Err(UrlError::NoHost),
        Some(Host::Domain(d)) => d.trim_end_matches('.').to_owned(),
        Some(Host::Ipv4(ip)) => ip.to_string(),
        Some(Host::Ipv6(ip)) => ip.to_string(),
    };
    if policy.own_hosts.iter().any(|own| own == &host) {
        return Err(UrlError::OwnHost);
    }
    let normalised = String::from(url);
    if normalised.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    Ok(normalised)
}

/// The comparable form of a host as [`UrlPolicy::own_hosts`] expects it.
///
/// ```
/// use shortener_core::long_url::own_host_of;
/// assert_eq!(own_host_of("https://Sho.RT:8443/x").as_deref(), Some("sho.rt"));
/// assert_eq!(own_host_of("http://[::1]:80").as_deref(), Some("::1"));
/// ```
pub fn own_host_of(base_url: &str) -> Option<String> {
    let url = Url::parse(base_url).ok()?;
    Some(match url.host()? {
        Host::Domain(d) => d.trim_end_matches('.').to_owned(),
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> UrlPolicy {
        UrlPolicy {
            own_hosts: vec!["127.0.0.1".into(), "sho.rt".into()],
        }
    }

    #[test]
    fn accepts_ordinary_urls() {
        let ok = validate_long_url("https://example.com/path?q=1#frag", &policy()).unwrap();
        assert_eq!(ok, "https://example.com/path?q=1#frag");
        assert_eq!(
            validate_long_url("HTTP://EXAMPLE.com", &policy()).unwrap(),
            "http://example.com/"
        );
        assert!(validate_long_url("http://[2001:db8::1]:8080/", &policy()).is_ok());
    }

    #[test]
    fn refuses_each_rule() {
        let p = policy();
        assert_eq!(
            validate_long_url("mailto:a@b.c", &p),
            Err(UrlError::Scheme("mailto".into()))
        );
        assert_eq!(
            validate_long_url("javascript:alert(1)", &p),
            Err(UrlError::Scheme("javascript".into()))
        );
        assert!(matches!(
            validate_long_url("not a url", &p),
            Err(UrlError::Unparsable(_))
        ));
        assert!(matches!(
            validate_long_url("/relative", &p),
            Err(UrlError::Unparsable(_))
        ));
        assert!(matches!(
            validate_long_url("http://", &p),
            Err(UrlError::Unparsable(_))
        ));
        assert_eq!(
            validate_long_url("https://u:p@example.com/", &p),
            Err(UrlError::UserInfo)
        );
        assert_eq!(
            validate_long_url("https://u@example.com/", &p),
            Err(UrlError::UserInfo)
        );
        assert_eq!(
            validate_long_url("http://127.0.0.1:9/x", &p),
            Err(UrlError::OwnHost)
        );
        assert_eq!(
            validate_long_url("http://SHO.RT./x", &p),
            Err(UrlError::OwnHost)
        );
    }

    #[test]
    fn idn_domains_match_punycode_hosts() {
        assert!(Blocklist::parse("bücher.example # idn\n").blocks("www.xn--bcher-kva.example"));
    }

    #[test]
    fn length_is_checked_before_and_after_normalisation() {
        let p = policy();
        let base = "https://example.com/";
        let exact = format!("{base}{}", "a".repeat(MAX_URL_LEN - base.len()));
        assert!(validate_long_url(&exact, &p).is_ok());
        let over = format!("{exact}a");
        assert_eq!(validate_long_url(&over, &p), Err(UrlError::TooLong));
        // Spaces become %20 on normalisation, tripling their length.
        let grows = format!("{base}a{}b", " ".repeat(1000));
        assert_eq!(validate_long_url(&grows, &p), Err(UrlError::TooLong));
    }
}
