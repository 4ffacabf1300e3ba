//! The inbound HTTP surface: every route, in the tables below, and the state handlers
//! share. One file of handlers per surface: `rest` (`/api/v1`, bearer tokens), `ui`
//! (the dashboard's pages and its JSON under `/ui/api`, sessions), `rooms` (served on
//! both), `slack` (Slack's signed clicks), `email_links` (the one-time decision pages),
//! and MCP at `/mcp` (`crate::mcp`). Authentication (`auth`), the Host/Origin guard
//! (`guard`) and the error mapping (`error`) are written once for all of them.

/// Declares a JSON body or a query string a handler takes. Unknown fields are refused,
/// so a typo is a clear 400 rather than a silently ignored setting.
macro_rules! input {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $name { $($(#[$fmeta])* $field: $ty),* }
    };
}

pub mod auth;
mod check;
pub mod client;
mod email_links;
pub mod error;
mod gateway;
pub mod guard;
pub mod metrics;
mod operate;
mod rest;
mod rooms;
mod server;
mod slack;
pub mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use check::{AsyncCheckLayer, CheckLayer};
use countersign_core::Scope;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::bridge::BridgeConfig;
use crate::error::GateError;
use crate::gate::Gate;
use crate::mcp::approval_gate::{self, ApprovalGateService};
use crate::mcp::chatroom;
use crate::mcp::gateway::GatewayService;
use crate::mcp::looppause::{self, LoopPauseService};
use crate::mcp::{Identity, McpService};
use crate::notify::NotifyConfig;
use crate::operate::Operations;

pub use server::{ConnectionLimits, serve, serve_with};

/// Where `countersign serve` listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// The smallest `max_body_bytes` allowed: less would refuse ordinary requests.
pub const MIN_BODY_BYTES: usize = 1024;

/// How the HTTP server is exposed. `HttpConfig::default()` states each default once;
/// the binary's config starts from it.
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
    /// Time to the first bytes and the end of the headers (also the idle time allowed
    /// between requests on one connection).
    pub header_timeout: Duration,
    /// Time from a request's headers to the end of its body.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Reverse proxies whose `X-Forwarded-For` is believed (see [`client::TrustedProxies`]).
    pub trusted_proxies: client::TrustedProxies,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: crate::hosts::LOOPBACK_HOSTS.map(String::from).to_vec(),
            operator_tools: false,
            max_body_bytes: 1024 * 1024,
            public_url: format!("http://{DEFAULT_LISTEN}"),
            header_timeout: ConnectionLimits::default().header_timeout,
            body_timeout: ConnectionLimits::default().body_timeout,
            max_connections: ConnectionLimits::default().max_connections,
            trusted_proxies: client::TrustedProxies::default(),
        }
    }
}

impl HttpConfig {
    /// Checks the settings that have bounds; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_body_bytes < MIN_BODY_BYTES {
            return Err(format!("max_body_bytes must be at least {MIN_BODY_BYTES}"));
        }
        for (name, value) in [
            ("header_timeout_seconds", self.header_timeout),
            ("body_timeout_seconds", self.body_timeout),
        ] {
            if !(TIMEOUT_SECONDS.contains(&value.as_secs()) && value.subsec_nanos() == 0) {
                return Err(format!(
                    "{name} must be a whole number of seconds between {} and {}",
                    TIMEOUT_SECONDS.start(),
                    TIMEOUT_SECONDS.end()
                ));
            }
        }
        if !MAX_CONNECTIONS.contains(&self.max_connections) {
            return Err(format!(
                "max_connections must be between {} and {}",
                MAX_CONNECTIONS.start(),
                MAX_CONNECTIONS.end()
            ));
        }
        Ok(())
    }

    /// What `serve_with` enforces on every connection.
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            max_connections: self.max_connections,
        }
    }
}

/// `header_timeout_seconds` and `body_timeout_seconds`: a second at least (a slow
/// client on a phone network still makes it), an hour at most.
pub const TIMEOUT_SECONDS: std::ops::RangeInclusive<u64> = 1..=3600;
/// `max_connections`: at least one, at most a million.
pub const MAX_CONNECTIONS: std::ops::RangeInclusive<usize> = 1..=1_000_000;

#[derive(Clone)]
pub struct AppState {
    pub gate: Arc<Gate>,
    pub hosts: Arc<guard::HostPolicy>,
    pub public_url: String,
    pub throttle: Arc<ui::Throttle>,
    pub proxies: Arc<client::TrustedProxies>,
    /// The bridges this server runs (their records, for the Records page).
    pub bridges: Arc<Vec<BridgeConfig>>,
    /// The process operations, parameters and probes, when configured.
    pub operations: Option<Arc<Operations>>,
}

