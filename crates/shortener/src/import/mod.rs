//! `shortener import FILE`: links in bulk, each validated by the rules creates use
//! (`new_link`, threat feeds included), owned by `--user`, stored with its `created` audit
//! row. Lines go to the store in batches of `--batch` (the first few smaller), one
//! transaction each, and each transaction also records how far the file has been read
//! (line number and byte offset, under a meta key naming the user and the file). An
//! interrupted import run again resumes after the last committed line: nothing is stored
//! twice, nothing skipped.

mod lines;

use crate::allocator::CodeAllocator;
use crate::config::ImportConfig;
use crate::new_link::{self, Refused};
use crate::store::Store;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use lines::{Fields, Line};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shortener_core::audit::Origin;
use shortener_core::day::UnixSeconds;
use shortener_core::link::{Actor, ActorKind, DEFAULT_EXPIRES_IN_DAYS, Link};
use shortener_core::long_url::{UrlPolicy, own_host_of};
use shortener_core::store::{ImportBatch, ImportOutcome, InsertOutcome, StoreError};
use shortener_core::threat::Feeds;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of the file's start that identify it when an import resumes.
const HEAD_BYTES: u64 = 4096;
/// Refused lines listed one by one; the rest are counted.
const REFUSALS_LISTED: usize = 1000;
/// The User-Agent of import's audit rows.
const AGENT: &str = "shortener import";

/// Where an import of one file stands, as stored with each batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    /// Lines read and settled (stored or refused).
    line: u64,
    /// Byte offset just after that line.
    offset: u64,
    /// SHA-256 of the file's first bytes, hex.
    head: String,
}

/// A refused line.
#[derive(Debug)]
struct Refusal {
    line: u64,
    code: &'static str,
    message: String,
}

/// A batch on its way to the store, with the line of each custom alias (only an alias can
/// be refused once the batch is written: a taken generated code is replaced).
struct Pending {
    batch: ImportBatch,
    aliases: HashMap<String, u64>,
}

