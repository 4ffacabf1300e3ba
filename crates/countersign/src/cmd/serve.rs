use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use std::sync::Arc;

use countersign_server::HttpConfig;
use countersign_server::accounts::SetupLink;
use countersign_server::gate::SERVED_INSTANCE_PREFIX;
use countersign_server::mcp::gateway::{Asks, GatewayService, GatewaySettings};
use countersign_server::notify::Notifier;
use countersign_server::operate::Operations;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8787; port 0 picks a free port). Also
    /// COUNTERSIGN_LISTEN.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

/// How long in-flight requests (long polls included) get to finish after a shutdown
/// signal. Everything acknowledged is already durable, so cutting them off loses nothing.
const DRAIN: Duration = Duration::from_secs(5);
/// How long the first-admin setup link works.
const SETUP_SECONDS: u64 = 30 * 60;

/// Connections the kernel may hold before `serve` accepts them (capped by
/// `net.core.somaxconn`). Thousands of agents reconnecting at once after a restart or a
/// network blip would overflow the usual 1,024, and their connects would stall on SYN
/// retries for seconds.
const BACKLOG: u32 = 8192;

/// Where a phone or another machine reaches a `serve` that listens beyond loopback, and
/// what keeps it from working when something does.
fn announce_reach(config: &Config, addr: std::net::SocketAddr, reach: &super::lan::Reach) {
    if addr.ip().is_loopback() {
        return;
    }
    if reach.urls.is_empty() {
        super::announce(
            "WARN",
            &format!(
                "listening on {addr}, but no network address of this machine was found to print; clients reach it only by the names in allowed_hosts"
            ),
        );
        return;
    }
    super::announce(
        "INFO",
        &format!(
            "reach it from a phone or another machine on the same network at {} (allowed hosts; to use a host name instead, add it to allowed_hosts). Anyone on that network can reach the sign-in page: use a network you trust, or a reverse proxy with TLS (docs/deployment.md)",
            reach.urls.join(" ")
        ),
    );
    if config.public_url.starts_with("https://") {
        super::announce(
            "WARN",
            &format!(
                "public_url is {}: the session cookie is then Secure, so signing in over the plain-http addresses above keeps no session; use {} from the phone",
                config.public_url, config.public_url
            ),
        );
    }
}

fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's and tokio's bind do: a restarted server can take its port back at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

