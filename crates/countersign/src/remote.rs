//! The remote client: `proxy`, `hook`, `exec` and `mcp` against a running `serve`
//! instead of a local data directory (`--server URL --token-file FILE`, also
//! `COUNTERSIGN_SERVER` and `COUNTERSIGN_TOKEN_FILE`). The held-call flow
//! ([`countersign_server::held`]) runs here unchanged over [`Remote`], which speaks the
//! REST API's `/api/v1/gateway` routes; `mcp --server` relays a stdio MCP client to the
//! server's `/mcp` ([`relay`]). docs/gateway.md.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use clap::Args;
use countersign_core::evidence::OutcomeStatus;
use countersign_server::gate::GatewayCall;
use countersign_server::held::{
    Approvals, CallBody, ClaimBody, ForwardedBody, Ruling, SweepBody, Swept,
};
use countersign_server::views::ApprovalView;
use countersign_server::{ErrorKind, GateError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// How long a call to the server may take beyond the time it was asked to wait.
const SLACK: Duration = Duration::from_secs(30);
/// The most one relayed message may hold.
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, Args)]
pub struct RemoteArgs {
    /// Ask a running `countersign serve` at this URL (e.g. https://gate.example.com)
    /// instead of opening a local data directory. Also COUNTERSIGN_SERVER.
    #[arg(long, env = "COUNTERSIGN_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// The file that holds the bearer token for --server. Also COUNTERSIGN_TOKEN_FILE.
    #[arg(long, env = "COUNTERSIGN_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// The one token a token file holds (surrounding whitespace aside).
pub fn read_token_file(file: &std::path::Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(file)
        .with_context(|| format!("could not read the token file {}", file.display()))?
        .trim()
        .to_string();
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!(
            "the token file {} must hold one token and nothing else",
            file.display()
        );
    }
    Ok(token)
}

/// A running `serve`, asked with one token.
#[derive(Clone)]
pub struct Remote {
    base: reqwest::Url,
    token: String,
    http: reqwest::Client,
}

impl Remote {
    /// The server the arguments name, or `None` for a local data directory. `agent_name`
    /// (the local form's) is refused with a server: there the token names the agent.
    pub fn from_args(args: &RemoteArgs, agent_name: Option<&str>) -> anyhow::Result<Option<Self>> {
        let Some(server) = &args.server else {
            if args.token_file.is_some() {
                anyhow::bail!("--token-file is for --server (COUNTERSIGN_SERVER): give both");
            }
            return Ok(None);
        };
        if agent_name.is_some() {
            anyhow::bail!(
                "--agent-name is for a local data directory; with --server the token names the agent"
            );
        }
        let file = args.token_file.as_ref().context(
            "--server needs a token: --token-file FILE (or COUNTERSIGN_TOKEN_FILE), a file that holds it",
        )?;
        let token = read_token_file(file)?;
        Self::with_token(server, token).map(Some)
    }

    /// The server at `server`, asked with `token` (checked like a token file's).
    pub fn with_token(server: &str, token: String) -> anyhow::Result<Self> {
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            anyhow::bail!("the token must be one token and nothing else");
        }
        let mut base = reqwest::Url::parse(server)
            .with_context(|| format!("--server {server:?} is not a URL"))?;
        if !matches!(base.scheme(), "http" | "https") || base.host().is_none() {
            anyhow::bail!("--server {server:?}: give an http:// or https:// URL");
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("countersign/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("could not build the HTTP client")?;
        Ok(Self { base, token, http })
    }

    /// The server, for logs (never the token).
    pub fn describe(&self) -> String {
        format!("the server at {}", self.base)
    }

    /// `GET path`, answered within `wait` and some slack.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        wait: Duration,
    ) -> Result<T, GateError> {
        self.send::<(), T>(reqwest::Method::GET, path, None, wait)
            .await
    }

