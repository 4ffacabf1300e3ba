//! Helpers for driving the real `countersign` binary: one-shot commands, a `serve`
//! process on port 0, stdio MCP clients, and HTTP calls. Every child is killed when its
//! guard drops, so a failing test leaves no process behind. `postgres` gives a test a
//! database of its own; `tools` finds Python and the repository's scripts.

pub mod postgres;
mod tools;

pub use tools::{PYTHON_SETUP, in_ci, python, python_with, repo_root, skip};

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_countersign")
}

/// `COUNTERSIGN_*` variables of the test process: the binary refuses unknown ones, and
/// known ones would change what the children do, so none reaches a child.
fn inherited_countersign_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("COUNTERSIGN_"))
        .collect()
}

/// A `countersign` command with a clean environment and no `--data-dir`.
pub fn bare_command() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin());
    for key in inherited_countersign_vars() {
        cmd.env_remove(key);
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// A `countersign --data-dir DIR ARGS...` command.
pub fn command(data_dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = bare_command();
    cmd.arg("--data-dir").arg(data_dir).args(args);
    cmd
}

/// What a finished command printed, and its exit code.
#[derive(Debug, Clone)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

pub async fn output(mut cmd: tokio::process::Command) -> Output {
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("countersign did not finish within 30 s")
        .expect("could not run countersign");
    Output {
        // A signal leaves no code; -1 keeps "it failed" visible.
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `countersign --data-dir DIR ARGS...` to completion.
pub async fn run(data_dir: &Path, args: &[&str]) -> Output {
    output(command(data_dir, args)).await
}

/// Runs a command that must succeed and returns its stdout.
pub async fn run_ok(data_dir: &Path, args: &[&str]) -> String {
    let out = run(data_dir, args).await;
    assert!(out.ok(), "countersign {args:?} failed:\n{out}");
    out.stdout
}

/// Creates a token and returns its secret (the one line `token create` prints).
pub async fn create_token(data_dir: &Path, role: &str, name: &str) -> String {
    let stdout = run_ok(
        data_dir,
        &["token", "create", "--role", role, "--name", name],
    )
    .await;
    stdout.trim().to_string()
}

/// Lets `countersign approve|reject` run without a terminal in this data directory.
pub fn allow_unattended_cli(data_dir: &Path) {
    std::fs::create_dir_all(data_dir).expect("create the data dir");
    std::fs::write(
        data_dir.join("countersign.toml"),
        "[cli]\nunattended_decisions = true\n",
    )
    .expect("write countersign.toml");
}

/// The OS user the binary acts as for CLI decisions.
pub fn os_user() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("run id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A running `countersign serve`. Killed (SIGKILL) and reaped on drop.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub base: String,
    stderr: Arc<Mutex<String>>,
    http: reqwest::Client,
}

impl Server {
    /// `countersign serve --listen 127.0.0.1:0 --data-dir DIR`.
    pub fn start(data_dir: &Path) -> Server {
        let mut cmd = std_command();
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir);
        Self::spawn(cmd)
    }

    /// Starts `cmd` (a `serve` command) and waits for its `listening on` line.
    pub fn spawn(mut cmd: std::process::Command) -> Server {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn countersign serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                // Logged before it is announced, so the log always holds the address line.
                if let Ok(mut log) = sink.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
                if let Some(addr) = line
                    .split_once("listening on http://")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "countersign serve did not print its address (exit {status:?}); stderr:\n{}",
                    log.lock().map(|l| l.clone()).unwrap_or_default()
                );
            }
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client");
        Server {
            child,
            addr,
            base: format!("http://{addr}"),
            stderr: log,
            http,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Waits up to `within` for the process to exit by itself; its status if it did.
    pub fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no graceful shutdown, as in a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        send(req).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url(path)).json(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        send(req).await
    }

    /// `GET /api/v1/requests/{id}` as `token`, which must succeed: the request's view.
    pub async fn request_view(&self, token: &str, id: &str) -> serde_json::Value {
        let (status, body) = self
            .get(&format!("/api/v1/requests/{id}"), Some(token))
            .await;
        assert_eq!(status, StatusCode::OK, "GET request {id}: {body}");
        body
    }

    /// Creates a request as `agent_token` and returns its id.
    pub async fn create_request(&self, agent_token: &str, body: &Value) -> String {
        let (status, json) = self.post("/api/v1/requests", Some(agent_token), body).await;
        assert_eq!(status, StatusCode::CREATED, "create request: {json}");
        json["request_id"].as_str().expect("request_id").to_string()
    }

    /// A decision by `approver_token` over REST.
    pub async fn decide(
        &self,
        id: &str,
        approver_token: &str,
        decision: &str,
    ) -> (StatusCode, Value) {
        self.post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(approver_token),
            &serde_json::json!({"decision": decision}),
        )
        .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The stable code of an error answer (`{"error": {"code"}}`).
pub fn error_code(body: &serde_json::Value) -> &str {
    body["error"]["code"]
        .as_str()
        .or_else(|| body["code"].as_str())
        .unwrap_or_default()
}

pub async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.expect("HTTP request failed");
    let status = resp.status();
    let text = resp.text().await.expect("HTTP body");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

fn std_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(bin());
    for key in inherited_countersign_vars() {
        cmd.env_remove(key);
    }
    cmd
}

/// A `serve` command without flags, for configuring through the environment.
pub fn serve_command() -> std::process::Command {
    let mut cmd = std_command();
    cmd.arg("serve");
    cmd
}

pub type McpClient = RunningService<RoleClient, ()>;

/// Launches `countersign mcp --data-dir DIR [--agent-name NAME]` through rmcp's
/// child-process transport and completes the MCP handshake.
pub async fn mcp(data_dir: &Path, agent_name: Option<&str>) -> McpClient {
    let mut cmd = command(data_dir, &["mcp"]);
    if let Some(name) = agent_name {
        cmd.arg("--agent-name").arg(name);
    }
    let (transport, _stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn countersign mcp");
    tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed")
}

/// Calls a tool. `Ok` holds its structured result; `Err` the text of a tool error.
pub async fn call(peer: &Peer<RoleClient>, tool: &str, args: Value) -> Result<Value, String> {
    let Value::Object(args) = args else {
        panic!("tool arguments must be an object")
    };
    let result = peer
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: the MCP call failed: {e}"));
    let text: String = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        return Err(text);
    }
    Ok(result
        .structured_content
        .unwrap_or_else(|| serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

/// The statement inside a DSSE envelope: base64 (standard, padded) → JSON.
pub fn statement(envelope: &Value) -> Value {
    let payload = envelope["payload"].as_str().expect("payload");
    let bytes = STANDARD
        .decode(payload)
        .expect("payload is standard base64");
    serde_json::from_slice(&bytes).expect("payload is JSON")
}

/// Writes `value` as JSON to `dir/name` and returns the path.
pub fn write_json(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value).expect("json")).expect("write file");
    path
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}
