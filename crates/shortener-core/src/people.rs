//! Who clicked, in bounded space: unique visitors (a [`Hll`]) and the top values of each
//! breakdown per (link, day). People only; bots are a total elsewhere.

use crate::hll::{Hll, SketchError};
use siphasher::sip::SipHasher24;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::net::IpAddr;

/// Values kept per (link, day, breakdown); the rest are summed into [`OTHER`].
pub const TOP_N: usize = 20;
/// The bucket of every value outside the top.
pub const OTHER: &str = "other";
/// The referrer of a click that sent none.
pub const DIRECT: &str = "direct";
/// A value that could not be told (no country for the address, an unreadable Referer).
pub const UNKNOWN: &str = "unknown";
/// Longest value kept (a referrer's host name at most, in practice).
const MAX_NAME: usize = 253;
/// A fold keeps this many values per breakdown before trimming to [`TOP_N`]: trimming less
/// often keeps more of what is close to the top.
const FOLD_SLACK: usize = 4 * TOP_N;

/// The breakdowns of the analytics API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// The domain of `Referer`, or [`DIRECT`].
    Referrers,
    /// The browser's name.
    Browsers,
    /// The operating system's name.
    Os,
    /// `desktop`, `mobile`, `tablet` or `other`.
    Devices,
    /// ISO 3166 country code from the operator's database, or [`UNKNOWN`].
    Countries,
}

impl Dimension {
    /// Every breakdown, in the API's order.
    pub const ALL: [Dimension; 5] = [
        Dimension::Referrers,
        Dimension::Browsers,
        Dimension::Os,
        Dimension::Devices,
        Dimension::Countries,
    ];

    /// The API's name of the breakdown.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Referrers => "referrers",
            Dimension::Browsers => "browsers",
            Dimension::Os => "os",
            Dimension::Devices => "devices",
            Dimension::Countries => "countries",
        }
    }

    /// The breakdown of this API name.
    pub fn parse(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// An approximate top-N with exact totals: counts per value plus an `other` bucket. Trimming
/// keeps the largest counts and moves the rest into `other`, so the sum never changes; a
/// value trimmed away that comes back starts again from its new clicks (the approximation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopN {
    counts: BTreeMap<String, u64>,
    other: u64,
}

impl TopN {
    /// Adds `clicks` to `name` (to `other` if the name is [`OTHER`]).
    pub fn add(&mut self, name: &str, clicks: u64) {
        if name == OTHER {
            self.other = self.other.saturating_add(clicks);
            return;
        }
        match self.counts.get_mut(name) {
            Some(n) => *n = n.saturating_add(clicks),
            None => {
                self.counts.insert(name.to_owned(), clicks);
                if self.counts.len() > FOLD_SLACK {
                    self.trim(TOP_N);
                }
            }
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &TopN) {
        for (name, &n) in &other.counts {
            self.add(name, n);
        }
        self.other = self.other.saturating_add(other.other);
    }

    /// Keeps the `keep` largest counts (ties: the smaller name) and sums the rest into other.
    pub fn trim(&mut self, keep: usize) {
        if self.counts.len() <= keep {
            return;
        }
        let mut ranked: Vec<(String, u64)> = std::mem::take(&mut self.counts).into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (rank, (name, n)) in ranked.into_iter().enumerate() {
            if rank < keep {
                self.counts.insert(name, n);
            } else {
                self.other = self.other.saturating_add(n);
            }
        }
    }

    /// The sum of `tops` with every value kept until the end, then trimmed to [`TOP_N`]: a
    /// window's breakdown from its days'.
    pub fn sum_trimmed<'a>(tops: impl IntoIterator<Item = &'a TopN>) -> TopN {
        let mut sum = TopN::default();
        for top in tops {
            for (name, &n) in &top.counts {
                let slot = sum.counts.entry(name.clone()).or_default();
                *slot = slot.saturating_add(n);
            }
            sum.other = sum.other.saturating_add(top.other);
        }
        sum.trim(TOP_N);
        sum
    }

    /// Every click counted, `other` included.
    pub fn total(&self) -> u64 {
        self.counts
            .values()
            .fold(self.other, |sum, &n| sum.saturating_add(n))
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.other == 0
    }

    /// Largest first (ties by name), `other` last when it holds anything.
    pub fn ranked(&self) -> Vec<(String, u64)> {
        let mut ranked: Vec<(String, u64)> =
            self.counts.iter().map(|(k, &v)| (k.clone(), v)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        if self.other > 0 {
            ranked.push((OTHER.to_owned(), self.other));
        }
        ranked
    }
}

/// What is known of the people who clicked one link on one day.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct People {
    /// Distinct visitors (keyed hashes of address and User-Agent).
    pub visitors: Hll,
    tops: [TopN; 5],
}

impl People {
    /// The top values of one breakdown.
    pub fn top(&self, dimension: Dimension) -> &TopN {
        &self.tops[dimension.index()]
    }

