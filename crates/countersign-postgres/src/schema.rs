//! Migrations, safe when several instances start at once: each takes a session-level
//! advisory lock before it reads the schema version, so one migrates while the others
//! wait and then find nothing left to do.

use countersign_store::StoreError;
use tokio_postgres::Client;

use crate::config::Target;
use crate::connection::connect;
use crate::error::{connect_err, describe, map};

/// Migration `i` takes the schema from version `i` to `i + 1`. Never edit one that has
/// shipped; append a new one.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_initial.sql"),
    include_str!("../migrations/0002_token_expiry_scopes_unique_names.sql"),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory lock every countersign instance takes to migrate: "cntrsign" in ASCII.
/// One key for the whole database, whatever the schema: migrations are rare and quick.
const MIGRATION_LOCK: i64 = 0x636e_7472_7369_676e;

/// The table that records which migrations ran, one row each.
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_version (
    version    integer PRIMARY KEY,
    applied_at bigint NOT NULL
)";

/// Brings the schema up to date; returns the version it is at.
pub(crate) async fn migrate(target: &Target) -> Result<i32, StoreError> {
    let op = "migrate the database";
    let mut client = connect(&target.config)
        .await
        .map_err(|e| connect_err(op, &target.name, &e))?;
    // Another instance may be running a long migration: wait for it rather than fail
    // after the usual lock timeout.
    client
        .batch_execute("SET lock_timeout = '10min'")
        .await
        .map_err(|e| map(op, &e))?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| map("take the migration lock", &e))?;
    let result = apply_missing(&mut client, target).await;
    // Closing the connection would release the lock too; unlock anyway so that a
    // pooled or long-lived connection could never keep it.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    result
}

async fn apply_missing(client: &mut Client, target: &Target) -> Result<i32, StoreError> {
    let fail = |what: &str, e: tokio_postgres::Error| {
        StoreError::Backend(format!(
            "migrating PostgreSQL at {}: {what}: {}",
            target.name,
            describe(&e)
        ))
    };
    if let Some(schema) = &target.schema {
        // Under the lock: concurrent CREATE SCHEMA IF NOT EXISTS can still collide.
        // The name was checked to be a plain lowercase identifier.
        client
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await
            .map_err(|e| fail(&format!("create schema {schema}"), e))?;
    }
    client
        .batch_execute(VERSION_TABLE)
        .await
        .map_err(|e| fail("create the schema_version table", e))?;
    let current = current_version(client)
        .await
        .map_err(|e| fail("read the schema version", e))?;
    if current > SCHEMA_VERSION {
        return Err(newer(&target.name, current));
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let to = from as i32 + 1;
        let tx = client
            .transaction()
            .await
            .map_err(|e| fail("begin a migration", e))?;
        tx.batch_execute(sql)
            .await
            .map_err(|e| fail(&format!("from schema version {from}"), e))?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at)
             VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
            &[&to],
        )
        .await
        .map_err(|e| fail("record the schema version", e))?;
        tx.commit()
            .await
            .map_err(|e| fail("commit a migration", e))?;
        tracing::info!(target = %target.name, from, to, "migrated the database");
    }
    Ok(SCHEMA_VERSION)
}

/// The newest migration recorded (0 for an empty schema).
pub(crate) async fn current_version(client: &Client) -> Result<i32, tokio_postgres::Error> {
    client
        .query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[])
        .await?
        .try_get(0)
}

pub(crate) fn newer(target: &str, found: i32) -> StoreError {
    StoreError::Backend(format!(
        "the database at {target} has countersign schema version {found}, newer than this \
         countersign understands ({SCHEMA_VERSION}); run a newer countersign"
    ))
}
