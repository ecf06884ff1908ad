//! Threat feeds: lists of known phishing and malware destinations in the formats public
//! feeds ship offline, and the one trait every matcher implements.
//!
//! A feed file holds, one per line: a domain (`bad.example`), a hosts-file line
//! (`0.0.0.0 bad.example`), or a URL (`http://bad.example/login.php`, URLhaus / OpenPhish
//! style); `#` starts a comment line. Domain entries match the host and every parent domain
//! of a destination; URL entries match the normalised destination exactly. Lookups are hash
//! lookups: one per URL entry set and one per label of the host, whatever the feed's size.

use crate::long_url::Blocklist;
use std::collections::HashSet;
use url::Url;

/// Decides whether a destination is known to be malicious. A feed file is one; a
/// hash-prefix list client (Safe Browsing v4 style) can be another.
pub trait ThreatMatcher: Send + Sync + std::fmt::Debug {
    /// The name of the list that holds `url` (already normalised), if any.
    fn find(&self, url: &Url) -> Option<&str>;
}

/// A line of a feed file that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// 1-based.
    pub line: usize,
    /// What was wrong with it.
    pub reason: &'static str,
}

/// One feed file, parsed.
#[derive(Debug, Clone, Default)]
pub struct Feed {
    name: String,
    domains: Blocklist,
    urls: HashSet<String>,
}

/// Hosts-file addresses that mean "block", and names hosts files list for themselves.
const HOSTS_ADDRESSES: [&str; 4] = ["0.0.0.0", "127.0.0.1", "::", "::1"];
const HOSTS_SELF: [&str; 4] = ["localhost", "localhost.localdomain", "local", "0.0.0.0"];

fn domain(text: &str) -> Option<String> {
    let text = text.trim_end_matches('.');
    let ascii = idna::domain_to_ascii(text).ok()?;
    let valid = !ascii.is_empty()
        && ascii.contains('.')
        && ascii
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    valid.then_some(ascii)
}

impl Feed {
    /// Parses a feed file. Lines that are none of the formats are skipped and returned with
    /// their line numbers; they never fail the feed.
    ///
    /// ```
    /// use shortener_core::threat::{Feed, ThreatMatcher};
    /// let text = "# a feed\nbad.example\n0.0.0.0 ads.example\nhttp://ok.example/phish.php\n%%%\n";
    /// let (feed, skipped) = Feed::parse("urlhaus.txt", text);
    /// assert_eq!((feed.len(), skipped.len(), skipped[0].line), (3, 1, 5));
    /// let url = |u: &str| url::Url::parse(u).unwrap();
    /// assert_eq!(feed.find(&url("https://www.bad.example/x")), Some("urlhaus.txt"));
    /// assert_eq!(feed.find(&url("http://OK.example/phish.php")), Some("urlhaus.txt"));
    /// assert_eq!(feed.find(&url("http://ok.example/fine")), None);
    /// ```
    pub fn parse(name: &str, text: &str) -> (Self, Vec<SkippedLine>) {
        let mut domains = Vec::new();
        let mut urls = HashSet::new();
        let mut skipped = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let skip = |reason| SkippedLine {
                line: index + 1,
                reason,
            };
            if line.contains("://") {
                match Url::parse(line) {
                    Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                        urls.insert(String::from(url));
                    }
                    _ => skipped.push(skip("not a valid http(s) URL")),
                }
                continue;
            }
            // Domains and hosts-file lines may carry a trailing comment.
            let entry = line.split('#').next().unwrap_or("").trim();
            let fields: Vec<&str> = entry.split_whitespace().collect();
            let name = match fields.as_slice() {
                [one] => *one,
                [address, name] if HOSTS_ADDRESSES.contains(address) => {
                    if HOSTS_SELF.contains(name) {
                        continue;
                    }
                    *name
                }
                _ => {
                    skipped.push(skip("not a domain, a hosts-file line or a URL"));
                    continue;
                }
            };
            match domain(name) {
                Some(d) => domains.push(d),
                None => skipped.push(skip("not a valid domain")),
            }
        }
        let feed = Self {
            name: name.to_owned(),
            domains: Blocklist::from_domains(domains),
            urls,
        };
        (feed, skipped)
    }

    /// The feed's name (its file name), shown in refusals and disable reasons.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Entries: domains plus URLs.
    pub fn len(&self) -> usize {
        self.domains.len() + self.urls.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ThreatMatcher for Feed {
    fn find(&self, url: &Url) -> Option<&str> {
        let by_url = !self.urls.is_empty() && self.urls.contains(url.as_str());
        let by_host = url.host_str().is_some_and(|h| {
            let h = h
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(h);
            self.domains.blocks(h)
        });
        (by_url || by_host).then_some(self.name.as_str())
    }
}

/// Every loaded feed; the first that matches names the refusal.
#[derive(Debug, Clone, Default)]
pub struct Feeds(pub Vec<Feed>);

impl Feeds {
    /// Entries over every feed.
    pub fn len(&self) -> usize {
        self.0.iter().map(Feed::len).sum()
    }

    /// Whether no feed has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ThreatMatcher for Feeds {
    fn find(&self, url: &Url) -> Option<&str> {
        self.0.iter().find_map(|feed| feed.find(url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_of_public_feeds_parse_and_garbage_is_reported_by_line() {
        let text = "\
# hosts file
127.0.0.1 localhost
0.0.0.0 tracker.example # ads
::1 ip6.example
bücher.example
https://phish.example/login?x=1
ftp://files.example/x
http://
too many fields here
not_a_domain
";
        let (feed, skipped) = Feed::parse("mixed", text);
        let lines: Vec<usize> = skipped.iter().map(|s| s.line).collect();
        assert_eq!(lines, [7, 8, 9, 10]);
        assert_eq!(feed.len(), 4);
        let url = |u: &str| Url::parse(u).unwrap();
        assert!(feed.find(&url("http://a.tracker.example/")).is_some());
        assert!(feed.find(&url("http://xn--bcher-kva.example/")).is_some());
        assert!(feed.find(&url("HTTPS://PHISH.example/login?x=1")).is_some());
        assert!(feed.find(&url("https://phish.example/login?x=2")).is_none());
        assert!(feed.find(&url("http://localhost/")).is_none());
    }

    #[test]
    fn the_first_matching_feed_names_the_match() {
        let feeds = Feeds(vec![
            Feed::parse("one", "a.example\n").0,
            Feed::parse("two", "a.example\nb.example\n").0,
        ]);
        let url = |u: &str| Url::parse(u).unwrap();
        assert_eq!(feeds.find(&url("http://a.example/")), Some("one"));
        assert_eq!(feeds.find(&url("http://x.b.example/")), Some("two"));
        assert_eq!(feeds.find(&url("http://c.example/")), None);
        assert_eq!(feeds.len(), 3);
    }
}
