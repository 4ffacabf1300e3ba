//! The upstream MCP servers a gateway fronts, and how each is reached: a child process
//! over stdio, or a server over Streamable HTTP. An upstream is connected when first
//! needed and again after its connection went away (a child that exited, a server that
//! restarted), at most once per [`RETRY_AFTER`] after a failure, so that an upstream that
//! is down answers at once instead of making every call wait for a connect. Its tools
//! are listed at each connect and cached.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{ServerCapabilities, Tool};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ErrorData, RoleClient, ServiceExt};
use tokio::sync::{Mutex, RwLock};

/// How long a connect (process start or HTTP, and the MCP handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long after a failed connect the next call fails at once with the same reason.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);
/// The variables a child upstream started from the config gets from this process's
/// environment (the rest of it, the server's own secrets among them, is not passed on).
const BASIC_ENV: [&str; 11] = [
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL",
    "TERM",
];

/// How an upstream is reached.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout (its stderr is this
    /// process's).
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// Its working directory (default: this process's).
        cwd: Option<PathBuf>,
        /// Variables set for it.
        env: BTreeMap<String, String>,
        /// Whether it gets this process's whole environment (a gateway the agent's client
        /// launched: the same user's) or only [`BASIC_ENV`] (an upstream of `serve`,
        /// whose environment may hold the server's secrets).
        inherit_env: bool,
    },
    /// A Streamable HTTP MCP endpoint.
    Http {
        url: String,
        /// Sent as `Authorization: Bearer <token>`.
        bearer_token: Option<String>,
        /// Other headers sent with every request.
        headers: BTreeMap<String, String>,
    },
}

impl std::fmt::Debug for Transport {
    /// Without the bearer token or the headers' values, which may be secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio {
                command,
                cwd,
                env,
                inherit_env,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("cwd", cwd)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("inherit_env", inherit_env)
                .finish(),
            Transport::Http {
                url,
                bearer_token,
                headers,
            } => f
                .debug_struct("Http")
                .field("url", url)
                .field("bearer_token", &bearer_token.as_ref().map(|_| "***"))
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl Transport {
    /// Where it is, for messages (never the token).
    pub fn describe(&self) -> String {
        match self {
            Transport::Stdio { command, .. } => format!("`{}`", command.join(" ")),
            Transport::Http { url, .. } => url.clone(),
        }
    }
}

/// One upstream MCP server, as a gateway fronts it.
pub struct Upstream {
    pub name: String,
    /// Its `readOnlyHint` is believed: a read-only tool passes when no policy speaks.
    pub trusted: bool,
    transport: Transport,
    current: std::sync::RwLock<Option<Connected>>,
    /// Held while connecting, so that one call connects and the others wait for it.
    connecting: Mutex<Option<(Instant, String)>>,
    tools: RwLock<Vec<Tool>>,
}

struct Connected {
    service: Arc<RunningService<RoleClient, ()>>,
    capabilities: ServerCapabilities,
}

impl Connected {
    fn is_live(&self) -> bool {
        !self.service.is_closed() && !self.service.peer().is_transport_closed()
    }
}

impl Upstream {
    /// An upstream reached through `transport`, not connected yet.
    pub fn new(name: String, trusted: bool, transport: Transport) -> Self {
        Self {
            name,
            trusted,
            transport,
            current: std::sync::RwLock::new(None),
            connecting: Mutex::new(None),
            tools: RwLock::new(Vec::new()),
        }
    }

