//! Opening single connections (the writer's, the migrator's, the listeners') outside
//! the pool, and the handle that stops a background task when its owner goes away.

use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

/// Opens a connection and drives it on its own task, which ends (after telling the
/// server goodbye) when the client is dropped or the connection fails.
///
/// TLS: connections are plain (`NoTls`), so a URL with `sslmode=require` is refused at
/// connect. Supporting TLS means passing a `MakeTlsConnect` (postgres-native-tls or
/// tokio-postgres-rustls) here and to the pool's manager; nothing else changes.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(err = %crate::error::describe(&err), "a PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// Aborts the task when dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
