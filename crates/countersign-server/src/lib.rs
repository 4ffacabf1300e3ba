//! countersign's services: the [`Gate`] (the one place requests are created, decided and
//! consumed), the REST API, the MCP adapter, and the HTTP server that puts them together.

pub mod accounts;
pub mod auth;
pub mod error;
pub mod gate;
pub mod guard;
pub mod http_server;
pub mod keyring;
pub mod log;
pub mod mcp;
pub mod notify;
pub mod rest;
pub mod rooms;
pub mod rooms_api;
pub mod ui;
pub mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use error::GateError;
pub use gate::{Decider, Gate, Settings};
pub use http_server::serve;
pub use keyring::KeyRing;
pub use log::TransparencyLog;
pub use mcp::{Identity, McpService};

/// How the HTTP server is exposed.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Hosts (and `host:port`s) this server answers to; see [`guard::HostPolicy`].
    pub allowed_hosts: Vec<String>,
    /// Whether approvers get the operator tools over MCP.
    pub operator_tools: bool,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// How people reach this server (for links in invitations and emails), e.g.
    /// `https://approvals.example.com`.
    pub public_url: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            operator_tools: false,
            max_body_bytes: 1024 * 1024,
            public_url: "http://127.0.0.1:8787".into(),
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub gate: Arc<Gate>,
    pub hosts: Arc<guard::HostPolicy>,
    pub public_url: String,
    pub throttle: Arc<ui::Throttle>,
}

/// The whole HTTP surface: `/mcp`, `/api/v1`, `/healthz`, `/.well-known/jwks.json`.
pub fn router(gate: Arc<Gate>, config: &HttpConfig, shutdown: CancellationToken) -> Router {
    let state = AppState {
        gate: gate.clone(),
        hosts: Arc::new(guard::HostPolicy::new(&config.allowed_hosts)),
        public_url: config.public_url.clone(),
        throttle: Arc::new(ui::Throttle::default()),
    };
    // Built once: every stateless request gets a cheap clone.
    let mcp_service = McpService::new(gate.clone(), Identity::PerRequest, config.operator_tools);
    // Stateless: every request carries its own credentials and no session lives in
    // memory, so any instance behind a load balancer can serve any call.
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_cancellation_token(shutdown.child_token())
        .with_max_request_body_bytes(config.max_body_bytes)
        // Host and Origin are checked for every route by `guard`.
        .disable_allowed_hosts();
    let mcp = StreamableHttpService::new(
        move || Ok(mcp_service.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let authenticated = Router::new()
        .nest("/api/v1", rest::api_routes().merge(rooms_api::api_routes()))
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .merge(rest::public_routes())
        .merge(authenticated)
        .merge(
            ui::routes()
                .merge(rooms_api::ui_routes())
                .layer(axum::middleware::from_fn(ui::security_headers)),
        )
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check_host_and_origin,
        ))
        .with_state(state)
}

async fn not_found(uri: http::Uri) -> impl IntoResponse {
    (
        http::StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({
            "error": {"code": "not_found", "message": format!("no route for {}", uri.path())}
        })),
    )
}
