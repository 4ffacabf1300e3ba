//! Opening a data directory: the database, the signing key and the gate over them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use countersign_core::{Principal, Role};
use countersign_postgres::PostgresStore;
use countersign_server::{Gate, Settings};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;

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
    let store = open_store(config).await?;
    let settings = Settings {
        reviewer: config.reviewer.clone(),
        recipients: config.notify.recipients(),
        raw_payload_export: config.raw_payload_export,
        session_seconds: config.session_hours * 3600,
        backup_dir: Some(config.data_dir.join("backups")),
        max_waits_per_token: config.server.max_waits_per_token,
        groups: config.guards.groups.clone(),
        identities: config.guards.identities.clone(),
        room_messages_per_minute: config.guards.room_messages_per_minute,
        pending_per_agent: config.guards.pending_per_agent,
        request_quorum: config.guards.request_quorum,
        policy: config.policy.clone(),
        max_sessions_per_account: config.server.max_sessions_per_account,
        ..Settings::default()
    };
    let mut builder = Gate::builder(store, config.keys_dir())
        .feed_poll(Duration::from_millis(config.feed_poll_ms))
        .settings(settings);
    if let Some(origin) = &config.log_origin {
        builder = builder.log_origin(origin.clone());
    }
    builder
        .build()
        .await
        .with_context(|| format!("could not open the data in {}", config.data_dir.display()))
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
/// A local agent process (`mcp`, `proxy`, `hook`): `--agent-name` checked, the data
/// directory's gate opened, and its expiry sweeper (and, with `log`, the log's
/// integration) running until the returned token is cancelled.
pub async fn open_agent(
    config: &Config,
    agent_name: Option<&str>,
    log: bool,
) -> anyhow::Result<(Arc<Gate>, Principal, tokio_util::sync::CancellationToken)> {
    if let Some(name) = agent_name {
        countersign_core::token::validate_token_name(name)
            .map_err(|e| anyhow::anyhow!("--agent-name: {e}"))?;
    }
    let gate = open(config).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    if log {
        tokio::spawn(
            gate.log()
                .clone()
                .run(gate.feed().clone(), shutdown.clone()),
        );
    }
    Ok((gate, stdio_agent(agent_name), shutdown))
}

/// The gate a process in the agent's path (`proxy`, `hook`, `exec`) asks: a remote
/// `serve` when `--server` names one (its token names the agent), else the local data
/// directory's gate, acting as the local agent with the `gateway` scope (this process
/// is the gateway). The token stops the local gate's background tasks.
pub async fn open_gateway(
    config: &Config,
    remote: &crate::remote::RemoteArgs,
    agent_name: Option<&str>,
    log: bool,
) -> anyhow::Result<(
    Arc<dyn countersign_server::held::Approvals>,
    String,
    tokio_util::sync::CancellationToken,
)> {
    if let Some(remote) = crate::remote::Remote::from_args(remote, agent_name)? {
        let server = remote.describe();
        return Ok((
            Arc::new(remote),
            server,
            tokio_util::sync::CancellationToken::new(),
        ));
    }
    let (gate, who, shutdown) = open_agent(config, agent_name, log).await?;
    let who = who.with_scopes(&Role::Agent.scopes());
    let id = who.id.clone();
    Ok((
        Arc::new(countersign_server::held::LocalGate { gate, who }),
        id,
        shutdown,
    ))
}

pub fn stdio_agent(name: Option<&str>) -> Principal {
    let name = name.map(str::to_string).unwrap_or_else(os_user);
    Principal::new(
        format!("stdio:{name}"),
        &name,
        Role::Agent,
        countersign_core::AuthMethod::LocalOsUser,
    )
}