    /// Counts one click of `visitor` (see [`visitor_hash`]) with its breakdown values.
    pub fn count(&mut self, visitor: u64, values: &[(Dimension, &str)]) {
        self.visitors.insert(visitor);
        for &(dimension, value) in values {
            self.tops[dimension.index()].add(&clean_name(value), 1);
        }
    }

    /// Adds `other` (sketches merge by register max; counts add).
    pub fn merge(&mut self, other: &People) {
        self.visitors.merge(&other.visitors);
        for (mine, theirs) in self.tops.iter_mut().zip(&other.tops) {
            mine.merge(theirs);
        }
    }

    /// Trims every breakdown to [`TOP_N`] values and `other`: the stored size.
    pub fn trim(&mut self) {
        for top in &mut self.tops {
            top.trim(TOP_N);
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.visitors.is_empty() && self.tops.iter().all(TopN::is_empty)
    }

    /// The breakdowns as text, one `DIMENSION CLICKS [NAME]` line per value (no name: the
    /// `other` bucket). Names hold no line breaks ([`clean_name`]).
    pub fn tops_to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for dimension in Dimension::ALL {
            let top = self.top(dimension);
            for (name, n) in &top.counts {
                let _ = writeln!(out, "{} {n} {name}", dimension.name());
            }
            if top.other > 0 {
                let _ = writeln!(out, "{} {}", dimension.name(), top.other);
            }
        }
        out
    }

    /// Reads a sketch and [`People::tops_to_text`]'s text back.
    pub fn from_parts(visitors: &[u8], tops: &str) -> Result<People, SketchError> {
        let mut people = People {
            visitors: Hll::from_bytes(visitors)?,
            tops: Default::default(),
        };
        for line in tops.lines() {
            let mut parts = line.splitn(3, ' ');
            let dimension = parts
                .next()
                .and_then(Dimension::parse)
                .ok_or(SketchError("unknown breakdown"))?;
            let n: u64 = parts
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or(SketchError("bad count"))?;
            let top = &mut people.tops[dimension.index()];
            match parts.next() {
                Some(name) if !name.is_empty() => {
                    top.counts.insert(name.to_owned(), n);
                }
                _ => top.other = n,
            }
        }
        Ok(people)
    }
}

/// A value fit to store: control characters replaced, at most [`MAX_NAME`] bytes, never empty.
/// Borrowed when it already is (nearly always: a fold calls this for every click).
fn clean_name(value: &str) -> Cow<'_, str> {
    let trimmed = value.trim();
    if !trimmed.is_empty() && trimmed.len() <= MAX_NAME && !trimmed.chars().any(char::is_control) {
        return Cow::Borrowed(trimmed);
    }
    let mut name: String = value
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if name.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    if name.is_empty() {
        Cow::Borrowed(UNKNOWN)
    } else {
        Cow::Owned(name)
    }
}