pub(crate) async fn run(config: ImportConfig) -> anyhow::Result<()> {
    let feeds = crate::feeds::load_all(&crate::feeds::files(
        config.blocklist.as_deref(),
        &config.threat_feeds,
    ))?
    .feeds;
    let policy = UrlPolicy {
        own_hosts: config
            .base_url
            .as_deref()
            .and_then(own_host_of)
            .into_iter()
            .collect(),
    };
    let path = std::fs::canonicalize(&config.file)
        .with_context(|| format!("cannot read {}", config.file.display()))?;
    let mut file =
        std::fs::File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let size = file.metadata()?.len();
    let mut head = Vec::new();
    (&mut file).take(HEAD_BYTES).read_to_end(&mut head)?;
    let head_hash = hex(&Sha256::digest(&head));
    let format = config.format.unwrap_or_else(|| {
        let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
        lines::sniff(&path, &String::from_utf8_lossy(first))
    });

    let store = crate::store::open_for_import(&config.store).await?;
    let key = format!("import:{}:{}", config.user, path.display());
    let start = match store.meta(&key).await? {
        Some(stored) if !config.restart => {
            let p: Progress = serde_json::from_slice(&stored)
                .with_context(|| format!("the stored progress of {key:?} is unreadable"))?;
            if p.head != head_hash {
                bail!(
                    "{} is not the file an earlier import stopped reading at line {}: its first {HEAD_BYTES} bytes differ; pass --restart to import it from the first line",
                    path.display(),
                    p.line
                );
            }
            p
        }
        _ => Progress {
            line: 0,
            offset: 0,
            head: head_hash,
        },
    };
    if start.offset > size {
        bail!(
            "{} is shorter than when an earlier import read it to byte {}; pass --restart",
            path.display(),
            start.offset
        );
    }
    if start.line > 0 {
        println!("resuming after line {} (byte {})", start.line, start.offset);
    }
    let allocator = Arc::new(CodeAllocator::new(store.clone(), config.batch as u64).await?);
    file.seek(SeekFrom::Start(start.offset))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);

    let bar = ProgressBar::new(size);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
    ) {
        bar.set_style(style);
    }
    bar.set_position(start.offset);

    let origin = Origin {
        actor: Actor {
            name: config.user.clone(),
            kind: ActorKind::User,
        },
        ip: None,
        user_agent: Some(AGENT.to_owned()),
    };
    let rules = Rules {
        policy,
        feeds,
        owner: config.user.clone(),
    };
    let started = Instant::now();
    let (mut progress, mut refused, mut stored) = (start.clone(), Vec::new(), 0u64);
    let mut in_flight: Option<tokio::task::JoinHandle<Result<Settled, StoreError>>> = None;
    let mut buf = Vec::new();
    // The first batches are smaller: the writer starts only once a whole batch is read.
    let mut batch_size = (config.batch / 8).max(1);
    loop {
        let now = crate::now();
        let mut pending = Pending {
            batch: ImportBatch {
                links: Vec::with_capacity(batch_size),
                origin: origin.clone(),
                progress_key: key.clone(),
                progress: Vec::new(),
            },
            aliases: HashMap::new(),
        };
        let mut eof = false;
        while pending.batch.links.len() < batch_size {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 {
                eof = true;
                break;
            }
            progress.line += 1;
            progress.offset += n as u64;
            let line = progress.line;
            let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let fields = match std::str::from_utf8(text)
                .map_err(|_| "not UTF-8".to_owned())
                .and_then(|t| lines::parse(format, t, line == 1))
            {
                Ok(Line::Skip) => continue,
                Ok(Line::Link(fields)) => fields,
                Err(message) => {
                    refused.push(Refusal {
                        line,
                        code: "invalid_line",
                        message,
                    });
                    continue;
                }
            };
            match rules.link(fields, now) {
                Err(r) => refused.push(Refusal {
                    line,
                    code: r.code(),
                    message: r.to_string(),
                }),
                Ok(link) if link.custom_alias => {
                    if let Some(first) = pending.aliases.get(&link.code) {
                        refused.push(Refusal {
                            line,
                            code: "alias_taken",
                            message: format!(
                                "the alias {:?} is on line {first} already",
                                link.code
                            ),
                        });
                    } else {
                        pending.aliases.insert(link.code.clone(), line);
                        pending.batch.links.push(link);
                    }
                }
                Ok(link) => pending.batch.links.push(link),
            }
        }
        for link in pending.batch.links.iter_mut().filter(|l| !l.custom_alias) {
            link.code = fresh_code(&allocator, &pending.aliases).await?;
        }
        // In code order, the order the store inserts them in: its own sort then finds them
        // sorted (a linear pass) on the writer thread, which is what limits an import, while
        // this runs beside it. Codes are distinct within a batch.
        pending
            .batch
            .links
            .sort_unstable_by(|a, b| a.code.cmp(&b.code));
        pending.batch.progress = serde_json::to_vec(&progress)?;
        // The previous batch commits while this one was read; one in flight keeps the
        // stored progress in file order.
        if let Some(task) = in_flight.take() {
            stored += settle(task, &mut refused, &progress).await?;
            bar.set_message(format!("{stored} links"));
        }
        let (store, allocator) = (store.clone(), allocator.clone());
        in_flight = Some(tokio::spawn(commit(store, allocator, pending)));
        bar.set_position(progress.offset);
        batch_size = (batch_size * 2).min(config.batch);
        if eof {
            break;
        }
    }
    if let Some(task) = in_flight.take() {
        stored += settle(task, &mut refused, &progress).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Also when this run stored nothing: an earlier, interrupted one may have stored the rest.
    bar.set_message("bringing the store's statistics up to date");
    let maintained = Instant::now();
    let maintenance = store.after_import().await;
    bar.finish_and_clear();
    println!(
        "imported {stored} links from {} (lines {}–{}) in {seconds:.1} s ({:.0} links/s); refused {} lines",
        path.display(),
        start.line + 1,
        progress.line,
        stored as f64 / seconds.max(1e-9),
        refused.len()
    );
    match maintenance {
        Ok(Some(ran)) => println!("{ran}: {:.1} s", maintained.elapsed().as_secs_f64()),
        Ok(None) => {}
        // The store's error says what did not run and what to do.
        Err(e) => eprintln!("warning: the links are stored; {e}"),
    }
    report_refusals(refused);
    Ok(())
}

