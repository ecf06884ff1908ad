//! Property test of the TOML config file: known keys with values of any type and sign, and
//! unknown keys, either load or fail with one line saying why — never a panic. The suite runs
//! proptest's default 256 cases; `PROPTEST_CASES=20000 cargo test -p shortener --test
//! config_files` is the long run.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use shortener::cli::{ServeArgs, StoreArgs};
use shortener::config::ServeConfig;

fn config_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("listen"),
        Just("database"),
        Just("database_pool_size"),
        Just("redis"),
        Just("base_url"),
        Just("anon_creates_per_hour"),
        Just("id_block_size"),
        Just("cache_mb"),
        Just("cache_ttl"),
        Just("click_flush_ms"),
        Just("captcha"),
        Just("captcha_after"),
        Just("audit_retention_days"),
        Just("[http]\nmax_connections"),
        Just("[http]\nmax_header_bytes"),
        Just("[http]\nrequest_timeout"),
        Just("no_such_key"),
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        any::<bool>().prop_map(|v| v.to_string()),
        "[a-z0-9:/@.]{0,24}".prop_map(|v| format!("{v:?}")),
        Just("[1, 2]".to_owned()),
    ];
    (key, value).prop_map(|(k, v)| format!("{k} = {v}\n"))
}

proptest! {
    #[test]
    fn config_files_load_or_say_why(lines in proptest::collection::vec(config_line(), 0..8)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shortener.toml");
        std::fs::write(&path, lines.concat()).unwrap();
        let args = ServeArgs {
            store: StoreArgs {
                config: Some(path),
                data_dir: Some(dir.path().join("data")),
                ..StoreArgs::default()
            },
            ..ServeArgs::default()
        };
        if let Err(e) = ServeConfig::resolve(args) {
            let message = format!("{e:#}");
            prop_assert!(!message.is_empty() && !message.contains('\n'), "{}", message);
        }
    }
}