/// What a server serves beside its own routes.
#[derive(Default)]
pub struct Mounts {
    /// The MCP gateways, each at `/mcp/gateway/<name>`.
    pub gateways: Vec<(String, GatewayService)>,
    /// The bridges whose records the approval-gate profile and the Records page read.
    pub bridges: Vec<BridgeConfig>,
    /// `[[process]]`, `[params]` and `[[probe]]`: the approval-gate profile's process
    /// tools and `/api/v1/operate`.
    pub operations: Option<Arc<Operations>>,
}

/// What the inbound channel endpoints (`/slack/interactivity`, `/email/...`) need of
/// the channels' settings; put on the router by [`with_channels`].
pub struct Channels {
    pub config: NotifyConfig,
    /// For Slack calls made while answering a click (opening a dialog).
    pub http: reqwest::Client,
}

/// Makes the configured channels' inbound endpoints work on `router`.
pub fn with_channels(router: Router, config: &NotifyConfig) -> Result<Router, GateError> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| GateError::internal("HTTP client", e))?;
    let channels = Arc::new(Channels {
        config: config.clone(),
        http,
    });
    Ok(router.layer(axum::Extension(channels)))
}

/// The whole HTTP surface: `/mcp`, `/api/v1`, the dashboard, Slack and email links,
/// `/healthz`, `/.well-known/jwks.json`, `/metrics` (an admin's token).
pub fn router(gate: Arc<Gate>, config: &HttpConfig, shutdown: CancellationToken) -> Router {
    router_with_gateways(gate, config, shutdown, Vec::new())
}

/// The same, with the MCP gateways this server runs, each at `/mcp/gateway/<name>`
/// (docs/gateway.md): an agent token with the `request` scope calls the upstreams' tools
/// through the gate, the server forwarding what is approved.
pub fn router_with_gateways(
    gate: Arc<Gate>,
    config: &HttpConfig,
    shutdown: CancellationToken,
    gateways: Vec<(String, GatewayService)>,
) -> Router {
    router_with(
        gate,
        config,
        shutdown,
        Mounts {
            gateways,
            ..Mounts::default()
        },
    )
}

