//! Two `proxypool serve` processes on one Redis (`--redis`): one pool, so a session keeps its
//! exit whichever gateway it comes through, and both show the same addresses and outcomes; each
//! counts its own calls in its metrics and exports the pool's gauges.

#![allow(clippy::unwrap_used)]

mod common;

use common::{FAST_POOL, Server, Target, Tinyproxy, get};

const SITE: &str = "127.0.20.1";

/// The sum of a server's /metrics samples of `name` whose labels include `label`.
async fn metric(server: &Server, name: &str, label: &str) -> f64 {
    let url = format!("{}/metrics", server.api);
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_share_sessions_and_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let redis = testkit::RedisServer::start(dir.path()).unwrap();
    let tinyproxies: Vec<Tinyproxy> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|ip| Tinyproxy::start(dir.path(), ip))
        .collect();
    let target = Target::start(&[SITE]);
    let upstreams: Vec<String> = tinyproxies.iter().map(Tinyproxy::url).collect();
    let url = redis.url();
    let flags = ["--redis", url.as_str(), "--redis-pool", "shared"];
    let servers: Vec<Server> = ["a", "b"]
        .iter()
        .map(|name| {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            Server::start(&d, &upstreams, FAST_POOL, &flags)
        })
        .collect();

    let mut exits = std::collections::HashSet::new();
    for i in 0..12 {
        let user = format!("alice-session-s{i}");
        let mut seen = Vec::new();
        for round in 0..4 {
            let server = &servers[round % 2];
            let (status, error, body) =
                get(&server.client(Some(&user)), &target.url(SITE, "/")).await;
            assert_eq!(
                (status, error),
                (200, None),
                "{user} via server {}",
                round % 2
            );
            seen.push(body.trim().to_owned());
        }
        assert!(seen.iter().all(|e| *e == seen[0]), "{user} moved: {seen:?}");
        exits.insert(seen[0].clone());
    }
    assert!(exits.len() >= 2, "12 sessions all on {exits:?}");

    // One pool: the same three addresses, and 48 successes on the site, seen from either API.
    for server in &servers {
        let rows = server.api_get("/v1/addresses").await;
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 3, "{rows:?}");
        let successes: u64 = rows.iter().map(|r| r["successes"].as_u64().unwrap()).sum();
        assert_eq!(successes, 48, "{rows:?}");
    }

    // Metrics: each process counts its own calls (24 each), and exports the pool's gauges.
    for server in &servers {
        let success = r#"outcome="success""#;
        assert_eq!(metric(server, "proxypool_acquires_total", "").await, 24.0);
        let outcomes = metric(server, "proxypool_address_outcomes_total", success).await;
        assert_eq!(outcomes, 24.0);
        let pair = metric(server, "proxypool_cell_outcomes_total", success).await;
        assert_eq!(pair, 24.0);
        assert_eq!(metric(server, "proxypool_addresses", "").await, 3.0);
        let healthy = metric(server, "proxypool_addresses", r#"state="healthy""#).await;
        assert_eq!(healthy, 3.0);
    }
}