/// The visitor key: a keyed hash of the client's address and User-Agent. Only sketches of it
/// are stored, never it or what it was made of; without the key (the store's `meta`) it
/// cannot be recomputed from a guess.
pub fn visitor_hash(key: &[u8; 16], ip: IpAddr, user_agent: &str) -> u64 {
    let mut h = SipHasher24::new_with_key(key);
    match ip {
        IpAddr::V4(v4) => h.write(&v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => h.write(&v6.octets()),
    }
    h.write(user_agent.as_bytes());
    h.finish()
}

/// The referrer breakdown's value: the host of `Referer`, lower case without a leading
/// `www.`; [`DIRECT`] when there is none, [`UNKNOWN`] when it names no host.
pub fn referrer_name(referer: Option<&str>) -> String {
    let Some(referer) = referer.map(str::trim).filter(|r| !r.is_empty()) else {
        return DIRECT.to_owned();
    };
    match url::Url::parse(referer)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
    {
        Some(host) => host.strip_prefix("www.").unwrap_or(&host).to_owned(),
        None => UNKNOWN.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn referrers_are_hosts_or_direct() {
        assert_eq!(referrer_name(None), "direct");
        assert_eq!(referrer_name(Some("  ")), "direct");
        assert_eq!(
            referrer_name(Some("https://www.Example.com/a?b")),
            "example.com"
        );
        assert_eq!(referrer_name(Some("android-app://com.slack/")), "com.slack");
        assert_eq!(referrer_name(Some("not a url")), "unknown");
    }

    #[test]
    fn stored_names_are_one_line_bounded_and_never_empty() {
        assert_eq!(clean_name(" Firefox "), "Firefox");
        assert_eq!(clean_name("a\nb\tc"), "a b c");
        assert_eq!(clean_name(""), UNKNOWN);
        assert_eq!(clean_name(&"x".repeat(300)).len(), MAX_NAME);
    }

    #[test]
    fn trimming_keeps_the_top_and_the_total() {
        let mut top = TopN::default();
        for i in 0..30u64 {
            top.add(&format!("site{i:02}"), i + 1);
        }
        top.add(OTHER, 5);
        let total = top.total();
        top.trim(TOP_N);
        assert_eq!(top.total(), total);
        let ranked = top.ranked();
        assert_eq!(ranked.len(), TOP_N + 1);
        assert_eq!(ranked[0], ("site29".to_owned(), 30));
        assert_eq!(ranked[TOP_N - 1], ("site10".to_owned(), 11));
        // site00..site09 (1 + … + 10 = 55) and the 5 went to other.
        assert_eq!(ranked[TOP_N], ("other".to_owned(), 60));
    }

    #[test]
    fn a_window_sums_its_days_before_trimming() {
        // 30 days, each with its own 20 values and the same one at 1 click a day: a value
        // that is small on every day but large over the window makes the window's top.
        let days: Vec<TopN> = (0..30)
            .map(|d| {
                let mut top = TopN::default();
                for v in 0..TOP_N {
                    top.add(&format!("d{d}v{v}"), 2);
                }
                top.add("steady", 1);
                top.trim(TOP_N + 1);
                top
            })
            .collect();
        let window = TopN::sum_trimmed(&days);
        assert_eq!(window.total(), 30 * (2 * TOP_N as u64 + 1));
        assert_eq!(window.ranked()[0], ("steady".to_owned(), 30));
        assert_eq!(window.ranked().len(), TOP_N + 1);
    }

    #[test]
    fn a_fold_of_many_values_stays_bounded_and_exact_in_total() {
        let mut top = TopN::default();
        for i in 0..10_000u64 {
            top.add(&format!("v{}", i % 997), 1);
            top.add("hot", 1);
        }
        assert!(top.counts.len() <= FOLD_SLACK);
        assert_eq!(top.total(), 20_000);
        top.trim(TOP_N);
        assert_eq!(top.ranked()[0], ("hot".to_owned(), 10_000));
    }

    #[test]
    fn people_survive_their_stored_form_and_merge() {
        let key = [7u8; 16];
        let mut a = People::default();
        let ua = "Mozilla/5.0 Firefox/131.0";
        for i in 0..40u8 {
            let ip = IpAddr::from([203, 0, 113, i]);
            a.count(
                visitor_hash(&key, ip, ua),
                &[
                    (Dimension::Referrers, "news.example"),
                    (Dimension::Browsers, "Firefox"),
                    (Dimension::Countries, if i % 2 == 0 { "FR" } else { "" }),
                ],
            );
        }
        a.trim();
        let back = People::from_parts(&a.visitors.to_bytes(), &a.tops_to_text()).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.visitors.estimate(), 40);
        assert_eq!(
            back.top(Dimension::Countries).ranked(),
            vec![("FR".to_owned(), 20), ("unknown".to_owned(), 20)]
        );
        let mut twice = a.clone();
        twice.merge(&a);
        assert_eq!(twice.visitors.estimate(), 40);
        assert_eq!(twice.top(Dimension::Browsers).total(), 80);
        assert!(People::from_parts(&[], "colours 3 red").is_err());
        assert!(People::from_parts(&[], "os x Linux").is_err());
        assert!(People::default().is_empty());
    }

    /// The bar on the real path: 10 000 people (address × User-Agent) under the real
    /// keyed hash, each clicking three times, folded in four parts that are stored and merged
    /// as the stores do, for 10 keys: every estimate within 2 %.
    #[test]
    fn ten_thousand_keyed_visitors_are_counted_within_two_percent() {
        let agents = [
            "Mozilla/5.0 Firefox/131.0",
            "Mozilla/5.0 (iPhone) Safari/604.1",
        ];
        for seed in 0..10u8 {
            let key = [seed; 16];
            let mut parts = vec![People::default(); 4];
            for click in 0..30_000u32 {
                let person = click % 10_000;
                let ip = IpAddr::from([10, (person >> 8) as u8, person as u8, 1]);
                let agent = agents[(person / 5_000) as usize];
                parts[(click % 4) as usize].count(
                    visitor_hash(&key, ip, agent),
                    &[(Dimension::Browsers, agent)],
                );
            }
            let mut window = People::default();
            for part in &parts {
                let stored = People::from_parts(&part.visitors.to_bytes(), "").unwrap();
                window.merge(&stored);
            }
            let estimate = window.visitors.estimate();
            let error = estimate.abs_diff(10_000) as f64 / 10_000.0;
            assert!(error <= 0.02, "key {seed}: {estimate} for 10 000");
        }
    }

    #[test]
    fn the_visitor_key_depends_on_the_secret_address_and_agent() {
        let ip = IpAddr::from([198, 51, 100, 1]);
        let base = visitor_hash(&[1; 16], ip, "UA");
        assert_eq!(base, visitor_hash(&[1; 16], ip, "UA"));
        assert_ne!(base, visitor_hash(&[2; 16], ip, "UA"));
        assert_ne!(base, visitor_hash(&[1; 16], ip, "UA2"));
        assert_ne!(
            base,
            visitor_hash(&[1; 16], IpAddr::from([198, 51, 100, 2]), "UA")
        );
        // One address, whichever way it is written.
        assert_eq!(
            base,
            visitor_hash(&[1; 16], "::ffff:198.51.100.1".parse().unwrap(), "UA")
        );
    }
}