    /// An upstream connected now (its tools listed), or why it could not be.
    pub async fn connected(
        name: String,
        trusted: bool,
        transport: Transport,
    ) -> Result<Self, String> {
        let upstream = Self::new(name, trusted, transport);
        upstream.peer().await?;
        Ok(upstream)
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// What it said it can do when it was last connected.
    pub fn capabilities(&self) -> Option<ServerCapabilities> {
        self.current
            .read()
            .ok()?
            .as_ref()
            .map(|c| c.capabilities.clone())
    }

    fn live(&self) -> Option<Peer<RoleClient>> {
        let current = self.current.read().ok()?;
        current
            .as_ref()
            .filter(|c| c.is_live())
            .map(|c| c.service.peer().clone())
    }

    /// The connection to the upstream: the live one, else a new one.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        if let Some(peer) = self.live() {
            return Ok(peer);
        }
        let mut failed = self.connecting.lock().await;
        if let Some(peer) = self.live() {
            return Ok(peer);
        }
        if let Some((at, reason)) = failed.as_ref()
            && at.elapsed() < RETRY_AFTER
        {
            return Err(reason.clone());
        }
        match self.connect().await {
            Ok(peer) => {
                *failed = None;
                Ok(peer)
            }
            Err(reason) => {
                tracing::warn!(upstream = %self.name, %reason, "upstream unavailable");
                *failed = Some((Instant::now(), reason.clone()));
                Err(reason)
            }
        }
    }

    async fn connect(&self) -> Result<Peer<RoleClient>, String> {
        let name = &self.name;
        let service = tokio::time::timeout(CONNECT_TIMEOUT, start(&self.transport))
            .await
            .map_err(|_| {
                format!(
                    "upstream {name} ({}) did not complete the MCP handshake in {} s",
                    self.transport.describe(),
                    CONNECT_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("upstream {name} ({}): {e}", self.transport.describe()))?;
        let tools = tokio::time::timeout(CONNECT_TIMEOUT, service.list_all_tools())
            .await
            .map_err(|_| format!("upstream {name} did not list its tools in time"))?
            .map_err(|e| format!("upstream {name}: could not list its tools: {e}"))?;
        let capabilities = service
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default();
        let peer = service.peer().clone();
        *self.tools.write().await = tools;
        let old = self
            .current
            .write()
            .map_err(|_| "upstream state poisoned".to_string())?
            .replace(Connected {
                service: Arc::new(service),
                capabilities,
            });
        drop(old);
        tracing::info!(upstream = %name, "upstream connected");
        Ok(peer)
    }

    /// Its tools, listed again now.
    pub async fn refresh(&self) -> Result<Vec<Tool>, ErrorData> {
        let unavailable = |e: String| ErrorData::internal_error(e, None);
        let peer = self.peer().await.map_err(unavailable)?;
        let tools = peer
            .list_all_tools()
            .await
            .map_err(|e| unavailable(format!("upstream {}: {e}", self.name)))?;
        *self.tools.write().await = tools.clone();
        Ok(tools)
    }

    /// Its tool `name`, from the cache or, when not there, as listed now.
    pub async fn tool(&self, name: &str) -> Result<Option<Tool>, ErrorData> {
        if let Some(tool) = self.tools.read().await.iter().find(|t| t.name == name) {
            return Ok(Some(tool.clone()));
        }
        Ok(self.refresh().await?.into_iter().find(|t| t.name == name))
    }

    /// Stops the upstream (for a child process: closes its stdin, then kills it).
    pub async fn close(&self) {
        let current = self.current.write().ok().and_then(|mut c| c.take());
        if let Some(connected) = current {
            connected.service.cancellation_token().cancel();
        }
    }
}

async fn start(transport: &Transport) -> Result<RunningService<RoleClient, ()>, String> {
    match transport {
        Transport::Stdio {
            command,
            cwd,
            env,
            inherit_env,
        } => {
            let (program, rest) = command
                .split_first()
                .ok_or_else(|| "no command to start".to_string())?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(rest);
            if !inherit_env {
                cmd.env_clear();
                for name in BASIC_ENV {
                    if let Some(value) = std::env::var_os(name) {
                        cmd.env(name, value);
                    }
                }
            }
            cmd.envs(env);
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            let transport = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .map_err(|e| format!("could not start {program:?}: {e}"))?
                .0;
            ().serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))
        }
        Transport::Http {
            url,
            bearer_token,
            headers,
        } => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(token) = bearer_token {
                config = config.auth_header(token.clone());
            }
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = http::HeaderName::try_from(name.as_str())
                    .map_err(|e| format!("header {name:?}: {e}"))?;
                let value = http::HeaderValue::try_from(value.as_str())
                    .map_err(|e| format!("header {name}: {e}"))?;
                custom.insert(name, value);
            }
            config = config.custom_headers(custom);
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))
        }
    }
}