    /// `POST path` with `body`, answered within `wait` and some slack.
    pub async fn post_json<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        wait: Duration,
    ) -> Result<T, GateError> {
        self.send(reqwest::Method::POST, path, Some(body), wait)
            .await
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, GateError> {
        self.base
            .join(path)
            .map_err(|e| GateError::BadInput(format!("{path}: {e}")))
    }

    /// Sends `body` (or nothing) to `path` and reads the answer, within `wait` + slack.
    async fn send<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        wait: Duration,
    ) -> Result<T, GateError> {
        let mut request = self
            .http
            .request(method, self.url(path)?)
            .bearer_auth(&self.token)
            .timeout(wait + SLACK);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let text = response.text().await.map_err(unreachable)?;
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|e| {
                GateError::Internal(format!(
                    "the server's answer to {path} is not understood: {e}"
                ))
            });
        }
        Err(answered(status, &text))
    }
}

fn unreachable(err: reqwest::Error) -> GateError {
    GateError::Remote {
        kind: ErrorKind::Unavailable,
        message: format!("the countersign server did not answer: {err}"),
    }
}

/// The server's error, `{"error": {"code", "message"}}`, as the kind it names.
fn answered(status: reqwest::StatusCode, text: &str) -> GateError {
    let body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str();
    let message = body["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("the server answered {status}"));
    let kind = code
        .and_then(ErrorKind::from_code)
        .unwrap_or(match status.as_u16() {
            400 => ErrorKind::InvalidInput,
            401 => ErrorKind::Unauthenticated,
            403 => ErrorKind::Forbidden,
            404 => ErrorKind::NotFound,
            429 => ErrorKind::RateLimited,
            503 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        });
    GateError::Remote { kind, message }
}

#[async_trait]
impl Approvals for Remote {
    async fn call(&self, call: &GatewayCall) -> Result<Ruling, GateError> {
        let body = CallBody::new(call);
        self.send(
            reqwest::Method::POST,
            "api/v1/gateway/calls",
            Some(&body),
            Duration::ZERO,
        )
        .await
    }

    async fn wait(&self, id: &str, timeout: Duration) -> Result<ApprovalView, GateError> {
        // Whole seconds, rounded up: a wait of 0 would return at once and spin.
        let seconds = timeout.as_secs_f64().ceil().max(1.0) as u64;
        self.send::<(), _>(
            reqwest::Method::GET,
            &format!("api/v1/gateway/calls/{id}/wait?timeout_seconds={seconds}"),
            None,
            Duration::from_secs(seconds),
        )
        .await
    }

    async fn cancel(&self, id: &str) -> Result<(), GateError> {
        self.send::<_, Value>(
            reqwest::Method::POST,
            &format!("api/v1/gateway/calls/{id}/cancel"),
            Some(&json!({})),
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }

    async fn claim(&self, id: &str, instance: &str) -> Result<(), GateError> {
        let body = ClaimBody {
            instance: instance.to_string(),
        };
        self.send::<_, Value>(
            reqwest::Method::POST,
            &format!("api/v1/gateway/calls/{id}/claim"),
            Some(&body),
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }

    async fn sweep(&self, upstream: &str, older_than: Duration) -> Result<usize, GateError> {
        let body = SweepBody {
            upstream: upstream.to_string(),
            older_than_seconds: older_than.as_secs(),
        };
        let swept: Swept = self
            .send(
                reqwest::Method::POST,
                "api/v1/gateway/sweep",
                Some(&body),
                Duration::ZERO,
            )
            .await?;
        Ok(swept.swept)
    }

    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
    ) -> Result<(), GateError> {
        let body = ForwardedBody { status, summary };
        self.send::<_, Value>(
            reqwest::Method::POST,
            &format!("api/v1/gateway/calls/{id}/outcome"),
            Some(&body),
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }
}

/// `countersign mcp --server URL`: relays a stdio MCP client to the server's `/mcp` (or
/// `path`: a profile's), message by message, as the token's principal. Each request is one POST; the server's
/// answer (JSON, or an event stream with progress notifications before the result) is
/// written back line by line. A `notifications/cancelled` closes the POST of the request
/// it names, which is how the server (stateless: any instance serves any call) learns
/// that the client gave up. Ends when the client closes stdin.
pub async fn relay(remote: Remote, path: &str) -> anyhow::Result<()> {
    let endpoint = remote.url(path).map_err(anyhow::Error::msg)?;
    let (out, mut lines_out) = tokio::sync::mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines_out.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err()
                || stdout.write_all(b"\n").await.is_err()
                || stdout.flush().await.is_err()
            {
                break;
            }
        }
    });
    let session = Arc::new(Session::default());
    let mut inflight: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await.context("could not read stdin")? {
        if line.trim().is_empty() {
            continue;
        }
        inflight.retain(|_, task| !task.is_finished());
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(err) => {
                let _ = out.send(
                    json!({"jsonrpc": "2.0", "id": null,
                           "error": {"code": -32700, "message": format!("parse error: {err}")}})
                    .to_string(),
                );
                continue;
            }
        };
        if message["method"] == "notifications/cancelled" {
            if let Some(task) = inflight.remove(&message["params"]["requestId"].to_string()) {
                task.abort();
            }
            continue;
        }
        let id = message
            .get("id")
            .filter(|_| message.get("method").is_some());
        let post = Post {
            remote: remote.clone(),
            endpoint: endpoint.clone(),
            session: session.clone(),
            out: out.clone(),
        };
        match id {
            // A request: its answer comes back on its own POST, possibly much later.
            Some(id) => {
                let key = id.to_string();
                let id = id.clone();
                let task = tokio::spawn(async move {
                    if let Err(message) = post.request(&line).await {
                        let _ = post.out.send(
                            json!({"jsonrpc": "2.0", "id": id,
                                   "error": {"code": -32603, "message": message}})
                            .to_string(),
                        );
                    }
                });
                inflight.insert(key, task.abort_handle());
            }
            // A notification or a response: sent in order, nothing comes back.
            None => {
                if let Err(message) = post.request(&line).await {
                    tracing::warn!(%message, "a notification was not relayed");
                }
            }
        }
    }
    for task in inflight.values() {
        task.abort();
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

/// What the server said of the session: its id, if it gives one, and the protocol
/// version it chose.
#[derive(Default)]
struct Session {
    id: std::sync::Mutex<Option<String>>,
    version: std::sync::Mutex<Option<String>>,
}

struct Post {
    remote: Remote,
    endpoint: reqwest::Url,
    session: Arc<Session>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Post {
    /// POSTs one message and writes back what the server answers; the error's message,
    /// for the client, if it could not.
    async fn request(&self, line: &str) -> Result<(), String> {
        let mut request = self
            .remote
            .http
            .post(self.endpoint.clone())
            .bearer_auth(&self.remote.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .body(line.to_string());
        if let Some(id) = self
            .session
            .id
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
        {
            request = request.header("mcp-session-id", id);
        }
        if let Some(version) = self
            .session
            .version
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
        {
            request = request.header("mcp-protocol-version", version);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| format!("the countersign server did not answer: {e}"))?;
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            && let Ok(mut session) = self.session.id.lock()
        {
            *session = Some(id.to_string());
        }
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(answered(status, &text).public_message());
        }
        let event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !event_stream {
            let text = response
                .text()
                .await
                .map_err(|e| format!("the server's answer broke off: {e}"))?;
            if !text.trim().is_empty() {
                self.emit(text.trim());
            }
            return Ok(());
        }
        // Server-sent events: each event's data lines are one JSON-RPC message.
        let mut buffer = Vec::new();
        let mut data = String::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("the server's answer broke off: {e}"))?
        {
            buffer.extend_from_slice(&chunk);
            if buffer.len() > MAX_MESSAGE_BYTES {
                return Err("the server's answer is too large to relay".into());
            }
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\r', '\n']);
                if line.is_empty() {
                    if !data.is_empty() {
                        self.emit(&data);
                        data.clear();
                    }
                } else if let Some(value) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(value.strip_prefix(' ').unwrap_or(value));
                }
            }
        }
        if !data.is_empty() {
            self.emit(&data);
        }
        Ok(())
    }

    /// Writes one message to the client, noting the protocol version an initialize
    /// result chose.
    fn emit(&self, text: &str) {
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            tracing::warn!("the server sent a message that is not JSON; dropped");
            return;
        };
        if let Some(version) = message["result"]["protocolVersion"].as_str()
            && let Ok(mut session) = self.session.version.lock()
        {
            *session = Some(version.to_string());
        }
        let _ = self.out.send(message.to_string());
    }
}
