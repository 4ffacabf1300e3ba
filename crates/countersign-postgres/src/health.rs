//! What the server says about itself (`doctor` output), and the health check that turns
//! it into words an operator can act on.

use countersign_store::StoreError;

use crate::error::{column_err, db_err};
use crate::writer::{Outcome, Write};
use crate::{PostgresStore, SCHEMA_VERSION, schema, unexpected};

/// What the server says about itself, for `doctor` output and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// e.g. "15.4".
    pub server_version: String,
    /// `on` unless someone changed it for our sessions; acknowledged writes are durable
    /// only when it is `on` (or `remote_write` and stronger with a standby).
    pub synchronous_commit: String,
    /// The schema our tables are in.
    pub schema: String,
    /// The countersign schema version found there (0 if none).
    pub schema_version: i32,
    /// A standby in recovery: it can serve no writes.
    pub in_recovery: bool,
    /// Transactions are read-only by default for our sessions.
    pub read_only: bool,
}

impl PostgresStore {
    pub async fn server_info(&self) -> Result<ServerInfo, StoreError> {
        let op = "read the server's settings";
        let client = self.pool.client(op).await?;
        let row = client
            .query_one(
                "SELECT current_setting('server_version'),
                        current_setting('synchronous_commit'),
                        coalesce(current_schema(), ''),
                        pg_is_in_recovery(),
                        current_setting('transaction_read_only') = 'on',
                        to_regclass('schema_version') IS NOT NULL",
                &[],
            )
            .await
            .map_err(db_err(op))?;
        let column = column_err("the server's settings");
        let has_versions: bool = row.try_get(5).map_err(&column)?;
        let schema_version = if has_versions {
            schema::current_version(&client).await.map_err(db_err(op))?
        } else {
            0
        };
        Ok(ServerInfo {
            server_version: row.try_get(0).map_err(&column)?,
            synchronous_commit: row.try_get(1).map_err(&column)?,
            schema: row.try_get(2).map_err(&column)?,
            in_recovery: row.try_get(3).map_err(&column)?,
            read_only: row.try_get(4).map_err(&column)?,
            schema_version,
        })
    }

    /// Says what is wrong, in words: the server unreachable, the credentials or the
    /// database refused, a read-only server, a missing or newer schema, or the log head
    /// locked by another instance for longer than the lock timeout.
    pub(crate) async fn health(&self) -> Result<(), StoreError> {
        let target = &self.target.name;
        drop(self.pool.client("check the database").await?);
        let info = self.server_info().await?;
        if info.in_recovery {
            return Err(StoreError::Unavailable(format!(
                "PostgreSQL at {target} is a read-only standby (in recovery); point \
                 countersign at the primary"
            )));
        }
        if info.read_only {
            return Err(StoreError::Unavailable(format!(
                "PostgreSQL at {target} only allows reads (default_transaction_read_only \
                 is on for this user or database)"
            )));
        }
        if info.schema_version == 0 {
            return Err(StoreError::Backend(format!(
                "PostgreSQL at {target} has no countersign tables in schema {:?}; run \
                 `countersign migrate`",
                info.schema
            )));
        }
        if info.schema_version > SCHEMA_VERSION {
            return Err(schema::newer(target, info.schema_version));
        }
        // Through the writer: its connection works, and it can take the log head lock
        // (so no other instance holds it for longer than the lock timeout) and commit.
        match self.writer.submit(Write::Check).await {
            Ok(Outcome::Checked) => Ok(()),
            Ok(_) => Err(unexpected("check")),
            Err(err) => Err(StoreError::Unavailable(format!(
                "PostgreSQL at {target} cannot be written: {err}"
            ))),
        }
    }
}
