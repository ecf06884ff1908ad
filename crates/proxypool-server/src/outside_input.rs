//! Property tests of the parsers that take outside input: the proxy username (sessions),
//! `Proxy-Authorization`, the upstream file, target hosts and the TOML config file. Each runs
//! proptest's default 256 cases in the suite; `PROPTEST_CASES=100000 cargo test -p
//! proxypool-server --lib outside_input` is the long run.

#![allow(clippy::unwrap_used)]

use crate::auth::parse_basic;
use crate::cli::ServeArgs;
use crate::config::ServeConfig;
use crate::sessions::parse_username;
use crate::site::site_of;
use crate::upstreams;
use base64::Engine;
use proptest::prelude::*;
use std::time::Duration;

/// Text with the separators the parsers look for, so that cases reach their branches.
fn tricky_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("-session-".to_owned()),
            Just("-ttl-".to_owned()),
            Just(":".to_owned()),
            Just("#".to_owned()),
            Just("\n".to_owned()),
            Just("://".to_owned()),
            Just("@".to_owned()),
            "[0-9]{1,22}",
            "\\PC{0,6}",
        ],
        0..12,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn usernames_split_without_panics_into_their_own_prefixes(name in tricky_text()) {
        let id = parse_username(&name);
        if let Some(session) = id.session {
            prop_assert!(name.starts_with(session.key));
            prop_assert!(session.key.starts_with(id.user));
            prop_assert!(!id.user.is_empty());
            prop_assert!(session.key.len() > id.user.len() + "-session-".len());
            if let Some(ttl) = session.ttl {
                prop_assert!(ttl >= Duration::from_secs(60));
            }
        } else {
            prop_assert_eq!(id.user, name.as_str());
        }
    }

    #[test]
    fn session_names_come_back_whole(
        user in "[a-z][a-z0-9.]{0,10}",
        id in "[A-Za-z0-9]{1,12}",
        ttl in proptest::option::of(1u64..=100_000),
    ) {
        let name = match ttl {
            Some(m) => format!("{user}-session-{id}-ttl-{m}"),
            None => format!("{user}-session-{id}"),
        };
        let parsed = parse_username(&name);
        let session = parsed.session.unwrap();
        prop_assert_eq!(parsed.user, user.as_str());
        prop_assert_eq!(session.key, format!("{user}-session-{id}"));
        prop_assert_eq!(session.ttl, ttl.map(|m| Duration::from_secs(m * 60)));
    }

    #[test]
    fn proxy_authorization_round_trips_and_garbage_is_refused(
        user in "[^:]{0,20}",
        password in "\\PC{0,20}",
        garbage in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let header = format!("Basic {encoded}");
        prop_assert_eq!(parse_basic(header.as_bytes()), Some((user, password)));
        let _ = parse_basic(&garbage);
    }

    #[test]
    fn upstream_files_keep_good_lines_and_number_the_bad(text in tricky_text()) {
        let parsed = upstreams::parse(&text);
        let lines = text.lines().count();
        for bad in &parsed.bad {
            prop_assert!((1..=lines).contains(&bad.line), "{:?} of {}", bad, lines);
        }
        let unique: std::collections::HashSet<_> = parsed.addresses.iter().collect();
        prop_assert_eq!(unique.len(), parsed.addresses.len());
        prop_assert!(parsed.addresses.len() + parsed.bad.len() <= lines);
    }

    #[test]
    fn generated_upstream_lines_all_load(
        hosts in proptest::collection::vec(("(http|socks5|socks5h)", "[a-z]{1,10}(\\.[a-z]{2,5})?", 1u16..), 1..20),
    ) {
        let text: String = hosts
            .iter()
            .enumerate()
            .map(|(i, (scheme, host, port))| format!("{scheme}://{host}{i}:{port}  # no. {i}\n"))
            .collect();
        let parsed = upstreams::parse(&text);
        prop_assert!(parsed.bad.is_empty(), "{:?}", parsed.bad);
        prop_assert_eq!(parsed.addresses.len(), hosts.len());
    }

    #[test]
    fn target_hosts_always_have_a_site(host in "\\PC{0,40}") {
        let site = site_of(&host);
        prop_assert!(site.len() <= host.len());
    }

    #[test]
    fn config_files_load_or_say_why(lines in proptest::collection::vec(config_line(), 0..8)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxypool.toml");
        std::fs::write(&path, lines.concat()).unwrap();
        let args = ServeArgs {
            config: Some(path),
            upstreams: Some(dir.path().join("upstreams.txt")),
            ..ServeArgs::default()
        };
        if let Err(e) = ServeConfig::resolve(args) {
            let message = format!("{e:#}");
            prop_assert!(!message.is_empty() && !message.contains('\n'), "{}", message);
        }
    }
}

/// One line of a plausible config file: known keys, values of any type and sign.
fn config_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("upstreams_poll_ms"),
        Just("[gateway]\nconnect_timeout_ms"),
        Just("[gateway]\nresponse_timeout_ms"),
        Just("[gateway]\ncaptcha_scan_bytes"),
        Just("[http]\nmax_connections"),
        Just("[http]\nmax_header_bytes"),
        Just("[http]\nheader_timeout"),
        Just("[pool]\nmax_leases_per_address"),
        Just("[pool]\nquarantine_cap"),
        Just("[pool]\nsticky_ttl_ms"),
        Just("[pool]\nstrategy"),
        Just("[pool.health]\nmin_samples"),
        Just("[pool.backoff]\njitter"),
        Just("no_such_key"),
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        any::<bool>().prop_map(|v| v.to_string()),
        "[a-z_]{0,12}".prop_map(|v| format!("{v:?}")),
        Just("[1, 2]".to_owned()),
    ];
    (key, value).prop_map(|(k, v)| format!("{k} = {v}\n"))
}

#[test]
fn a_ttl_past_the_cap_is_part_of_the_session_id() {
    let name = "alice-session-s1-ttl-18446744073709551615";
    let session = parse_username(name).session.unwrap();
    assert_eq!((session.key, session.ttl), (name, None));
    let capped = format!("alice-session-s1-ttl-{}", crate::sessions::MAX_TTL_MINUTES);
    let session = parse_username(&capped).session.unwrap();
    assert_eq!(session.key, "alice-session-s1");
}
