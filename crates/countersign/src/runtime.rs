//! Opening a data directory: the database, the signing key and the gate over them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use countersign_core::evidence::Reviewer;
use countersign_core::{Clock, Limits, Principal, Role, SystemClock};
use countersign_postgres::PostgresStore;
use countersign_server::{Gate, KeyRing, Settings, TransparencyLog};
use countersign_sqlite::SqliteStore;
use countersign_store::{ChangeFeed, Store};

use crate::config::{Config, Database};

/// Creates the data directory (mode 0700) if needed, then opens the store and the keys.
pub async fn open(config: &Config) -> anyhow::Result<Arc<Gate>> {
    let dir = &config.data_dir;
    if !dir.exists() {
        fs::create_dir_all(dir)
            .with_context(|| format!("could not create the data directory {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("could not restrict {}", dir.display()))?;
    } else if !dir.is_dir() {
        bail!("the data directory {} is not a directory", dir.display());
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let keys = KeyRing::open_or_create(&config.keys_dir(), clock.now())
        .context("could not load the signing key")?;
    let store = open_store(config).await?;
    countersign_server::keyring::publish(&*store, &keys)
        .await
        .context("could not publish the signing key")?;
    let feed = ChangeFeed::start(store.clone(), Duration::from_millis(config.feed_poll_ms))
        .await
        .context("could not read the event log")?;
    let keys = Arc::new(keys);
    let proposed = match &config.log_origin {
        Some(origin) => origin.clone(),
        None => default_origin()?,
    };
    let log = TransparencyLog::open(store.clone(), keys.clone(), clock.clone(), &proposed)
        .await
        .context("could not open the transparency log")?;
    let settings = Settings {
        limits: Limits::default(),
        reviewer: config.reviewer.as_ref().map(|(id, name)| Reviewer {
            id: id.clone(),
            display_name: name.clone(),
        }),
        raw_payload_export: config.raw_payload_export,
        session_seconds: config.session_hours * 3600,
        backup_dir: Some(config.data_dir.join("backups")),
    };
    Ok(Arc::new(Gate::new(
        store,
        feed,
        keys,
        clock,
        Arc::new(log),
        settings,
    )?))
}

/// Opens (and migrates) the configured database.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match &config.database {
        Database::Sqlite(path) => Arc::new(
            SqliteStore::open(path)
                .with_context(|| format!("could not open {}", path.display()))?,
        ),
        Database::Postgres(url) => Arc::new(
            PostgresStore::connect(url)
                .await
                .with_context(|| format!("could not open {}", config.database.describe()))?,
        ),
    })
}

/// `countersign/<12 random hex digits>`: unique to this installation, fixed forever once
/// the log exists.
fn default_origin() -> anyhow::Result<String> {
    let mut id = [0u8; 6];
    getrandom::fill(&mut id).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(format!("countersign/{}", hex::encode(id)))
}

/// The operating-system user running this process.
pub fn os_user() -> String {
    whoami::username()
}

/// Who a local command acts as: the OS user, as an admin of this data directory.
pub fn local_admin() -> Principal {
    Principal::local_user(&os_user(), Role::Admin)
}

/// Who a stdio MCP process acts as: an agent, named after the OS user (or `--agent-name`)
/// and kept distinct from the same user deciding at a terminal.
pub fn stdio_agent(name: Option<&str>) -> Principal {
    let name = name.map(str::to_string).unwrap_or_else(os_user);
    Principal {
        id: format!("stdio:{name}"),
        display_name: name,
        role: Role::Agent,
        auth_method: countersign_core::AuthMethod::LocalOsUser,
    }
}