pub async fn run(config: &Config) -> anyhow::Result<ExitCode> {
    // A bridge whose folder is missing stops the start, before anything listens.
    for bridge in &config.bridges {
        crate::config::check_bridge_dirs(bridge)?;
    }
    let gate = runtime::open(config).await?;
    for warning in &config.warnings {
        super::announce("WARN", warning);
    }
    let listener = listen(config.listen).with_context(|| {
        format!(
            "could not listen on {} (is another countersign already running? `countersign doctor` checks)",
            config.listen
        )
    })?;
    let addr = listener.local_addr()?;
    // Listening beyond loopback: the addresses a phone on the same network uses.
    let reach = super::lan::reach(addr);
    // The default public URL follows the address actually bound (port 0 picks one; for
    // 0.0.0.0, the first address others reach it at).
    let mut config = config.clone();
    if config.public_url == format!("http://{}", config.listen) {
        config.public_url = match (addr.ip().is_unspecified(), reach.urls.first()) {
            (true, Some(url)) => url.trim_end_matches('/').to_string(),
            _ => format!("http://{addr}"),
        };
        config.notify.public_url = config.public_url.clone();
    }
    let config = &config;
    let shutdown = CancellationToken::new();
    let mut allowed_hosts = config.allowed_hosts.clone();
    for host in &reach.hosts {
        if !allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            allowed_hosts.push(host.clone());
        }
    }
    let http = HttpConfig {
        allowed_hosts,
        operator_tools: config.operator_tools,
        max_body_bytes: config.max_body_bytes,
        public_url: config.public_url.clone(),
        header_timeout: config.server.header_timeout,
        body_timeout: config.server.body_timeout,
        max_connections: config.server.max_connections,
        trusted_proxies: config.server.trusted_proxies.clone(),
    };
    let gateways = gateways(&gate, config)?;
    let operations = operations(&gate, config)?;
    let app = countersign_server::router_with(
        gate.clone(),
        &http,
        shutdown.clone(),
        countersign_server::Mounts {
            gateways: gateways.clone(),
            bridges: config.bridges.clone(),
            operations: operations.clone(),
        },
    );
    if let Some(ops) = operations {
        tokio::spawn(sweep_operations(ops, shutdown.clone()));
    }
    let served: Vec<GatewayService> = gateways.iter().map(|(_, g)| g.clone()).collect();
    for (_, gateway) in gateways {
        tokio::spawn(run_gateway(gate.clone(), gateway, shutdown.clone()));
    }
    super::bridge::spawn_local(&gate, &config.bridges, &shutdown);
    // Slack's interactivity endpoint and the email decision page need the channels.
    let app = countersign_server::with_channels(app, &config.notify)?;
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    tokio::spawn(
        gate.log()
            .clone()
            .run(gate.feed().clone(), shutdown.clone()),
    );
    tokio::spawn(gate.clone().watch_policies(shutdown.clone()));
    if let Some(every) = config.audit_interval {
        tokio::spawn(countersign_server::audit::run(
            gate.clone(),
            every,
            shutdown.clone(),
        ));
    }
    if !config.notify.is_empty() || config.notify.reminders.is_some() {
        let notifier = Arc::new(Notifier::new(gate.clone(), config.notify.clone())?);
        tokio::spawn(notifier.run(gate.feed().clone(), shutdown.clone()));
    }

    super::announce(
        "INFO",
        &format!(
            "countersign {} listening on http://{addr} (data directory {}, signing key {})",
            env!("CARGO_PKG_VERSION"),
            config.data_dir.display(),
            gate.keys().signer().kid()
        ),
    );
    announce_reach(config, addr, &reach);
    if !gate.accounts().has_admin().await? {
        match gate.accounts().setup_link_once(SETUP_SECONDS).await? {
            SetupLink::New(token) => super::announce(
                "INFO",
                &format!(
                    "no admin account yet: create it within {} minutes at {}/setup?token={token}",
                    SETUP_SECONDS / 60,
                    config.public_url
                ),
            ),
            SetupLink::Pending { expires_at } => super::announce(
                "INFO",
                &format!(
                    "no admin account yet: the setup link printed earlier works until {expires_at} (a new one is printed at the first start after that; or `countersign user add --username <name> --role admin` prints an invitation link)"
                ),
            ),
        }
    }
    if gate.list_tokens().await?.iter().all(|t| !t.is_active()) {
        super::announce(
            "INFO",
            "no tokens yet: create one with `countersign token create --role agent --name my-agent` (and --role approver for people who decide)",
        );
    }

    if let Some(metrics) = config.server.metrics_listen {
        let listener = listen(metrics)
            .with_context(|| format!("could not listen on {metrics} ([server] metrics_listen)"))?;
        super::announce(
            "INFO",
            &format!(
                "metrics at http://{}/metrics without a credential ([server] metrics_listen: keep it on a private network)",
                listener.local_addr()?
            ),
        );
        tokio::spawn(countersign_server::serve_with(
            listener,
            countersign_server::http::metrics::metrics_only(gate.clone()),
            shutdown.clone(),
            http.connection_limits(),
        ));
    }

    let signal = shutdown.clone();
    let stopping = gate.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        // Long polls answer with the current state first, so clients retry elsewhere
        // instead of losing their connection.
        stopping.begin_shutdown();
        signal.cancel();
    });
    let server =
        countersign_server::serve_with(listener, app, shutdown.clone(), http.connection_limits());
    tokio::select! {
        () = server => {}
        _ = async { shutdown.cancelled().await; tokio::time::sleep(DRAIN).await } => {
            tracing::warn!("in-flight requests did not finish within {DRAIN:?}; exiting");
        }
    }
    // The outcomes of the gateways' last forwards may still be being written.
    for gateway in &served {
        if !gateway.settle(Duration::from_secs(5)).await {
            tracing::warn!(
                "some outcomes of forwarded calls were not written before stopping; they will be swept as unknown"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How often (at most) the gateways' forwards left without an outcome by a stopped
/// instance are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The `[[gateway]]`s of the config, each served at `/mcp/gateway/<name>` with this
/// server's gate, as the calling agent.
fn gateways(
    gate: &Arc<countersign_server::Gate>,
    config: &Config,
) -> anyhow::Result<Vec<(String, GatewayService)>> {
    let mut out = Vec::new();
    for gateway in &config.gateways {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        let settings = GatewaySettings {
            hold: gateway.hold,
            // Over HTTP the protocol has no sessions: retries of a token's call join.
            session: "http".into(),
            instance: format!(
                "{SERVED_INSTANCE_PREFIX}{}:{}",
                gateway.name,
                hex::encode(random)
            ),
            forward_timeout: gateway.forward_timeout,
        };
        let service =
            GatewayService::new(gateway.upstreams(), Asks::Served(gate.clone()), settings);
        out.push((gateway.name.clone(), service));
    }
    Ok(out)
}

/// `[[process]]`, `[params]` and `[[probe]]`, as the operations this server carries
/// out (the approval-gate profile's process tools, `/api/v1/operate`); none when none
/// is configured.
fn operations(
    gate: &Arc<countersign_server::Gate>,
    config: &Config,
) -> anyhow::Result<Option<Arc<Operations>>> {
    if config.operate.is_empty() {
        return Ok(None);
    }
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(Some(Arc::new(Operations::new(
        gate.clone(),
        Arc::new(config.operate.clone()),
        format!("{SERVED_INSTANCE_PREFIX}operate:{}", hex::encode(random)),
    ))))
}

/// How long after an operation could have finished at the latest its claim is taken
/// as left behind: a live instance records the outcome as soon as the run ends.
pub const OPERATION_MARGIN: Duration = Duration::from_secs(120);

/// Records `unknown` for operations claimed (by this or any instance, `serve` or a
/// CLI command) whose run must have ended and that still have no outcome: whoever
/// claimed them stopped first. At start, then every minute.
async fn sweep_operations(ops: Arc<Operations>, shutdown: CancellationToken) {
    loop {
        match ops.sweep(OPERATION_MARGIN).await {
            Ok(0) => {}
            Ok(swept) => tracing::warn!(
                swept,
                "operations claimed by an instance that stopped before recording their outcome are recorded as unknown"
            ),
            Err(err) => tracing::warn!(%err, "could not sweep the operations"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Connects a gateway's upstreams (one that is down is tried again when a call needs
/// it), records `unknown` for the forwards a stopped instance of it left without an
/// outcome, now and every minute, and stops the upstreams at shutdown.
async fn run_gateway(
    gate: Arc<countersign_server::Gate>,
    gateway: GatewayService,
    shutdown: CancellationToken,
) {
    for upstream in gateway.upstreams() {
        match upstream.peer().await {
            Ok(_) => tracing::info!(upstream = %upstream.name, "gateway upstream connected"),
            Err(reason) => super::announce(
                "WARN",
                &format!("{reason} (tried again when a call needs it)"),
            ),
        }
    }
    let settings = gateway.settings();
    let prefix = settings
        .instance
        .rsplit_once(':')
        .map_or(settings.instance.as_str(), |(head, _)| head);
    let prefix = format!("{prefix}:");
    // A live instance gives up on an upstream after the forward timeout and records the
    // outcome itself; only what is older than that, and a margin more, was left behind.
    let every = SWEEP_EVERY.min(settings.forward_timeout);
    let older_than = settings.forward_timeout + every;
    loop {
        match gate.sweep_served(&prefix, older_than).await {
            Ok(0) => {}
            Ok(swept) => {
                tracing::warn!(swept, gateway = %prefix, "forwards left without an outcome by a stopped instance are recorded as unknown")
            }
            Err(err) => tracing::warn!(%err, "could not sweep the gateway's forwards"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(every) => {}
        }
    }
    for upstream in gateway.upstreams() {
        upstream.close().await;
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
