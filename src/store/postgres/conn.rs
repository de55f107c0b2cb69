//! PostgreSQL's connection: the connection string as accepted, one connection with its
//! prepared statements, and the migrations applied at connect.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio_postgres::config::SslMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use crate::store::StoreError;

/// The embedded migrations, in order; `schema_migrations` holds the versions applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_init.sql"),
    include_str!("../../../migrations/postgres/0002_lease_expiry.sql"),
    include_str!("../../../migrations/postgres/0003_node_certificates.sql"),
    include_str!("../../../migrations/postgres/0004_thread_state.sql"),
    include_str!("../../../migrations/postgres/0005_thread_archived.sql"),
    include_str!("../../../migrations/postgres/0006_run_queue.sql"),
    include_str!("../../../migrations/postgres/0007_budget_days.sql"),
    include_str!("../../../migrations/postgres/0008_webhook_outbox.sql"),
    include_str!("../../../migrations/postgres/0009_schedules.sql"),
    include_str!("../../../migrations/postgres/0010_claims.sql"),
];
/// The advisory lock a migration holds for its transaction ("agui-mig").
const MIGRATION_LOCK: i64 = 0x6167_7569_2d6d_6967;
/// How long a connection attempt may take when the connection string does not say.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A statement's parameter.
pub(super) type Param<'a> = &'a (dyn ToSql + Sync);

/// One connection and its prepared statements.
pub(super) struct Conn {
    pub(super) client: Client,
    statements: Mutex<HashMap<&'static str, Statement>>,
}

impl Conn {
    /// Connects; the connection is driven by a task of its own.
    pub(super) async fn open(config: &Config) -> Result<Conn, tokio_postgres::Error> {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::error!(%error, "PostgreSQL connection lost");
            }
        });
        Ok(Conn {
            client,
            statements: Mutex::default(),
        })
    }

    /// `sql` prepared once per connection.
    pub(super) async fn prepare(
        &self,
        sql: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        let cached = self.lock().get(sql).cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await?;
        self.lock().insert(sql, statement.clone());
        Ok(statement)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Statement>> {
        // Every mutation is a single insert.
        self.statements.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `sql` (prepared once); the rows it changed.
    pub(super) async fn execute(
        &self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<u64, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.execute(&statement, params).await?)
    }

    /// Runs query `sql` (prepared once); its rows.
    pub(super) async fn query(
        &self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query(&statement, params).await?)
    }

    /// Runs query `sql` (prepared once); its one row, if any.
    pub(super) async fn query_opt(
        &self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query_opt(&statement, params).await?)
    }
}

/// Parses the connection string; refuses one that asks for TLS. Errors never quote it.
pub(super) fn parse(url: &str) -> Result<Config, StoreError> {
    let mut config: Config = url.parse().map_err(|error| {
        // tokio-postgres does not know the verify modes: name them rather than "invalid".
        for mode in ["verify-ca", "verify-full"] {
            if url.contains(&format!("sslmode={mode}")) {
                return StoreError::PgTls(mode.to_owned());
            }
        }
        StoreError::PgConfig(error)
    })?;
    match config.get_ssl_mode() {
        SslMode::Disable | SslMode::Prefer => {}
        SslMode::Require => return Err(StoreError::PgTls("require".to_owned())),
        _ => return Err(StoreError::PgTls("other".to_owned())),
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("agui-serve");
    }
    // A batch never sits idle inside its transaction; one that does belongs to a process
    // that stopped (paused, cut off) while holding lease rows `FOR SHARE`: the server ends
    // that session, so a takeover does not wait on it.
    let options = format!(
        "{} -c idle_in_transaction_session_timeout=1000",
        config.get_options().unwrap_or("")
    );
    config.options(options.trim());
    Ok(config)
}

/// Applies the migrations not yet applied, each in its own transaction under the
/// migration lock.
pub(super) async fn migrate(client: &Client) -> Result<(), StoreError> {
    loop {
        client.batch_execute("BEGIN").await?;
        match migrate_one(client).await {
            Ok(applied) => {
                client.batch_execute("COMMIT").await?;
                match applied {
                    Some(version) => tracing::info!(version, "database migrated"),
                    None => return Ok(()),
                }
            }
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(error);
            }
        }
    }
}

/// In a transaction: takes the migration lock and applies the next migration; which one,
/// or `None` when the schema is current.
async fn migrate_one(client: &Client) -> Result<Option<i32>, StoreError> {
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});
             CREATE TABLE IF NOT EXISTS schema_migrations (
                 version    INT PRIMARY KEY,
                 applied_at BIGINT NOT NULL  -- ms since the Unix epoch
             );"
        ))
        .await?;
    let version: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    if version as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew(version.into()));
    }
    let Some(sql) = MIGRATIONS.get(version as usize) else {
        return Ok(None);
    };
    client.batch_execute(sql).await?;
    let version = version + 1;
    client
        .execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&version, &crate::store::now_ms()],
        )
        .await?;
    Ok(Some(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_asking_for_tls_are_refused_without_quoting_them() {
        for url in [
            "postgres://u:s3cret@db/x?sslmode=require",
            "host=db user=u password=s3cret sslmode=require",
            "postgres://u:s3cret@db/x?sslmode=verify-full",
            "host=db password=s3cret sslmode=verify-ca",
        ] {
            let error = parse(url).expect_err(url);
            assert!(matches!(error, StoreError::PgTls(_)), "{url}: {error}");
            let text = error.to_string();
            assert!(
                text.contains("TLS to PostgreSQL is not supported"),
                "{text}"
            );
            assert!(!text.contains("s3cret"), "{text}");
        }
        for url in [
            "postgres://u:s3cret@db/x",
            "postgres://u:s3cret@db/x?sslmode=prefer",
            "postgres://u@%2Ftmp%2Fpg:5432/x?sslmode=disable",
            "host=/tmp/pg port=5432 user=u dbname=x",
        ] {
            parse(url).expect(url);
        }
        let error = parse("postgres://u:s3cret@db/x?bogus=1").expect_err("unknown option");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }
}
