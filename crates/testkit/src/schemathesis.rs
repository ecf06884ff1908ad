//! Property-based tests of an HTTP API from its own OpenAPI document: the document is checked
//! by a maintained validator (`openapi-spec-validator`) and its examples against their
//! schemas, then schemathesis drives every operation it lists (examples, coverage, random and
//! stateful sequences) against the running server. New operations are covered as soon as the
//! document lists them.
//!
//! The tools come from PyPI into a virtual environment under `target/` (pinned in
//! `crates/testkit/python/requirements.txt`), created on first use. The run is bounded by
//! `OPENAPI_FUZZ_SECONDS` (default 40 per service); set it higher for a long run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const REQUIREMENTS: &str = include_str!("../python/requirements.txt");
const CHECK_EXAMPLES: &str = include_str!("../python/check_examples.py");
const DEFAULT_SECONDS: u64 = 40;
/// How the tool crashing under two workers on CPython 3.11 reads (see `run`).
const AST_RACE: &str = "AST constructor recursion depth mismatch";
/// The console script's body: scripts name the environment's path, which the rename below
/// changes, while `python -c` works from anywhere.
const SCHEMATHESIS_MAIN: &str =
    "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())";

/// One API to fuzz.
#[derive(Debug, Clone)]
pub struct ApiFuzz {
    /// `http://127.0.0.1:PORT/…/openapi.json`
    pub document_url: String,
    /// `http://127.0.0.1:PORT`
    pub base_url: String,
    /// The service's `schemathesis.toml`: which documented answers a check may accept.
    pub config: PathBuf,
    /// Extra arguments for `schemathesis run`: credentials (`-H`, `-a`) and the like.
    pub args: Vec<String>,
    /// Scratch directory (the fetched document, schemathesis' state).
    pub work_dir: PathBuf,
}

impl ApiFuzz {
    /// Validates the document, then fuzzes every operation; `Err` holds the tools' report.
    pub fn run(&self) -> Result<String, String> {
        let venv = venv()?;
        let doc_path = self.work_dir.join("openapi.json");
        let auth = self.fetch_args();
        let fetched = Command::new("curl")
            .args(["-sf", "-o"])
            .arg(&doc_path)
            .args(&auth)
            .arg(&self.document_url)
            .status()
            .map_err(|e| format!("curl: {e}"))?;
        if !fetched.success() {
            return Err(format!("cannot fetch {}", self.document_url));
        }
        let python = venv.join("bin/python");
        output(
            Command::new(&python)
                .args(["-m", "openapi_spec_validator"])
                .arg(&doc_path),
        )?;
        let script = self.work_dir.join("check_examples.py");
        std::fs::write(&script, CHECK_EXAMPLES).map_err(|e| e.to_string())?;
        output(Command::new(&python).arg(&script).arg(&doc_path))?;

        let seconds = std::env::var("OPENAPI_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(DEFAULT_SECONDS);
        let mut cmd = Command::new(&python);
        cmd.current_dir(&self.work_dir)
            .args(["-c", SCHEMATHESIS_MAIN])
            .arg("--config-file")
            .arg(&self.config)
            .args(["run", &self.document_url, "--url", &self.base_url])
            .args(["--max-time", &seconds.to_string(), "--workers", "2"])
            .args(["--no-color", "--wait-for-schema", "10"])
            .args(["--report", "har", "--report-har-path"])
            .arg(self.har())
            .args(&self.args)
            .env("SCHEMATHESIS_TELEMETRY", "false");
        match output(&mut cmd) {
            // CPython 3.11's `ast.parse` is not safe across threads (gh-106905): with two
            // workers the tool itself can crash. That says nothing of the service: run again.
            Err(text) if text.contains(AST_RACE) => output(&mut cmd),
            result => result,
        }
    }

    /// What the last run sent and got, from its HAR report: a test can check that an
    /// operation's success path was reached, not only its refusals.
    pub fn exchanges(&self) -> Result<Vec<Exchange>, String> {
        let text =
            std::fs::read_to_string(self.har()).map_err(|e| format!("the HAR report: {e}"))?;
        let har: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("the HAR report: {e}"))?;
        let entries = har["log"]["entries"]
            .as_array()
            .ok_or("the HAR report has no log.entries")?;
        Ok(entries
            .iter()
            .filter_map(|e| {
                let url = e["request"]["url"].as_str()?;
                let path = url.strip_prefix(&self.base_url).unwrap_or(url);
                Some(Exchange {
                    method: e["request"]["method"].as_str()?.to_owned(),
                    path: path.split('?').next().unwrap_or(path).to_owned(),
                    status: u16::try_from(e["response"]["status"].as_u64()?).ok()?,
                })
            })
            .collect())
    }

    /// Whether the last run reached the success path (2xx, 3xx) of every operation the
    /// document's links lead to, not only their refusals: what a link hands on must work.
    /// Either way a report of the statuses each operation got (methods a path does not have,
    /// all 405, left out); `Err` names the operations never reached.
    pub fn links_reached(&self) -> Result<String, String> {
        let statuses = self.statuses_by_operation()?;
        let mut report = String::new();
        for (operation, seen) in statuses.iter().filter(|(_, s)| s.iter().any(|&s| s != 405)) {
            report.push_str(&format!("{operation}: {seen:?}\n"));
        }
        let unreached = self.unreached_link_targets(&statuses)?;
        if unreached.is_empty() {
            Ok(report)
        } else {
            Err(format!(
                "{report}linked, yet never answered 2xx/3xx in the run: {unreached:?}"
            ))
        }
    }

