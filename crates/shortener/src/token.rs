//! `shortener token create`.

use crate::cli::TokenCreateArgs;
use crate::config::token_data_dir;
use crate::store::sqlite::SqliteStore;
use shortener_core::store::{LinkStore, TokenRecord};
use shortener_core::token::{Principal, TokenHash, format_token, validate_user_name};

pub(crate) async fn create(args: TokenCreateArgs) -> anyhow::Result<()> {
    validate_user_name(&args.user)?;
    let data_dir = token_data_dir(&args)?;
    let store = SqliteStore::open(&data_dir)?;
    let token = format_token(rand::random());
    store
        .insert_token(&TokenRecord {
            hash: TokenHash::of(&token),
            principal: Principal {
                user: args.user.clone(),
                admin: args.admin,
            },
            created_at: crate::now(),
        })
        .await?;
    let kind = if args.admin { "admin" } else { "user" };
    println!(
        "{kind} token for {} (store: {}); it is shown only once:",
        args.user,
        store.path().display()
    );
    println!("{token}");
    Ok(())
}
