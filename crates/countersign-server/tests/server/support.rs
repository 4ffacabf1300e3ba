//! A server on port 0 with its own data directory, tokens for each role, and clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use countersign_core::{Principal, Role, SystemClock};
use countersign_server::{Gate, HttpConfig, Settings};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientRequest, Request, ServerResult};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub struct TestServer {
    pub base: String,
    pub gate: Arc<Gate>,
    pub agent: String,
    pub agent2: String,
    pub approver: String,
    pub approver2: String,
    pub admin: String,
    /// An executor's token (`payments`): it may verify and redeem proofs, nothing else.
    pub executor: String,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn start() -> TestServer {
    start_with(HttpConfig::default()).await
}

pub async fn start_with(config: HttpConfig) -> TestServer {
    start_full(config, Settings::default()).await
}

pub async fn start_full(config: HttpConfig, settings: Settings) -> TestServer {
    start_inner(config, settings, Arc::new(SystemClock)).await
}

/// A server whose gate reads the time from `clock` (e.g. a `FixedClock` the test moves).
pub async fn start_clocked(clock: Arc<dyn countersign_core::Clock>) -> TestServer {
    start_clocked_with(clock, Settings::default()).await
}

pub async fn start_clocked_with(
    clock: Arc<dyn countersign_core::Clock>,
    settings: Settings,
) -> TestServer {
    start_inner(HttpConfig::default(), settings, clock).await
}

async fn start_inner(
    config: HttpConfig,
    settings: Settings,
    clock: Arc<dyn countersign_core::Clock>,
) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("countersign.db")).unwrap());
    let gate = Gate::builder(store, dir.path().join("keys"))
        .clock(clock)
        .log_origin("countersign/test")
        .settings(settings)
        .build()
        .await
        .unwrap();
    let setup = Principal::local_user("test-setup", Role::Admin);
    let token = |name: &'static str, role| {
        let gate = gate.clone();
        let setup = setup.clone();
        async move { gate.create_token(name, role, &setup).await.unwrap().1 }
    };
    let agent = token("deploy-bot", Role::Agent).await;
    let agent2 = token("other-bot", Role::Agent).await;
    let approver = token("alice", Role::Approver).await;
    let approver2 = token("bob", Role::Approver).await;
    let admin = token("root", Role::Admin).await;
    let executor = token("payments", Role::Executor).await;

    let shutdown = CancellationToken::new();
    let app = countersign_server::router(gate.clone(), &config, shutdown.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    tokio::spawn(
        gate.log()
            .clone()
            .run(gate.feed().clone(), shutdown.clone()),
    );
    tokio::spawn(countersign_server::serve_with(
        listener,
        app,
        shutdown.clone(),
        config.connection_limits(),
    ));
    TestServer {
        base: format!("http://{addr}"),
        gate,
        agent,
        agent2,
        approver,
        approver2,
        admin,
        executor,
        http: reqwest::Client::new(),
        shutdown,
        _dir: dir,
    }
}

impl TestServer {
    /// The data directory (the SQLite file is `countersign.db` in it).
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Creates a request as `token` over REST; returns its id.
    pub async fn create(&self, token: &str, body: Value) -> String {
        let (status, created) = self.post("/api/v1/requests", token, body).await;
        assert_eq!(status, 201, "{created}");
        created["request_id"].as_str().unwrap().to_string()
    }

    pub async fn create_default(&self) -> String {
        self.create(
            &self.agent,
            json!({"action_description": "Pay invoice INV-7", "action_details": {"amount": "120.00", "currency": "EUR"}}),
        )
        .await
    }

    pub async fn decide(&self, token: &str, id: &str, decision: &str) -> (u16, Value) {
        self.post(
            &format!("/api/v1/requests/{id}/decision"),
            token,
            json!({"decision": decision}),
        )
        .await
    }

    pub async fn mcp(&self, token: &str) -> McpClient {
        McpClient::connect(&self.url("/mcp"), token).await
    }

    /// Every stored event kind, in order.
    pub async fn event_kinds(&self) -> Vec<String> {
        self.gate
            .store()
            .events_after(0, 100_000)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.entry.kind.as_str().to_string())
            .collect()
    }
}

/// A browser-like client with a cookie jar.
pub fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Accepts a setup or invitation link with `body` in a new browser; returns it, signed
/// in, and its `/ui/api/me` (the account and the page's `csrf_token`).
pub async fn accept(server: &TestServer, body: Value) -> (reqwest::Client, Value) {
    let client = browser();
    let resp = client
        .post(server.url("/ui/accept"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let me: Value = client
        .get(server.url("/ui/api/me"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (client, me)
}

/// An MCP client that counts the progress notifications it receives.
#[derive(Clone, Default)]
pub struct CountingClient {
    pub progress: Arc<AtomicUsize>,
}

impl ClientHandler for CountingClient {
    async fn on_progress(
        &self,
        _params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }
}

pub struct McpClient {
    pub service: RunningService<RoleClient, CountingClient>,
    pub progress: Arc<AtomicUsize>,
}

impl McpClient {
    pub async fn connect(url: &str, token: &str) -> Self {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url.to_string())
                .auth_header(token.to_string()),
        );
        let handler = CountingClient::default();
        let progress = handler.progress.clone();
        let service = handler.serve(transport).await.unwrap();
        Self { service, progress }
    }

    pub async fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .service
            .list_all_tools()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        names.sort();
        names
    }

    pub async fn call(&self, name: &'static str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        self.service
            .call_tool(CallToolRequestParams::new(name).with_arguments(args))
            .await
            .unwrap()
    }

    /// Calls a tool with a progress token attached, so the server may report progress.
    pub async fn call_with_progress(&self, name: &'static str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        let handle = self
            .service
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(
                    CallToolRequestParams::new(name).with_arguments(args),
                )),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        match handle.await_response().await.unwrap() {
            ServerResult::CallToolResult(result) => result,
            other => panic!("unexpected response {other:?}"),
        }
    }
}

/// The structured result of a successful tool call.
pub fn ok(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "tool failed: {}", text(result));
    result
        .structured_content
        .clone()
        .expect("structured content")
}

/// The text of a failed tool call.
pub fn err(result: &CallToolResult) -> String {
    assert_eq!(
        result.is_error,
        Some(true),
        "expected a tool error, got {result:?}"
    );
    text(result)
}

pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}
