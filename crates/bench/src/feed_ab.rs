//! `--threat-feed-entries N`: what a large threat feed costs (issue 14's bar: creates/s with
//! a 1 000 000-entry feed ≥ 0.9 × without it, the hot redirect ratio unchanged), in one run.
//!
//! Two shortener processes on fresh embedded stores of their own, one serving a synthetic
//! feed of N entries, and the bare server; every round measures creates on both and the hot
//! link on all three, rotating who goes first, so each ratio compares runs made moments apart.

use crate::backend::Backend;
use crate::procfs::rss_mib;
use crate::wrk::{Run, Wrk};
use crate::{admin_token, conclude, listening, median, spread, verdict};
use anyhow::{Context, bail};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use testkit::Process;

/// Every tenth entry is a URL (URLhaus / OpenPhish style), the rest are domains.
const URL_EVERY: usize = 10;
/// The share of creates/s the feed may cost, and of the hot ratio.
const CREATES_BAR: f64 = 0.9;

/// One shortener under comparison.
struct Side {
    name: &'static str,
    process: Process,
    base: String,
    token: String,
    hot: String,
}

/// Writes a feed of `entries` lines: domains `dN.threat-bench.example`, and URLs on
/// `uN.threat-bench.example`.
fn write_feed(path: &Path, entries: usize) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "# synthetic feed of the bench harness")?;
    for i in 0..entries {
        if i % URL_EVERY == 0 {
            writeln!(out, "http://u{i}.threat-bench.example/login.php?id={i}")?;
        } else {
            writeln!(out, "d{i}.threat-bench.example")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn start(
    name: &'static str,
    bin_dir: &Path,
    backend: &Backend,
    extra: &[String],
) -> anyhow::Result<Side> {
    let token = admin_token(bin_dir, backend)?;
    let mut cmd = Command::new(bin_dir.join("shortener"));
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .args(backend.flags())
        .args(extra)
        .env("SHORTENER_LOG", "warn");
    let mut process = Process::spawn(name, cmd)?;
    let base = listening(&mut process)?;
    Ok(Side {
        name,
        process,
        base,
        token,
        hot: String::new(),
    })
}

/// Creates the hot link of `side`; checks that a feed entry is refused when `blocked`.
async fn prepare(side: &mut Side, blocked: bool, entries: usize) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let create = |url: &str| {
        client
            .post(format!("{}/api/v1/links", side.base))
            .bearer_auth(&side.token)
            .json(&serde_json::json!({ "long_url": url }))
            .send()
    };
    let made: serde_json::Value = create("https://example.com/hot").await?.json().await?;
    side.hot = made["short_code"]
        .as_str()
        .context("no short_code")?
        .to_owned();
    let refused = create("https://www.d1.threat-bench.example/x").await?;
    let status = refused.status().as_u16();
    if blocked != (status == 400) {
        bail!("{}: a feed entry answered {status}", side.name);
    }
    if blocked {
        let metrics = client
            .get(format!("{}/metrics", side.base))
            .send()
            .await?
            .text()
            .await?;
        let loaded = format!("shortener_threat_feed_entries {entries}");
        if !metrics.lines().any(|l| l == loaded) {
            bail!(
                "{}: the feed is not loaded whole ({loaded} missing)",
                side.name
            );
        }
    }
    Ok(())
}

/// Runs the comparison; fails when a bar is missed.
pub(crate) fn run(
    wrk: Wrk,
    rounds: usize,
    bin_dir: &Path,
    lua_dir: &Path,
    entries: usize,
) -> anyhow::Result<()> {
    let work = tempfile::TempDir::new()?;
    let feed = work.path().join("feed.txt");
    write_feed(&feed, entries)?;
    let (plain, fed) = (
        Backend::embedded(&work.path().join("without")),
        Backend::embedded(&work.path().join("with")),
    );
    let feed_flags = ["--threat-feed".to_owned(), feed.display().to_string()];
    let mut without = start("without feed", bin_dir, &plain, &[])?;
    let mut with = start("with feed", bin_dir, &fed, &feed_flags)?;
    let mut bare = Process::spawn("bare", Command::new(bin_dir.join("bare-redirect")))?;
    let bare_base = listening(&mut bare)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(prepare(&mut without, false, entries))?;
    rt.block_on(prepare(&mut with, true, entries))?;
    println!(
        "threat feed of {entries} entries: RSS without {:.1} MiB, with {:.1} MiB; wrk -t{} -c{} -d{}s",
        rss_mib(without.process.pid())?,
        rss_mib(with.process.pid())?,
        wrk.threads,
        wrk.connections,
        wrk.duration.as_secs()
    );

    let creates_lua = lua_dir.join("creates.lua");
    let creates = |side: &Side| -> anyhow::Result<Run> {
        wrk.run(
            &format!("{}/", side.base),
            Some(&creates_lua),
            &[("TOKEN", &side.token)],
        )
    };
    let hot = |base: &str, code: &str| wrk.run(&format!("{base}/{code}"), None, &[]);
    // Unmeasured: warm caches and connections on all three.
    hot(&bare_base, &without.hot)?;
    for side in [&without, &with] {
        hot(&side.base, &side.hot)?;
    }
    let (mut create_ratios, mut hot_without, mut hot_with, mut hot_ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [&without, &with]
        } else {
            [&with, &without]
        };
        let mut per_second = [0.0; 2];
        for side in order {
            let run = creates(side)?;
            println!(
                "round {}: creates {:<12} {:>8.0} 201/s (non-2xx {})",
                round + 1,
                side.name,
                run.ok_per_second(),
                run.non_2xx
            );
            per_second[usize::from(std::ptr::eq(side, &with))] = run.ok_per_second();
        }
        create_ratios.push(per_second[1] / per_second[0]);
        // Hot link: bare, then both, the first one rotating.
        let bare_run = hot(&bare_base, &without.hot)?;
        let mut ours = [0.0; 2];
        for side in order {
            let run = hot(&side.base, &side.hot)?;
            ours[usize::from(std::ptr::eq(side, &with))] = run.requests_per_second;
        }
        let b = bare_run.requests_per_second;
        println!(
            "round {}: hot link bare {b:.0} req/s, without {:.0} ({:.2}), with {:.0} ({:.2})",
            round + 1,
            ours[0],
            ours[0] / b,
            ours[1],
            ours[1] / b
        );
        hot_without.push(ours[0] / b);
        hot_with.push(ours[1] / b);
        hot_ratios.push(ours[1] / ours[0]);
    }
    let creates_ratio = median(create_ratios.iter().copied());
    let (hw, hf, hot_ratio) = (
        median(hot_without.iter().copied()),
        median(hot_with.iter().copied()),
        median(hot_ratios.iter().copied()),
    );
    println!("\n== threat feed of {entries} entries: medians of {rounds} rounds ==");
    let mut failed = Vec::new();
    println!(
        "creates with ÷ without: {creates_ratio:.2} (rounds {})  ≥ {CREATES_BAR} {}",
        spread(create_ratios.into_iter(), 2),
        verdict(creates_ratio >= CREATES_BAR, "creates", &mut failed)
    );
    println!(
        "hot ratio (ours ÷ bare) without {hw:.2} (rounds {}), with {hf:.2} (rounds {}); hot req/s with ÷ without {hot_ratio:.2} (rounds {})  ≥ {CREATES_BAR} {}",
        spread(hot_without.into_iter(), 2),
        spread(hot_with.into_iter(), 2),
        spread(hot_ratios.into_iter(), 2),
        verdict(hot_ratio >= CREATES_BAR, "hot", &mut failed)
    );
    without.process.terminate()?;
    with.process.terminate()?;
    conclude(&failed)
}
