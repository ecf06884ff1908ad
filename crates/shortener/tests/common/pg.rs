//! The real PostgreSQL on loopback: a fresh database per test, dropped afterwards, and a TCP
//! relay in front of the server that a test can cut to play an outage.

use shortener::store::postgres::{DatabaseUrl, PgStore};

/// Where the admin connection goes; `scripts/test` starts a server there if none answers.
pub const ADMIN_URL_VAR: &str = "SHORTENER_TEST_POSTGRES_URL";
const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub fn admin_url() -> String {
    std::env::var(ADMIN_URL_VAR).unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

async fn admin() -> tokio_postgres::Client {
    let url = admin_url();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL does not answer at {url} ({e}); start it (scripts/test does) or set {ADMIN_URL_VAR}"
            )
        });
    tokio::spawn(connection);
    client
}

/// A database of its own, dropped (with any connection still open to it) on drop, and then
/// the roles made for it.
pub struct TestDb {
    pub name: String,
    /// `postgres://…/name`
    pub url: String,
    roles: Vec<String>,
}

impl TestDb {
    /// An empty database: no schema.
    pub async fn empty() -> Self {
        let name = format!(
            "shortener_test_{}_{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let mut url = url::Url::parse(&admin_url()).unwrap();
        url.set_path(&name);
        Self {
            name,
            url: url.to_string(),
            roles: Vec::new(),
        }
    }

    /// A login role that may read and write every table of the current schema but owns
    /// none; the URL of this database as that role.
    pub async fn non_owner(&mut self) -> String {
        let role = format!("{}_r{}", self.name, self.roles.len());
        self.client()
            .await
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; \
                 GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}"
            ))
            .await
            .unwrap();
        self.roles.push(role.clone());
        let mut url = url::Url::parse(&self.url).unwrap();
        url.set_username(&role).unwrap();
        url.to_string()
    }

    /// A database with the current schema.
    pub async fn migrated() -> Self {
        let db = Self::empty().await;
        PgStore::migrate(&db.database_url()).await.unwrap();
        db
    }

    pub fn database_url(&self) -> DatabaseUrl {
        self.url.parse().unwrap()
    }

    /// A store on this database with its own pool.
    pub async fn store(&self, pool_size: usize) -> PgStore {
        PgStore::open(&self.database_url(), pool_size)
            .await
            .unwrap()
    }

    /// Returns once a session on this database waits on a lock; panics if `waiting` (the
    /// work expected to wait) says it is over first.
    pub async fn until_a_session_waits(&self, waiting: impl Fn() -> bool) {
        self.until(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
            waiting,
        )
        .await;
    }

    /// Returns once a session waits for a lock on `table`; panics if `waiting` says the work
    /// expected to wait is over first.
    pub async fn until_a_lock_on_waits(&self, table: &str, waiting: impl Fn() -> bool) {
        self.until(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_locks \
                                 WHERE NOT granted AND relation = '{table}'::regclass)"
            ),
            waiting,
        )
        .await;
    }

    /// Polls `condition` (one boolean) until it holds, while `waiting`.
    async fn until(&self, condition: &str, waiting: impl Fn() -> bool) {
        let watcher = self.client().await;
        while !watcher
            .query_one(condition, &[])
            .await
            .unwrap()
            .get::<_, bool>(0)
        {
            assert!(waiting(), "the work finished without waiting on a lock");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// A plain connection for checks behind the store's back.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let roles = std::mem::take(&mut self.roles);
        // Drop runs inside the test's runtime, which cannot be blocked on: use a thread with
        // a runtime of its own. Roles go once the database that granted them is gone.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let admin = admin().await;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await?;
                for role in roles {
                    admin
                        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                        .await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

/// A relay to the test PostgreSQL server (see `testkit::Relay`).
pub async fn relay() -> testkit::Relay {
    let url = url::Url::parse(&admin_url()).unwrap();
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port().unwrap_or(5432);
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .unwrap()
        .next()
        .unwrap();
    testkit::Relay::start(target).await.unwrap()
}

/// `url` with its host and port replaced by the relay's.
pub fn url_through(relay: &testkit::Relay, url: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_ip_host(relay.addr.ip()).unwrap();
    url.set_port(Some(relay.addr.port())).unwrap();
    url.to_string()
}

/// A database `shortener` with the current schema on a private server; its URL.
pub async fn migrated_on(server: &testkit::Postgres) -> String {
    server.create_database("shortener").unwrap();
    schema_on(server).await
}

/// The current schema on the existing database `shortener` of a private server; its URL.
pub async fn schema_on(server: &testkit::Postgres) -> String {
    let url = server.url("shortener");
    PgStore::migrate(&url.parse().unwrap()).await.unwrap();
    url
}
