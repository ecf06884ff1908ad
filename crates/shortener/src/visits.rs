//! From the raw facts of a person's click to what analytics keeps: the visitor key, the
//! referrer's domain, browser / OS / device class and country.
//!
//! All of it runs in the click fold (`clicks.rs`), never on the redirect path: a redirect only
//! copies the address and two headers ([`Visit`]).

use shortener_core::people::{Dimension, People, UNKNOWN, referrer_name, visitor_hash};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the visitor key in the store's `meta` table.
pub(crate) const KEY_NAME: &str = "visitor_key";
/// Longest User-Agent or Referer copied on the redirect path.
const MAX_HEADER: usize = 512;
/// Parsed User-Agents remembered; real traffic repeats a few hundred.
const MEMO_CAPACITY: usize = 4096;

/// What a redirect saw of a person: raw, unparsed, never stored.
#[derive(Debug)]
pub(crate) struct Visit {
    pub ip: IpAddr,
    pub user_agent: Box<str>,
    pub referer: Option<Box<str>>,
}

impl Visit {
    /// Copies the facts (headers cut at [`MAX_HEADER`] bytes).
    pub(crate) fn new(ip: IpAddr, user_agent: &str, referer: Option<&str>) -> Box<Visit> {
        Box::new(Visit {
            ip,
            user_agent: cut(user_agent).into(),
            referer: referer.map(|r| cut(r).into()),
        })
    }
}

fn cut(text: &str) -> &str {
    if text.len() <= MAX_HEADER {
        return text;
    }
    let mut end = MAX_HEADER;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A `--geoip` file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--geoip {}: {reason}", path.display())]
pub(crate) struct GeoIpError {
    path: PathBuf,
    reason: String,
}

/// Countries of addresses, from a MaxMind-format database (GeoLite2/GeoIP2 Country or City,
/// or any database with `country.iso_code`).
pub(crate) struct GeoIp {
    reader: maxminddb::Reader<Vec<u8>>,
}

impl std::fmt::Debug for GeoIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeoIp")
            .field("database_type", &self.reader.metadata().database_type)
            .finish()
    }
}

impl GeoIp {
    /// Opens and checks the file: one that is not a MaxMind DB is refused here, at start.
    pub(crate) fn open(path: &Path) -> Result<GeoIp, GeoIpError> {
        let failed = |reason: String| GeoIpError {
            path: path.to_owned(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
        let reader = maxminddb::Reader::from_source(bytes)
            .map_err(|e| failed(format!("not a MaxMind DB file ({e})")))?;
        // A file with valid metadata but a broken tree fails the first lookup, not a click.
        reader
            .lookup(IpAddr::from([1, 1, 1, 1]))
            .map_err(|e| failed(format!("unreadable MaxMind DB ({e})")))?;
        Ok(GeoIp { reader })
    }

    /// The ISO 3166-1 code of the address's country, if the database knows it.
    fn country(&self, ip: IpAddr) -> Option<String> {
        let found = self.reader.lookup(ip).ok()?;
        let country = found.decode::<maxminddb::geoip2::Country<'_>>().ok()??;
        country.country.iso_code.map(str::to_owned)
    }
}

/// Browser, OS and device class of a User-Agent.
#[derive(Debug, Clone)]
struct Agent {
    browser: String,
    os: String,
    device: &'static str,
}

fn known(value: &str) -> String {
    if value.is_empty() || value == "UNKNOWN" {
        UNKNOWN.to_owned()
    } else {
        value.to_owned()
    }
}

/// Turns visits into [`People`] entries; owned by the one fold task.
pub(crate) struct VisitFold {
    key: [u8; 16],
    parser: woothee::parser::Parser,
    agents: HashMap<Box<str>, Agent>,
    geoip: Option<Arc<GeoIp>>,
}

impl std::fmt::Debug for VisitFold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisitFold")
            .field("geoip", &self.geoip)
            .finish_non_exhaustive()
    }
}

impl VisitFold {
    /// `key` is the store's visitor key (`meta`, shared by every instance, so one person
    /// counts once whichever instance they reach).
    pub(crate) fn new(key: [u8; 16], geoip: Option<Arc<GeoIp>>) -> Self {
        Self {
            key,
            parser: woothee::parser::Parser::new(),
            agents: HashMap::new(),
            geoip,
        }
    }

