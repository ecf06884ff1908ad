//! Property tests of the parsers that take outside input: destination URLs and custom
//! aliases. The suite runs proptest's default 256 cases; `PROPTEST_CASES=100000 cargo test -p
//! shortener-core --test outside_input` is the long run.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use shortener_core::alias::{MAX_LEN, MIN_LEN, could_be_code, validate_alias};
use shortener_core::long_url::{UrlPolicy, validate_long_url};

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