/// The rules of creates applied to one line's fields.
struct Rules {
    policy: UrlPolicy,
    feeds: Feeds,
    owner: String,
}

impl Rules {
    /// The link the fields ask for (code left empty when generated), or why not.
    fn link(&self, fields: Fields, now: UnixSeconds) -> Result<Link, Refused> {
        let long_url = new_link::destination(&self.policy, &self.feeds, &fields.long_url)?;
        if let Some(alias) = &fields.custom_alias {
            new_link::alias(alias)?;
        }
        let expires_at = match &fields.expires_at {
            Some(at) => new_link::expiry_at(now, at)?,
            None => new_link::expiry_in_days(now, i64::from(DEFAULT_EXPIRES_IN_DAYS))?,
        };
        Ok(Link {
            owner: Some(self.owner.clone()),
            custom_alias: fields.custom_alias.is_some(),
            code: fields.custom_alias.unwrap_or_default(),
            ..Link::new("", &long_url, now, expires_at)
        })
    }
}

/// A generated code that is none of the batch's aliases (generated codes never repeat).
async fn fresh_code(
    allocator: &CodeAllocator,
    aliases: &HashMap<String, u64>,
) -> Result<String, StoreError> {
    loop {
        let code = allocator.next_code().await?;
        if !aliases.contains_key(&code) {
            return Ok(code);
        }
    }
}

/// A committed batch and its outcomes.
struct Settled {
    batch: Arc<ImportBatch>,
    aliases: HashMap<String, u64>,
    outcomes: Vec<InsertOutcome>,
}

/// Writes one batch, giving generated codes that aliases hold new codes until it commits.
async fn commit(
    store: Arc<dyn Store>,
    allocator: Arc<CodeAllocator>,
    pending: Pending,
) -> Result<Settled, StoreError> {
    let mut batch = Arc::new(pending.batch);
    loop {
        match store.import_links(batch.clone()).await? {
            ImportOutcome::Committed(outcomes) => {
                return Ok(Settled {
                    batch,
                    aliases: pending.aliases,
                    outcomes,
                });
            }
            ImportOutcome::GeneratedTaken(taken) => {
                // The store has let go of its share: no copy.
                let links = &mut Arc::make_mut(&mut batch).links;
                for i in taken {
                    links[i].code = fresh_code(&allocator, &pending.aliases).await?;
                }
            }
        }
    }
}

/// Waits for a batch; returns how many links it stored and adds its taken aliases to
/// `refused`.
async fn settle(
    task: tokio::task::JoinHandle<Result<Settled, StoreError>>,
    refused: &mut Vec<Refusal>,
    reading: &Progress,
) -> anyhow::Result<u64> {
    let settled = task
        .await
        .context("an import batch panicked")?
        .with_context(|| {
            format!(
                "the import stopped (lines up to {} were read, not all stored); run the same command again to resume after the last stored batch",
                reading.line
            )
        })?;
    let mut stored = 0;
    for (link, outcome) in settled.batch.links.iter().zip(&settled.outcomes) {
        match outcome {
            InsertOutcome::Inserted => stored += 1,
            // Only an alias: a committed batch stored all of its generated codes.
            InsertOutcome::CodeTaken => refused.push(Refusal {
                line: settled.aliases.get(&link.code).copied().unwrap_or_default(),
                code: "alias_taken",
                message: format!("the alias {:?} is already taken", link.code),
            }),
        }
    }
    Ok(stored)
}

/// Lists refused lines in line order on stderr, then how many more there were.
fn report_refusals(mut refused: Vec<Refusal>) {
    refused.sort_by_key(|r| r.line);
    for r in refused.iter().take(REFUSALS_LISTED) {
        eprintln!("line {}: {}: {}", r.line, r.code, r.message);
    }
    if refused.len() > REFUSALS_LISTED {
        eprintln!(
            "… and {} more refused lines",
            refused.len() - REFUSALS_LISTED
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
