//! `shortener token create`.

use crate::cli::TokenCreateArgs;
use crate::config::StoreConfig;
use shortener_core::audit::Origin;
use shortener_core::link::{Actor, ActorKind};
use shortener_core::store::TokenRecord;
use shortener_core::token::{Principal, TokenHash, format_token, validate_user_name};

pub(crate) async fn create(args: TokenCreateArgs) -> anyhow::Result<()> {
    validate_user_name(&args.user)?;
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
            },
            &cli_origin(),
        )
        .await?;
    let kind = if args.admin { "admin" } else { "user" };
    println!(
        "{kind} token for {} (store: {config}); it is shown only once:",
        args.user
    );
    println!("{token}");
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
