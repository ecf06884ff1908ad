//! The operator's commands on the store: `shortener link disable|enable` and
//! `shortener audit`. Serving processes learn of these changes from the store's change
//! sequence (see `change_poll.rs`).

use crate::api::audit::{AuditEntry, AuditFilter};
use crate::api::check_reason;
use crate::cli::{AuditArgs, LinkCommand};
use crate::config::StoreConfig;
use crate::token::cli_origin;
use anyhow::{Context, bail};
use shortener_core::audit::MAX_PAGE;
use shortener_core::link::{LinkChange, Refusal};
use shortener_core::store::ChangeOutcome;

/// Most rows `shortener audit` prints.
const MAX_ROWS: usize = 100_000;

pub(crate) async fn link(command: LinkCommand) -> anyhow::Result<()> {
    let (store_args, code, change) = match command {
        LinkCommand::Disable(args) => {
            check_reason(&args.reason).map_err(anyhow::Error::msg)?;
            let reason = args.reason.trim().to_owned();
            (args.store, args.code, LinkChange::Disable { reason })
        }
        LinkCommand::Enable(args) => (args.store, args.code, LinkChange::Enable),
    };
    let config = StoreConfig::resolve(&store_args)?;
    let store = crate::store::open(&config, None).await?;
    match store
        .change_link(&code, &change, &cli_origin(), crate::now())
        .await?
    {
        ChangeOutcome::Changed { after, .. } => println!(
            "{code}: {} (version {})",
            after.status(crate::now()).as_str(),
            after.version
        ),
        ChangeOutcome::Unchanged(link) => println!(
            "{code}: already {} (version {})",
            link.status(crate::now()).as_str(),
            link.version
        ),
        ChangeOutcome::Refused(Refusal::NotFound) => bail!("no link {code:?} in {config}"),
        ChangeOutcome::Refused(refusal) => bail!("{code}: {refusal}"),
    }
    Ok(())
}

pub(crate) async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    if !(1..=MAX_ROWS).contains(&args.limit) {
        bail!("--limit must be between 1 and {MAX_ROWS}");
    }
    let filter = AuditFilter {
        code: args.code,
        actor: args.actor,
        action: args.action,
        since: args.since,
        until: args.until,
    };
    let mut query = filter.query().map_err(anyhow::Error::msg)?;
    let config = StoreConfig::resolve(&args.store)?;
    let store = crate::store::open(&config, None).await?;
    let mut left = args.limit;
    while left > 0 {
        query.limit = left.min(MAX_PAGE);
        let rows = store
            .audit(&query)
            .await
            .context("cannot read the audit trail")?;
        for row in &rows {
            let entry = AuditEntry::of(row.clone());
            if args.json {
                println!("{}", serde_json::to_string(&entry)?);
            } else {
                println!("{}", entry.line());
            }
        }
        left -= rows.len();
        match rows.last() {
            Some(last) if rows.len() == query.limit => query.before = Some(last.id),
            _ => break,
        }
    }
    Ok(())
}