/// The whole surface with what `mounts` adds: the gateways, and the bridges, whose
/// proposals and records the approval-gate profile at `/mcp/profile/approval-gate`
/// serves (docs/bridge.md; the same token and Origin rules as `/mcp`).
pub fn router_with(
    gate: Arc<Gate>,
    config: &HttpConfig,
    shutdown: CancellationToken,
    mounts: Mounts,
) -> Router {
    let Mounts {
        gateways,
        bridges,
        operations,
    } = mounts;
    let state = AppState {
        gate: gate.clone(),
        hosts: Arc::new(guard::HostPolicy::new(&config.allowed_hosts)),
        public_url: config.public_url.clone(),
        throttle: Arc::new(ui::Throttle::default()),
        proxies: Arc::new(config.trusted_proxies.clone()),
        bridges: Arc::new(bridges.clone()),
        operations: operations.clone(),
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
        mcp_config.clone(),
    );
    let mut served = Router::new()
        .route("/mcp/gateway/{name}", any(no_gateway))
        .route("/mcp/gateway/{name}/{*rest}", any(no_gateway));
    for (name, service) in gateways {
        let gateway = StreamableHttpService::new(
            move || Ok(service.clone()),
            Arc::new(NeverSessionManager::default()),
            mcp_config.clone(),
        );
        served = served.nest_service(&format!("/mcp/gateway/{name}"), gateway);
    }
    // Each call's principal is its token's; the profile's tools check for an operator.
    let mut profile_service = ApprovalGateService::new(gate.clone(), Identity::PerRequest, bridges);
    if let Some(ops) = operations {
        profile_service = profile_service.with_operations(ops);
    }
    let profile = StreamableHttpService::new(
        move || Ok(profile_service.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config.clone(),
    );
    let chatroom_service = McpService::chatroom(gate.clone(), Identity::PerRequest);
    let chatroom = StreamableHttpService::new(
        move || Ok(chatroom_service.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config.clone(),
    );
    let looppause_service = LoopPauseService::new(gate.clone(), Identity::PerRequest);
    let looppause = StreamableHttpService::new(
        move || Ok(looppause_service.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config.clone(),
    );
    let profiles = Router::new()
        .nest_service(&format!("/mcp/profile/{}", approval_gate::PROFILE), profile)
        .nest_service(&format!("/mcp/profile/{}", chatroom::PROFILE), chatroom)
        .nest_service(&format!("/mcp/profile/{}", looppause::PROFILE), looppause)
        .route("/mcp/profile/{name}", any(no_profile))
        .route("/mcp/profile/{name}/{*rest}", any(no_profile));
    let token_surface = Router::new()
        .nest("/api/v1", token_routes().merge(both_surfaces()))
        .nest_service("/mcp", mcp)
        .merge(scoped(Scope::Request, served))
        .merge(scoped(
            Scope::Admin,
            Router::new().route("/metrics", get(metrics::scrape)),
        ))
        .merge(profiles)
        .layer(AsyncCheckLayer(auth::RequireToken(state.clone())));
    let session_surface = Router::new()
        .nest("/ui/api", dashboard_routes().merge(both_surfaces()))
        .merge(session_routes())
        .route_layer(AsyncCheckLayer(auth::RequireSession(state.clone())));
    let dashboard = page_routes()
        .merge(session_surface)
        .layer(from_fn(ui::security_headers));
    Router::new()
        .route("/healthz", get(rest::healthz))
        .route("/.well-known/jwks.json", get(rest::jwks))
        .route(
            "/.well-known/looppause-signing-key.json",
            get(rest::looppause_signing_key),
        )
        .merge(token_surface)
        .merge(dashboard)
        .route_layer(from_fn(metrics::mark_route))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(CheckLayer(guard::HostAndOrigin(state.hosts.clone())))
        .layer(from_fn_with_state(gate, metrics::count))
        .with_state(state)
}

/// Routes that need `scope`: a caller whose credential lacks it gets 403 before the
/// handler runs. Every route under `/api/v1`, and the `/ui/api` routes both surfaces
/// share, is in one such group; the dashboard's own routes take a session only and
/// check its role by extractor.
fn scoped(scope: Scope, routes: Router<AppState>) -> Router<AppState> {
    routes.route_layer(CheckLayer(auth::RequireScope(scope)))
}

/// The routes both surfaces serve, with one handler each: a request and its decision,
/// its review, and rooms. Under `/api/v1` (a token: decisions through channel `api`)
/// and `/ui/api` (a session: channel `dashboard`).
fn both_surfaces() -> Router<AppState> {
    let request = Router::new().route("/requests/{id}", get(rest::get_request));
    let decide = Router::new()
        .route("/requests/{id}/decision", post(rest::decide))
        .route("/requests/decisions", post(rest::decide_batch))
        .route("/grants", get(rest::list_grants).post(rest::create_grant))
        .route("/grants/{id}/revoke", post(rest::revoke_grant))
        .route("/records", get(rest::records));
    let review = Router::new().route("/requests/{id}/review", post(rest::review));
    let rooms = Router::new()
        .route("/rooms", get(rooms::list).post(rooms::create))
        .route(
            "/rooms/{room}/messages",
            get(rooms::messages).post(rooms::post_message),
        )
        .route("/rooms/{room}/members", get(rooms::members))
        .route("/rooms/{room}/access", post(rooms::restrict))
        .route(
            "/rooms/{room}/questions/{id}/answer",
            post(rooms::close::<rooms::AnswerBody>),
        )
        .route(
            "/rooms/{room}/blockers/{id}/resolve",
            post(rooms::close::<rooms::ResolveBody>),
        )
        .route("/rooms/{room}/{action}", post(rooms::admin));
    scoped(Scope::Request, request)
        .merge(scoped(Scope::Decide, decide))
        .merge(scoped(Scope::Evidence, review))
        .merge(scoped(Scope::Rooms, rooms))
}

/// The REST API's own routes under `/api/v1`, behind a bearer token.
fn token_routes() -> Router<AppState> {
    let request = Router::new()
        .route("/requests", post(rest::create_request))
        .route("/requests/own", get(rest::own_requests))
        .route("/requests/{id}/wait", get(rest::wait_request))
        .route("/requests/{id}/cancel", post(rest::cancel))
        .route(
            "/requests/{id}/actions",
            post(rest::record::<rest::ActionBody>),
        )
        .route(
            "/requests/{id}/outcome",
            post(rest::record::<rest::OutcomeBody>),
        );
    let decide = Router::new()
        .route("/requests", get(rest::list_requests))
        .route("/operate/processes/{name}/status", get(operate::status))
        .route("/operate/processes/{name}/logs", get(operate::logs))
        .route("/operate/processes/{name}/restart", post(operate::restart))
        .route("/operate/processes/{name}/run", post(operate::run))
        .route("/operate/params", get(operate::list_params))
        .route("/operate/params/clear", post(operate::clear_params))
        .route("/operate/params/set", post(operate::set_param))
        .route("/operate/probes", get(operate::probes))
        .route("/operate/probes/{name}", post(operate::probe));
    let verify = Router::new().route("/proofs/verify", post(rest::verify_proof));
    let redeem = Router::new().route("/proofs/redeem", post(rest::redeem_proof));
    let evidence = Router::new()
        .route("/decisions", post(rest::record_decision))
        .route("/evidence/{subject}", get(rest::get_evidence))
        .route("/evidence/verify", post(rest::verify_evidence))
        .route("/log/checkpoint", get(rest::log_checkpoint))
        .route("/log/key", get(rest::log_key))
        .route("/log/entries/{index}", get(rest::log_entry))
        .route("/log/proof/inclusion", get(rest::inclusion_proof))
        .route("/log/proof/consistency", get(rest::consistency_proof));
    let admin = Router::new()
        .route("/tokens", get(rest::list_tokens).post(rest::create_token))
        .route("/tokens/{id}/revoke", post(rest::revoke_token))
        .route("/deliveries", get(rest::deliveries));
    // A remote gateway's held calls; waiting and withdrawing are the request routes',
    // under this scope too, so that a gateway's token needs no other.
    let gateway = Router::new()
        .route("/gateway/calls", post(gateway::call))
        .route("/gateway/calls/{id}/wait", get(rest::wait_request))
        .route("/gateway/calls/{id}/cancel", post(rest::cancel))
        .route("/gateway/calls/{id}/claim", post(gateway::claim))
        .route("/gateway/calls/{id}/outcome", post(gateway::outcome))
        .route("/gateway/sweep", post(gateway::sweep));
    scoped(Scope::Request, request)
        .merge(scoped(Scope::Gateway, gateway))
        .merge(scoped(Scope::Decide, decide))
        .merge(scoped(Scope::Verify, verify))
        .merge(scoped(Scope::Redeem, redeem))
        .merge(scoped(Scope::Evidence, evidence))
        .merge(scoped(Scope::Admin, admin))
}

/// The dashboard's own JSON under `/ui/api`, behind a session.
fn dashboard_routes() -> Router<AppState> {
    Router::new()
        .route("/me", get(ui::me))
        .route("/requests", get(ui::list_requests))
        .route("/requests/{id}/why", get(ui::request_why))
        .route("/operations", get(ui::list_operations))
        .route("/users", get(ui::list_users))
        .route("/users/invite", post(ui::invite_user))
        .route("/users/{id}/disable", post(ui::disable_user))
        // The same handlers as /api/v1/tokens: an admin, here signed in (with CSRF).
        .route("/tokens", get(rest::list_tokens).post(rest::create_token))
        .route("/tokens/{id}/revoke", post(rest::revoke_token))
}

/// Outside `/ui/api`, behind a session: signing out and the live updates.
fn session_routes() -> Router<AppState> {
    Router::new()
        .route("/ui/logout", post(ui::sign_out))
        .route("/ui/logout-all", post(ui::sign_out_everywhere))
        .route("/ui/events", get(ui::events))
}

/// What a browser opens without a session: the dashboard's pages (which send a
/// signed-out visitor to sign in), its assets, signing in, accepting an invitation;
/// Slack's signed clicks; and the pages of emailed decision links (their token only
/// ever in POST bodies).
fn page_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(ui::index_page))
        .route("/requests/{id}", get(ui::request_page))
        .route("/login", get(ui::login_page))
        .route("/setup", get(ui::setup_page))
        .route("/invite", get(ui::setup_page))
        .route("/assets/{file}", get(ui::asset))
        .route("/manifest.webmanifest", get(ui::manifest))
        .route("/sw.js", get(ui::service_worker))
        .route("/offline", get(ui::offline_page))
        .route("/ui/login", post(ui::sign_in))
        .route("/ui/accept", post(ui::accept))
        .route("/slack/interactivity", post(slack::interactivity))
        .route("/email/decide", get(email_links::decide_page))
        .route("/email/api/request", post(email_links::token_request))
        .route("/email/api/decision", post(email_links::token_decision))
}

async fn no_gateway(uri: http::Uri) -> Response {
    error::error_response(
        http::StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no gateway at {}: the gateways are the [[gateway]] sections of the server's config",
            uri.path()
        ),
    )
}

async fn no_profile(uri: http::Uri) -> Response {
    error::error_response(
        http::StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no MCP profile at {}: the profiles are /mcp/profile/{}, /mcp/profile/{} and /mcp/profile/{}",
            uri.path(),
            approval_gate::PROFILE,
            chatroom::PROFILE,
            looppause::PROFILE
        ),
    )
}

async fn not_found(uri: http::Uri) -> Response {
    error::error_response(
        http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {}", uri.path()),
    )
}

/// The JSON of a response, for handlers that answer with a status of their own.
pub(crate) fn created<T: serde::Serialize>(body: T) -> Response {
    (http::StatusCode::CREATED, axum::Json(body)).into_response()
}
