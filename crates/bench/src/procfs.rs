//! What `/proc` says of a server process (resident memory, CPU time) and of the machine (CPU
//! time stolen from it by its host).

use anyhow::Context;

/// `/proc` counts CPU time in USER_HZ ticks, 100 a second on every Linux ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// Resident set size in MiB.
pub(crate) fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

/// User + system CPU seconds the process has used so far, all its threads.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    cpu_of_stat(&stat).with_context(|| format!("cannot read /proc/{pid}/stat: {stat}"))
}

/// CPU seconds the processes `pids` have used so far, each that still runs.
pub(crate) fn cpu_seconds_of(pids: &[u32]) -> Vec<Option<f64>> {
    pids.iter().map(|&pid| cpu_seconds(pid).ok()).collect()
}

/// CPU seconds used between two readings of [`cpu_seconds_of`] over the same processes,
/// counting only those read at both; `None` if there were none (a PostgreSQL on another
/// machine or in another PID namespace), rather than a zero that reads as "no work".
pub(crate) fn cpu_used(before: &[Option<f64>], after: &[Option<f64>]) -> Option<f64> {
    before
        .iter()
        .zip(after)
        .filter_map(|(b, a)| Some(a.as_ref()? - b.as_ref()?))
        .fold(None, |sum, used| Some(sum.unwrap_or(0.0) + used))
}

/// The machine's CPU time so far, all its CPUs, in ticks: the total, and the part stolen (a
/// vCPU ready to run while its host ran something else: other guests, itself). Steal slows
/// the servers of a round unevenly, and on kernels that account it apart it is in neither
/// server's CPU time: a round with much of it is a noisy one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MachineCpu {
    total: u64,
    steal: u64,
}

impl MachineCpu {
    pub(crate) fn read() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        machine_cpu_of(&stat).with_context(|| format!("no readable cpu line in /proc/stat: {stat}"))
    }

    /// The share of the machine's CPU time from `self` to `later` that was stolen, percent.
    pub(crate) fn steal_percent_until(&self, later: &Self) -> f64 {
        let total = later.total.saturating_sub(self.total);
        let steal = later.steal.saturating_sub(self.steal);
        if total == 0 {
            return 0.0;
        }
        steal as f64 * 100.0 / total as f64
    }
}

fn machine_cpu_of(stat: &str) -> Option<MachineCpu> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal; guest time is counted inside user.
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some(MachineCpu {
        total: fields.iter().sum(),
        steal: *fields.get(7)?,
    })
}

fn cpu_of_stat(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3, utime 14 and stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_stolen_share_of_all_cpu_time_between_two_readings() {
        let before = machine_cpu_of(
            "cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 50 0 25 400 5 0 2 18 3 0\nintr 1\n",
        )
        .unwrap();
        let after =
            machine_cpu_of("cpu  160 0 80 900 10 0 5 95 9 0\ncpu0 80 0 40 450 5 0 2 48 4 0\n")
                .unwrap();
        // 250 ticks passed (guest time is inside user, not added again), 60 of them stolen.
        assert_eq!(before.steal_percent_until(&after), 24.0);
        assert_eq!(after.steal_percent_until(&after), 0.0);
        assert!(machine_cpu_of("cpu  1 2 3\n").is_none());
        assert!(machine_cpu_of("intr 1\n").is_none());
    }

    #[test]
    fn reads_utime_and_stime_past_a_name_with_spaces() {
        let stat = "4242 (bare redirect) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(cpu_of_stat(stat), Some(3.0));
        assert_eq!(cpu_of_stat("4242 (x) S 1"), None);
    }

    #[test]
    fn cpu_used_counts_processes_read_at_both_and_none_when_there_are_none() {
        let before = [Some(1.0), None, Some(2.0)];
        let after = [Some(1.5), Some(9.0), None];
        assert_eq!(cpu_used(&before, &after), Some(0.5));
        assert_eq!(cpu_used(&[None, Some(1.0)], &[Some(2.0), None]), None);
        assert_eq!(cpu_used(&[Some(1.0)], &[Some(1.0)]), Some(0.0));
    }

    #[test]
    fn this_process_cpu_time_grows_while_it_works() {
        let me = std::process::id();
        assert!(rss_mib(me).unwrap() > 0.0);
        let before = cpu_seconds(me).unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Work until a tick is counted (10 ms of CPU), or give up well after that.
        while cpu_seconds(me).unwrap() <= before && started.elapsed().as_secs() < 30 {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert!(cpu_seconds(me).unwrap() > before);
    }
}