    fn agent(&mut self, user_agent: &str) -> Agent {
        if let Some(agent) = self.agents.get(user_agent) {
            return agent.clone();
        }
        let agent = match self.parser.parse(user_agent) {
            Some(r) => Agent {
                browser: known(r.name),
                os: known(r.os),
                device: device_class(r.category, r.os, user_agent),
            },
            None => Agent {
                browser: UNKNOWN.to_owned(),
                os: UNKNOWN.to_owned(),
                device: "other",
            },
        };
        if self.agents.len() >= MEMO_CAPACITY {
            // Bounded: a flood of unique agents costs a parse each.
            self.agents.clear();
        }
        self.agents.insert(user_agent.into(), agent.clone());
        agent
    }

    /// Counts one person's click into `people`.
    pub(crate) fn count(&mut self, people: &mut People, visit: &Visit) {
        let visitor = visitor_hash(&self.key, visit.ip, &visit.user_agent);
        let agent = self.agent(&visit.user_agent);
        let referrer = referrer_name(visit.referer.as_deref());
        let country = self
            .geoip
            .as_ref()
            .map(|g| g.country(visit.ip).unwrap_or_else(|| UNKNOWN.to_owned()));
        let mut values = vec![
            (Dimension::Referrers, referrer.as_str()),
            (Dimension::Browsers, agent.browser.as_str()),
            (Dimension::Os, agent.os.as_str()),
            (Dimension::Devices, agent.device),
        ];
        if let Some(country) = &country {
            values.push((Dimension::Countries, country.as_str()));
        }
        people.count(visitor, &values);
    }
}

/// `desktop`, `mobile`, `tablet` or `other`, from woothee's category (it files tablets under
/// smartphones: an iPad, or an Android device that does not say `Mobile`).
fn device_class(category: &str, os: &str, user_agent: &str) -> &'static str {
    match category {
        "pc" => "desktop",
        "smartphone" if os == "iPad" || (os == "Android" && !user_agent.contains("Mobile")) => {
            "tablet"
        }
        "smartphone" | "mobilephone" => "mobile",
        _ => "other",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use shortener_core::people::Dimension;

    const AGENTS: [(&str, &str, &str, &str); 5] = [
        (
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36",
            "Chrome",
            "Windows 10",
            "desktop",
        ),
        (
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Safari",
            "iPhone",
            "mobile",
        ),
        (
            "Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Safari",
            "iPad",
            "tablet",
        ),
        (
            "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0",
            "Firefox",
            "Linux",
            "desktop",
        ),
        ("SomethingNew/1.0", "unknown", "unknown", "other"),
    ];

    #[test]
    fn agents_are_classified_and_referrers_reduced_to_domains() {
        let mut fold = VisitFold::new([3; 16], None);
        let mut people = People::default();
        for (i, (ua, ..)) in AGENTS.iter().enumerate() {
            let referer = (i % 2 == 0).then_some("https://www.news.example/story/1");
            fold.count(
                &mut people,
                &Visit::new(IpAddr::from([192, 0, 2, i as u8]), ua, referer),
            );
        }
        for (ua, browser, os, device) in AGENTS {
            let agent = fold.agent(ua);
            assert_eq!(
                (agent.browser.as_str(), agent.os.as_str(), agent.device),
                (browser, os, device),
                "{ua}"
            );
        }
        assert_eq!(people.visitors.estimate(), 5);
        assert_eq!(
            people.top(Dimension::Referrers).ranked(),
            vec![("news.example".to_owned(), 3), ("direct".to_owned(), 2)]
        );
        // No database: no countries at all.
        assert!(people.top(Dimension::Countries).is_empty());
    }

    #[test]
    fn long_headers_are_cut_on_a_character_boundary() {
        let long = "é".repeat(400);
        let visit = Visit::new(IpAddr::from([192, 0, 2, 1]), &long, Some(&long));
        assert!(visit.user_agent.len() <= MAX_HEADER);
        assert!(visit.referer.as_deref().unwrap().len() <= MAX_HEADER);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.mmdb");
        std::fs::write(&path, b"just some text, no metadata marker").unwrap();
        let message = GeoIp::open(&path).unwrap_err().to_string();
        assert!(message.starts_with("--geoip "), "{message}");
        assert!(message.contains("not a MaxMind DB"), "{message}");
        assert!(!message.contains('\n'));
        assert!(GeoIp::open(&dir.path().join("missing.mmdb")).is_err());
    }
}
