//! The simulator runs, prints one JSON object per (case, policy), and the pool keeps the
//! guarantees that are structural (not tuning targets): no sticky violations, never below the
//! minimum in service, never above the quarantine cap.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn simulator_reports_every_case_and_policy_as_json_lines() {
    let out = Command::new(env!("CARGO_BIN_EXE_proxypool-sim"))
        .args(["--json", "--requests", "3000", "--seed", "5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["case"], (i / 3 + 1) as u64);
        assert_eq!(line["policy"], ["random", "round_robin", "pool"][i % 3]);
        assert_eq!(line["requests"], 3000);
        for field in [
            "success_rate",
            "oracle_success_rate",
            "max_quarantined_fraction",
        ] {
            let v = line[field].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{field} {v}");
        }
        for field in [
            "false_quarantines",
            "sticky_violations",
            "min_in_service_violations",
        ] {
            assert!(line[field].is_u64(), "{field}");
        }
        if line["policy"] == "pool" {
            assert_eq!(line["sticky_violations"], 0);
            assert_eq!(line["min_in_service_violations"], 0);
            assert!(line["max_quarantined_fraction"].as_f64().unwrap() <= 0.3 + 1e-9);
        }
    }
    // Naive random choice breaks account sessions; the pool does not.
    assert!(lines[3]["sticky_violations"].as_u64().unwrap() > 0);
}

#[test]
fn simulator_rejects_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_proxypool-sim"))
        .args(["--case", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
