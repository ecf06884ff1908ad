//! `shortener migrate`.

use crate::cli::MigrateArgs;
use crate::config::StoreConfig;
use crate::store::postgres::PgStore;
use crate::store::sqlite::{self, SqliteStore};

pub(crate) async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let config = StoreConfig::resolve(&args.store)?;
    let (applied, version) = match &config {
        // Opening the embedded store migrates it; say so rather than refuse.
        StoreConfig::Embedded { data_dir } => {
            SqliteStore::open(data_dir)?;
            (None, sqlite::CURRENT_VERSION)
        }
        StoreConfig::Postgres { url, .. } => {
            let report = PgStore::migrate(url).await?;
            (Some(report.applied), usize::try_from(report.version)?)
        }
    };
    match applied {
        Some(n) => println!("{config}: applied {n} migration(s); schema version {version}"),
        None => println!("{config}: schema version {version}"),
    }
    Ok(())
}
