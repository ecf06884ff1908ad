//! Property tests of the parsers that take outside input: destination URLs, custom aliases
//! and threat feed files. The suite runs proptest's default 256 cases; `PROPTEST_CASES=100000 cargo test -p
//! shortener-core --test outside_input` is the long run.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use shortener_core::alias::{MAX_LEN, MIN_LEN, could_be_code, validate_alias};
use shortener_core::long_url::{UrlPolicy, validate_long_url};
use shortener_core::threat::{Feed, ThreatMatcher};

/// URL-ish text: schemes, hosts, separators and any characters, so cases reach every rule.
fn url_like() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("http://".to_owned()),
            Just("https://".to_owned()),
            Just("ftp://".to_owned()),
            Just("user:pw@".to_owned()),
            Just("example.com".to_owned()),
            Just("blocked.example".to_owned()),
            Just("[::1]".to_owned()),
            Just(":8080".to_owned()),
            Just("/".to_owned()),
            Just("?q=".to_owned()),
            Just("#".to_owned()),
            Just("%".to_owned()),
            "[a-z0-9.-]{1,12}",
            "\\PC{0,8}",
        ],
        0..10,
    )
    .prop_map(|parts| parts.concat())
}

fn policy() -> UrlPolicy {
    UrlPolicy {
        own_hosts: vec!["sho.rt".to_owned()],
    }
}

proptest! {
    #[test]
    fn an_accepted_url_is_normal_http_and_stays_accepted(input in url_like()) {
        let policy = policy();
        if let Ok(url) = validate_long_url(&input, &policy) {
            prop_assert!(url.starts_with("http://") || url.starts_with("https://"), "{}", url);
            prop_assert!(url.len() <= 2048);
            // Normalising is idempotent: the stored form validates to itself.
            prop_assert_eq!(validate_long_url(&url, &policy), Ok(url.clone()));
        }
    }

    #[test]
    fn plain_https_urls_are_accepted(
        host in "[a-z]{1,20}(\\.[a-z]{2,6}){1,3}",
        path in "(/[A-Za-z0-9._~-]{0,20}){0,5}",
    ) {
        let input = format!("https://{host}{path}");
        prop_assert!(validate_long_url(&input, &policy()).is_ok(), "{}", input);
    }

    #[test]
    fn an_accepted_alias_is_a_possible_code(alias in "[A-Za-z0-9_ -]{0,34}|\\PC{0,10}") {
        if validate_alias(&alias).is_ok() {
            prop_assert!(could_be_code(&alias));
            prop_assert!((MIN_LEN..=MAX_LEN).contains(&alias.len()));
        }
    }

    #[test]
    fn well_formed_aliases_pass_unless_reserved_or_offensive(alias in "[a-z]{2}[0-9]{2,8}-[A-Z0-9]{0,10}") {
        // Digits after two letters keep them off the word lists.
        prop_assert!(validate_alias(&alias).is_ok(), "{}", alias);
    }
}

/// A well-formed domain, which a feed must keep and match.
const DOMAIN: &str = "[a-z][a-z0-9]{0,8}(\\.[a-z][a-z0-9]{0,8}){1,3}";

/// A line of a feed file, and whether it is one of the formats (then `Some` of the URL it must
/// match) or anything else (comments, garbage, lines that merely look like entries).
fn feed_line() -> impl Strategy<Value = (String, Option<String>)> {
    prop_oneof![
        DOMAIN.prop_map(|d| (d.to_uppercase(), Some(format!("https://www.{d}/any")))),
        DOMAIN.prop_map(|d| (format!("0.0.0.0 {d} # ads"), Some(format!("http://{d}/")))),
        (DOMAIN, "(/[a-z0-9]{0,8}){0,3}").prop_map(|(d, p)| {
            let url = format!("http://{d}{p}");
            (url.clone(), Some(url))
        }),
        "#\\PC{0,20}".prop_map(|t| (t, None)),
        "\\PC{0,30}".prop_map(|t| (t, None)),
        "(0\\.0\\.0\\.0|10\\.0\\.0\\.1|::1) \\PC{0,12}".prop_map(|t| (t, None)),
        "(https?|ftp)://\\PC{0,16}".prop_map(|t| (t, None)),
    ]
}

proptest! {
    #[test]
    fn a_feed_keeps_every_entry_and_names_every_line_it_skips(
        lines in proptest::collection::vec(feed_line(), 0..24),
    ) {
        let text: Vec<&str> = lines.iter().map(|(l, _)| l.as_str()).collect();
        let text = text.join("\n");
        let (feed, skipped) = Feed::parse("feed", &text);
        // Skipped lines come in order, each a line that is neither blank nor a comment.
        let numbers: Vec<usize> = skipped.iter().map(|s| s.line).collect();
        prop_assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{:?}", numbers);
        let content: Vec<&str> = text.lines().map(str::trim).collect();
        for &n in &numbers {
            let line = content[n - 1];
            prop_assert!(!line.is_empty() && !line.starts_with('#'), "line {}: {:?}", n, line);
        }
        let entries = content.iter().filter(|l| !l.is_empty() && !l.starts_with('#')).count();
        prop_assert!(feed.len() + skipped.len() <= entries);
        // Every well-formed entry is kept and matches (domains: their subdomains too).
        for (i, (line, must_match)) in lines.iter().enumerate() {
            if let Some(url) = must_match {
                prop_assert!(!numbers.contains(&(i + 1)), "skipped {:?}", line);
                let url = url::Url::parse(url).unwrap();
                prop_assert_eq!(feed.find(&url), Some("feed"), "{:?} for {}", line, url);
            }
        }
    }
}
