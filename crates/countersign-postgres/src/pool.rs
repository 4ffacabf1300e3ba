//! The pool of connections (deadpool-postgres) that serves reads, log integration and
//! the writes that append no event; only appends need the writer's connection and its
//! lock. Statements are prepared once per connection and cached.

use std::sync::Arc;

use countersign_store::StoreError;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::{NoTls, Row, Statement};

use crate::config::{Options, Target};
use crate::error::{db_err, pool_err};
use crate::params::Param;

pub(crate) struct Pooled {
    pool: Pool,
    target: Arc<Target>,
}

impl Pooled {
    /// Sets the pool up; it connects on demand.
    pub(crate) fn new(target: Arc<Target>, options: &Options) -> Result<Self, StoreError> {
        let manager = Manager::from_config(
            target.config.clone(),
            NoTls,
            ManagerConfig {
                // A connection that broke is noticed (and replaced) when it is next
                // handed out; queries on it fail rather than hang, and are retryable.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Backend(format!("could not set up a connection pool: {e}")))?;
        Ok(Self { pool, target })
    }

    /// A connection for `op`; a failure to connect says in words what is wrong.
    pub(crate) async fn client(&self, op: &'static str) -> Result<Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_err(op, &self.target.name, e))
    }

    /// A pooled connection with `sql` prepared on it.
    async fn prepared(
        &self,
        op: &'static str,
        sql: &str,
    ) -> Result<(Object, Statement), StoreError> {
        let client = self.client(op).await?;
        let statement = client.prepare_cached(sql).await.map_err(db_err(op))?;
        Ok((client, statement))
    }

    /// Runs one statement on a pooled connection.
    pub(crate) async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, StoreError> {
        let (client, statement) = self.prepared(op, sql).await?;
        client.query(&statement, params).await.map_err(db_err(op))
    }

    /// The first row of [`query`](Self::query), which must return one.
    pub(crate) async fn query_one(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row, StoreError> {
        self.query(op, sql, params)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Backend(format!("{op}: the query returned no row")))
    }

    /// Runs one statement on a pooled connection; how many rows it changed.
    pub(crate) async fn execute(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, StoreError> {
        let (client, statement) = self.prepared(op, sql).await?;
        client.execute(&statement, params).await.map_err(db_err(op))
    }

    /// Inserts a row with `sql` (an `INSERT ... ON CONFLICT DO NOTHING`);
    /// [`StoreError::Duplicate`] naming `what` if it inserted nothing.
    pub(crate) async fn insert_new(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Param<'_>],
        what: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        match self.execute(op, sql, params).await? {
            0 => Err(StoreError::Duplicate(what())),
            _ => Ok(()),
        }
    }
}
