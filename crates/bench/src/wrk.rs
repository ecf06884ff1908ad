//! Running wrk and reading its report.

use anyhow::{Context, bail};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Wrk {
    pub(crate) threads: u32,
    pub(crate) connections: u32,
    pub(crate) duration: Duration,
    /// Send a browser's User-Agent: the redirects then count as people's clicks (the analytics'
    /// visitor and breakdown facts) instead of bots' (wrk sends no User-Agent).
    pub(crate) as_browser: bool,
}

/// The User-Agent of `--as-browser` runs.
const BROWSER_USER_AGENT: &str =
    "Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko/20100101 Firefox/140.0";

/// What one wrk run measured.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) requests_per_second: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Responses that were neither 2xx nor 3xx.
    pub(crate) non_2xx: u64,
}

impl Run {
    /// Several runs of one server as one: requests and seconds summed (so requests/s over all
    /// of them), p50 and p99 the means of the runs' (wrk reports no histogram to merge).
    pub(crate) fn combined(runs: &[Run]) -> Run {
        let n = runs.len().max(1) as f64;
        let requests = runs.iter().map(|r| r.requests).sum();
        let seconds = runs.iter().map(|r| r.seconds).sum();
        Run {
            requests,
            seconds,
            requests_per_second: requests as f64 / seconds,
            p50_ms: runs.iter().map(|r| r.p50_ms).sum::<f64>() / n,
            p99_ms: runs.iter().map(|r| r.p99_ms).sum::<f64>() / n,
            non_2xx: runs.iter().map(|r| r.non_2xx).sum(),
        }
    }

    /// Successful (2xx/3xx) responses per second.
    pub(crate) fn ok_per_second(&self) -> f64 {
        (self.requests.saturating_sub(self.non_2xx)) as f64 / self.seconds
    }
}

impl Wrk {
    pub(crate) fn run(
        &self,
        url: &str,
        script: Option<&Path>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Run> {
        let mut cmd = Command::new("wrk");
        cmd.arg(format!("-t{}", self.threads))
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.duration.as_secs()))
            .arg("--latency");
        if self.as_browser {
            cmd.arg("-H")
                .arg(format!("User-Agent: {BROWSER_USER_AGENT}"));
        }
        if let Some(script) = script {
            cmd.arg("-s").arg(script);
        }
        cmd.arg(url);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .output()
            .context("cannot run wrk (apt-get install wrk)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        }
        parse(&text).with_context(|| format!("cannot read wrk's report:\n{text}"))
    }
}

fn millis(value: &str) -> Option<f64> {
    let (number, factor) = if let Some(n) = value.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = value.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|n| n * factor)
}

fn parse(text: &str) -> Option<Run> {
    let mut run = Run {
        requests: 0,
        seconds: 0.0,
        requests_per_second: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        non_2xx: 0,
    };
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => run.p50_ms = millis(v)?,
            ["99%", v] => run.p99_ms = millis(v)?,
            ["Requests/sec:", v] => run.requests_per_second = v.parse().ok()?,
            ["Non-2xx", "or", "3xx", "responses:", v] => run.non_2xx = v.parse().ok()?,
            [n, "requests", "in", t, ..] => {
                run.requests = n.parse().ok()?;
                run.seconds = millis(t.trim_end_matches(','))? / 1000.0;
            }
            _ => {}
        }
    }
    (run.requests > 0).then_some(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_wrk_report() {
        let report = "Running 8s test @ http://127.0.0.1:1/\n  1 threads and 64 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   791.12us  200.00us   5.00ms   90.00%\n  Latency Distribution\n     50%  700.00us\n     75%  800.00us\n     90%    1.00ms\n     99%    2.50ms\n  640000 requests in 8.00s, 50.00MB read\n  Non-2xx or 3xx responses: 12\nRequests/sec:  80000.00\nTransfer/sec:      6.25MB\n";
        let run = parse(report).unwrap();
        assert_eq!(run.requests, 640_000);
        assert!((run.seconds - 8.0).abs() < 1e-9);
        assert!((run.p50_ms - 0.7).abs() < 1e-9);
        assert!((run.p99_ms - 2.5).abs() < 1e-9);
        assert_eq!(run.non_2xx, 12);
        assert!((run.requests_per_second - 80_000.0).abs() < 1e-9);
        assert!((run.ok_per_second() - 79_998.5).abs() < 1e-6);
    }

    #[test]
    fn combines_runs_by_their_totals() {
        let run = |requests, seconds: f64, p99_ms| Run {
            requests,
            seconds,
            requests_per_second: requests as f64 / seconds,
            p50_ms: 1.0,
            p99_ms,
            non_2xx: 1,
        };
        let both = Run::combined(&[run(300_000, 5.0, 2.0), run(100_000, 10.0, 4.0)]);
        assert_eq!(both.requests, 400_000);
        // 400 000 requests in fifteen seconds, not the mean of the two rates (35 000).
        assert!((both.requests_per_second - 400_000.0 / 15.0).abs() < 1e-9);
        assert!((both.p99_ms - 3.0).abs() < 1e-9);
        assert_eq!(both.non_2xx, 2);
    }
}