    /// The statuses each operation (`METHOD /template`, matched by the document's paths)
    /// got in the last run.
    fn statuses_by_operation(&self) -> Result<BTreeMap<String, BTreeSet<u16>>, String> {
        let doc = self.document()?;
        let templates: Vec<&str> = doc["paths"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut out: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
        for e in self.exchanges()? {
            let path = template_of(&templates, &e.path).unwrap_or(&e.path);
            out.entry(format!("{} {path}", e.method))
                .or_default()
                .insert(e.status);
        }
        Ok(out)
    }

    /// The operations the document's links lead to (`METHOD /template`) that never answered
    /// 2xx or 3xx in the last run (`statuses`).
    fn unreached_link_targets(
        &self,
        statuses: &BTreeMap<String, BTreeSet<u16>>,
    ) -> Result<Vec<String>, String> {
        let doc = self.document()?;
        let mut by_id = BTreeMap::new();
        let mut targets = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                if let Some(id) = op["operationId"].as_str() {
                    by_id.insert(id, format!("{} {path}", method.to_uppercase()));
                }
                let responses = op["responses"].as_object().into_iter().flatten();
                for (_, response) in responses {
                    let links = response["links"].as_object().into_iter().flatten();
                    targets.extend(links.filter_map(|(_, l)| l["operationId"].as_str()));
                }
            }
        }
        targets
            .into_iter()
            .map(|id| {
                by_id
                    .get(id)
                    .cloned()
                    .ok_or_else(|| format!("a link leads to the unknown operation {id}"))
            })
            .filter(|op| {
                op.as_ref().map_or(true, |op| {
                    !statuses
                        .get(op)
                        .is_some_and(|seen| seen.iter().any(|s| (200..400).contains(s)))
                })
            })
            .collect()
    }

    /// The document as the last run fetched it.
    fn document(&self) -> Result<serde_json::Value, String> {
        let text = std::fs::read_to_string(self.work_dir.join("openapi.json"))
            .map_err(|e| format!("the fetched document: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("the fetched document: {e}"))
    }

    fn har(&self) -> PathBuf {
        self.work_dir.join("schemathesis.har")
    }

    /// curl's flags for the credentials given to schemathesis (`-a` or `-H`).
    fn fetch_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut args = self.args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-a" => out.extend(["-u".to_owned(), args.next().cloned().unwrap_or_default()]),
                "-H" => out.extend(["-H".to_owned(), args.next().cloned().unwrap_or_default()]),
                _ => {}
            }
        }
        out
    }
}

/// One request of a run and the status it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub method: String,
    /// Without the base URL and the query.
    pub path: String,
    pub status: u16,
}

/// The path template of `templates` that `path` is a request of: segments equal, or a
/// `{parameter}`; of several, the one with the most literal segments (`/healthz` before
/// `/{code}`).
fn template_of<'a>(templates: &[&'a str], path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split('/').collect();
    templates
        .iter()
        .filter_map(|t| {
            let segments: Vec<&str> = t.split('/').collect();
            if segments.len() != parts.len() {
                return None;
            }
            let mut literal = 0;
            for (s, p) in segments.iter().zip(&parts) {
                if s.starts_with('{') && s.ends_with('}') && !p.is_empty() {
                    continue;
                }
                if s != p {
                    return None;
                }
                literal += 1;
            }
            Some((literal, *t))
        })
        .max_by_key(|(literal, _)| *literal)
        .map(|(_, t)| t)
}

/// Runs a command; its combined output, as `Err` when it fails.
fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd:?} failed ({}):\n{text}", out.status))
    }
}

/// The virtual environment with the pinned tools, created (or refreshed when the pins
/// changed) on first use. Built beside its final place and renamed, so that two test
/// processes starting together never see half an environment.
fn venv() -> Result<PathBuf, String> {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let venv = target.join("openapi-venv");
    let stamp = venv.join("requirements.txt");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == REQUIREMENTS) {
        return Ok(venv);
    }
    let building = target.join(format!("openapi-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    output(Command::new("python3").args(["-m", "venv"]).arg(&building))?;
    let requirements = building.join("requirements.txt");
    std::fs::write(&requirements, REQUIREMENTS).map_err(|e| e.to_string())?;
    output(
        Command::new(building.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements),
    )?;
    // Only `python -m`/`-c` are used, which work after the rename. The stale environment
    // goes first; a concurrent builder that lost the race uses the winner's (same pins).
    let stale = target.join(format!("openapi-venv.old.{}", std::process::id()));
    let _ = std::fs::rename(&venv, &stale);
    let _ = std::fs::remove_dir_all(&stale);
    if std::fs::rename(&building, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    Ok(venv)
}

#[cfg(test)]
mod tests {
    use super::template_of;

    #[test]
    fn a_path_takes_the_most_literal_template_that_fits() {
        let templates = [
            "/{code}",
            "/healthz",
            "/api/v1/links/{code}",
            "/api/v1/links/{code}/qr",
        ];
        assert_eq!(template_of(&templates, "/healthz"), Some("/healthz"));
        assert_eq!(template_of(&templates, "/abc"), Some("/{code}"));
        assert_eq!(
            template_of(&templates, "/api/v1/links/x/qr"),
            Some("/api/v1/links/{code}/qr")
        );
        assert_eq!(template_of(&templates, "/api/v1/links/x/y"), None);
        assert_eq!(template_of(&templates, "/"), None);
    }
}
