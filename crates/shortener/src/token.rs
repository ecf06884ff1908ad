//! `shortener token create|list|revoke`.

use crate::cli::{TokenCreateArgs, TokenListArgs, TokenRevokeArgs};
use crate::config::StoreConfig;
use anyhow::bail;
use shortener_core::audit::Origin;
use shortener_core::day::rfc3339;
use shortener_core::link::{Actor, ActorKind};
use shortener_core::store::TokenRecord;
use shortener_core::token::{
    Principal, TokenHash, TokenId, format_token, validate_token_name, validate_user_name,
};

pub(crate) async fn create(args: TokenCreateArgs) -> anyhow::Result<()> {
    validate_user_name(&args.user)?;
    if let Some(name) = &args.name {
        validate_token_name(name)?;
    }
    let config = StoreConfig::resolve(&args.store)?;
    let store = crate::store::open(&config, None).await?;
    let token = format_token(rand::random());
    store
        .insert_token(
            &TokenRecord {
                hash: TokenHash::of(&token),
                principal: Principal {
                    user: args.user.clone(),
                    admin: args.admin,
                },
                created_at: crate::now(),
                name: args.name.clone(),
            },
            &cli_origin(),
        )
        .await?;
    let kind = if args.admin { "admin" } else { "user" };
    println!(
        "{kind} token {} for {} (store: {config}); it is shown only once:",
        TokenHash::of(&token).public_id(),
        args.user
    );
    println!("{token}");
    Ok(())
}

pub(crate) async fn list(args: TokenListArgs) -> anyhow::Result<()> {
    let config = StoreConfig::resolve(&args.store)?;
    let store = crate::store::open(&config, None).await?;
    println!("ID\tUSER\tNAME\tADMIN\tCREATED\tLAST_USED");
    for t in store.list_tokens().await? {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            t.id,
            t.principal.user,
            t.name
                .as_deref()
                .map_or("-".to_owned(), |n| format!("{n:?}")),
            if t.principal.admin { "yes" } else { "no" },
            rfc3339(t.created_at),
            t.last_used_at.map_or("never".to_owned(), rfc3339),
        );
    }
    Ok(())
}

pub(crate) async fn revoke(args: TokenRevokeArgs) -> anyhow::Result<()> {
    let id: TokenId = args.id.trim().parse()?;
    let config = StoreConfig::resolve(&args.store)?;
    let store = crate::store::open(&config, None).await?;
    match store.revoke_token(id, &cli_origin(), crate::now()).await? {
        Some(token) => println!("revoked {}", token.describe()),
        None => bail!("no token {id} in {config}"),
    }
    Ok(())
}

/// The operator at the console: an admin named `cli` in the audit trail.
pub(crate) fn cli_origin() -> Origin {
    Origin {
        actor: Actor {
            name: "cli".to_owned(),
            kind: ActorKind::Admin,
        },
        ip: None,
        user_agent: None,
    }
}
