//! The approver's dashboard: embedded pages and assets, sign-in, the JSON the page uses,
//! and live updates over Server-Sent Events. Every asset is compiled into the binary.
//!
//! Security: sessions are HttpOnly, SameSite=Strict cookies; every state change is a
//! POST carrying the session's CSRF token in `X-CSRF-Token` (sign-in and account
//! creation, which have no session yet, only take JSON, which a cross-site form cannot
//! send); no GET changes anything; the Host/Origin guard runs before all of it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_core::accounts::User;
use countersign_core::{Decider, Role, Status};
use countersign_store::RequestQuery;
use futures_util::Stream;
use serde::Serialize;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use super::AppState;
use super::auth::{Admin, COOKIE, Dashboard, signed_in};
use super::client::ClientAddr;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, error_response};
use crate::accounts::{INVITE_SECONDS, SignIn};
use crate::error::GateError;
use crate::views::{RequestView, WhyView};

const INDEX: &str = include_str!("../../assets/index.html");
const LOGIN: &str = include_str!("../../assets/login.html");
const SETUP: &str = include_str!("../../assets/setup.html");
// The installable app's offline page (docs/deployment.md, "On a phone").
const OFFLINE: &str = include_str!("../../assets/offline.html");

const JS: &str = "text/javascript; charset=utf-8";

/// Everything under `/assets/`, by name: the bytes and the content type.
static ASSETS: &[(&str, &[u8], &str)] = &[
    ("app.js", include_bytes!("../../assets/app.js"), JS),
    ("rooms.js", include_bytes!("../../assets/rooms.js"), JS),
    ("auth.js", include_bytes!("../../assets/auth.js"), JS),
    ("email.js", include_bytes!("../../assets/email.js"), JS),
    ("time.js", include_bytes!("../../assets/time.js"), JS),
    (
        "app.css",
        include_bytes!("../../assets/app.css"),
        "text/css; charset=utf-8",
    ),
    (
        "icon.svg",
        include_bytes!("../../assets/icon.svg"),
        "image/svg+xml",
    ),
    (
        "icon-192.png",
        include_bytes!("../../assets/icon-192.png"),
        "image/png",
    ),
    (
        "icon-512.png",
        include_bytes!("../../assets/icon-512.png"),
        "image/png",
    ),
];

// ---- pages and assets ---------------------------------------------------------------

fn html(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

pub(super) async fn index_page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match signed_in(&state, &headers).await.ok() {
        Some(_) => html(INDEX),
        None => Redirect::to("/login").into_response(),
    }
}

pub(super) async fn request_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
) -> Response {
    match signed_in(&state, &headers).await.ok() {
        Some(_) => html(INDEX),
        // Signed out (say, from an emailed link): sign in, then come back here.
        None if id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            Redirect::to(&format!("/login?next=/requests/{id}")).into_response()
        }
        None => Redirect::to("/login").into_response(),
    }
}

pub(super) async fn login_page() -> Response {
    html(LOGIN)
}

pub(super) async fn setup_page() -> Response {
    html(SETUP)
}

pub(super) async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, body, kind)) => static_file(body, kind),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn static_file(body: &'static [u8], kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The web app manifest: what a phone installs.
pub(super) async fn manifest() -> Response {
    static_file(
        include_bytes!("../../assets/manifest.webmanifest"),
        "application/manifest+json",
    )
}

/// The service worker, at the root so that its scope is the whole dashboard.
pub(super) async fn service_worker() -> Response {
    static_file(include_bytes!("../../assets/sw.js"), JS)
}

/// What the installed app shows when the server is out of reach (the service worker
/// serves it from its cache; it needs no session and holds nothing private).
pub(super) async fn offline_page() -> Response {
    html(OFFLINE)
}

/// Security headers on every dashboard response: a strict CSP (scripts only from this
/// origin, no inline scripts or styles), no framing, no referrer, no sniffing.
pub(super) async fn security_headers(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name: &'static str, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; manifest-src 'self'; worker-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "x-frame-options", "DENY");
    set(headers, "referrer-policy", "no-referrer");
    set(headers, "cross-origin-opener-policy", "same-origin");
    set(
        headers,
        "permissions-policy",
        "camera=(), microphone=(), geolocation=()",
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, "cache-control", "no-store");
    }
    response
}

// ---- sessions -----------------------------------------------------------------------

fn session_cookie(state: &AppState, token: &str, max_age: u64) -> HeaderValue {
    let secure = if state.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("cs_session=; Path=/; Max-Age=0"))
}

// ---- sign-in, accounts ---------------------------------------------------------------

/// Sign-in attempts per client address (IPv6 by /64, behind trusted proxies the
/// forwarded address: see `client`), so one address cannot try passwords across
/// accounts faster than the per-account lockout allows.
#[derive(Default)]
pub struct Throttle(Mutex<HashMap<IpAddr, (u32, Instant)>>);

const THROTTLE_WINDOW: Duration = Duration::from_secs(300);
const THROTTLE_MAX: u32 = 20;

impl Throttle {
    fn allow(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip.map(super::client::limit_key) else {
            return true;
        };
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        map.retain(|_, (_, since)| now.duration_since(*since) < THROTTLE_WINDOW);
        let entry = map.entry(ip).or_insert((0, now));
        entry.0 += 1;
        entry.0 <= THROTTLE_MAX
    }
}

input!(SignInBody {
    username: String,
    password: String
});

pub(super) async fn sign_in(
    State(state): State<AppState>,
    ClientAddr(ip): ClientAddr,
    ApiJson(body): ApiJson<SignInBody>,
) -> Result<Response, ApiError> {
    if !state.throttle.allow(ip) {
        return Ok(error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many sign-in attempts from this address; wait a few minutes".into(),
        ));
    }
    match state
        .gate
        .accounts()
        .sign_in(&body.username, &body.password)
        .await?
    {
        SignIn::Ok { session_token, .. } => {
            let mut response = Json(serde_json::json!({"next": "/"})).into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                session_cookie(
                    &state,
                    &session_token,
                    state.gate.accounts().session_seconds(),
                ),
            );
            Ok(response)
        }
        SignIn::Refused(message) => Err(ApiError(GateError::Unauthenticated(message))),
    }
}

input!(AcceptBody { token: String, #[serde(default)] username: Option<String>, #[serde(default)] display_name: Option<String>, password: String });

/// Creates the first admin (setup link) or activates an invited account, then signs in.
pub(super) async fn accept(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<AcceptBody>,
) -> Result<Response, ApiError> {
    let accounts = state.gate.accounts();
    let user = accounts
        .accept(
            &body.token,
            body.username.as_deref(),
            body.display_name.as_deref(),
            &body.password,
        )
        .await?;
    match accounts.sign_in(&user.username, &body.password).await? {
        SignIn::Ok { session_token, .. } => {
            let mut response = Json(serde_json::json!({"next": "/"})).into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                session_cookie(&state, &session_token, accounts.session_seconds()),
            );
            Ok(response)
        }
        SignIn::Refused(message) => Err(ApiError(GateError::Unauthenticated(message))),
    }
}

fn cleared_cookie(state: &AppState) -> Response {
    let mut response = Json(serde_json::json!({"next": "/login"})).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(state, "", 0));
    response
}

pub(super) async fn sign_out(
    State(state): State<AppState>,
    Dashboard(session): Dashboard,
) -> Result<Response, ApiError> {
    state.gate.accounts().sign_out(&session.token).await?;
    Ok(cleared_cookie(&state))
}

pub(super) async fn sign_out_everywhere(
    State(state): State<AppState>,
    Dashboard(session): Dashboard,
) -> Result<Response, ApiError> {
    state
        .gate
        .accounts()
        .sign_out_everywhere(&session.user.id)
        .await?;
    Ok(cleared_cookie(&state))
}

#[derive(Debug, Serialize)]
pub(super) struct UserView {
    id: String,
    username: String,
    display_name: String,
    role: Role,
    active: bool,
    disabled: bool,
}

impl From<&User> for UserView {
    fn from(u: &User) -> Self {
        Self {
            id: u.id.clone(),
            username: u.username.clone(),
            display_name: u.display_name.clone(),
            role: u.role,
            active: u.is_active(),
            disabled: u.disabled,
        }
    }
}

/// An account, with what an answer about it carries: the page's CSRF token (`me`) or
/// the invitation link.
#[derive(Debug, Serialize)]
pub(super) struct AccountOut {
    user: UserView,
    #[serde(skip_serializing_if = "Option::is_none")]
    csrf_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    link: Option<String>,
}

impl AccountOut {
    fn new(user: &User) -> Self {
        Self {
            user: UserView::from(user),
            csrf_token: None,
            link: None,
        }
    }
}

pub(super) async fn me(Dashboard(session): Dashboard) -> Json<AccountOut> {
    Json(AccountOut {
        csrf_token: Some(session.csrf.clone()),
        ..AccountOut::new(&session.user)
    })
}

pub(super) async fn list_users(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let users = state.gate.accounts().users().await?;
    let views: Vec<UserView> = users.iter().map(UserView::from).collect();
    Ok(Json(serde_json::json!({"users": views})))
}

input!(InviteBody { username: String, #[serde(default)] display_name: Option<String>, role: String });

pub(super) async fn invite_user(
    State(state): State<AppState>,
    Admin(admin): Admin,
    ApiJson(body): ApiJson<InviteBody>,
) -> Result<Json<AccountOut>, ApiError> {
    let role: Role = body.role.parse().map_err(GateError::BadInput)?;
    let (user, token) = state
        .gate
        .accounts()
        .invite(
            &body.username,
            body.display_name.as_deref(),
            role,
            &admin.who,
            INVITE_SECONDS,
        )
        .await?;
    let link = format!(
        "{}/invite?kind=invite&username={}&token={token}",
        state.public_url.trim_end_matches('/'),
        user.username
    );
    Ok(Json(AccountOut {
        link: Some(link),
        ..AccountOut::new(&user)
    }))
}

pub(super) async fn disable_user(
    State(state): State<AppState>,
    Admin(admin): Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<AccountOut>, ApiError> {
    if admin.session.as_ref().is_some_and(|s| s.user.id == id) {
        return Err(ApiError(GateError::BadInput(
            "you cannot disable your own account".into(),
        )));
    }
    let user = state.gate.accounts().disable(&id, &admin.who).await?;
    Ok(Json(AccountOut::new(&user)))
}

// ---- requests -------------------------------------------------------------------------

input!(ListParams { view: Option<String>, q: Option<String>, agent: Option<String>, status: Option<String> });

/// The dashboard's lists: what is pending (by default) or the history, filtered by
/// agent and by text.
/// How many of the newest requests the Operations view looks through.
const OPERATIONS_SCANNED: usize = 1_000;

/// The Operations view: process operations (restart, run, parameter changes: requests a
/// person made through `/api/v1/operate` or the approval-gate profile), newest first,
/// with their decision and what came of them. An operation is told by its details
/// (`upstream` = `operate`) *and* its requester being a person: an agent cannot make
/// one, nor make its own request look like one here.
pub(super) async fn list_operations(
    State(state): State<AppState>,
    Dashboard(session): Dashboard,
) -> Result<Json<serde_json::Value>, ApiError> {
    let decider = Decider::new(session.user.principal())?;
    let query = RequestQuery {
        status: None,
        requested_by: None,
        limit: OPERATIONS_SCANNED,
    };
    // Who is a person: accounts, tokens of people, and the data directory's own OS
    // users (the CLI; whoever holds the data directory holds everything anyway).
    let people: std::collections::HashSet<String> = state
        .gate
        .list_tokens()
        .await?
        .into_iter()
        .filter(|t| t.role.may_decide())
        .map(|t| format!("token:{}", t.name))
        .collect();
    let is_person =
        |id: &str| id.starts_with("user:") || id.starts_with("local:") || people.contains(id);
    let operations: Vec<crate::views::ApprovalView> = state
        .gate
        .list(&decider, &query)
        .await?
        .iter()
        .filter(|r| {
            is_person(&r.requested_by.id)
                && r.action.details.get("upstream").map(String::as_str)
                    == Some(crate::operate::UPSTREAM)
        })
        .map(crate::views::ApprovalView::new)
        .collect();
    Ok(Json(serde_json::json!({
        "operations": operations,
        "scanned": OPERATIONS_SCANNED,
    })))
}

pub(super) async fn list_requests(
    State(state): State<AppState>,
    Dashboard(session): Dashboard,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let viewer = session.user.principal();
    let decider = Decider::new(viewer.clone())?;
    let history = params.view.as_deref() == Some("history");
    let status = match params.status.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(s.parse::<Status>()?),
        None if history => None,
        None => Some(Status::Pending),
    };
    let query = RequestQuery {
        status,
        requested_by: None,
        limit: if history { 500 } else { 200 },
    };
    let mut requests = state.gate.list(&decider, &query).await?;
    if history {
        requests.retain(|r| r.status != Status::Pending);
    }
    if let Some(agent) = params
        .agent
        .as_deref()
        .map(str::to_lowercase)
        .filter(|a| !a.is_empty())
    {
        requests.retain(|r| {
            r.requested_by.id.to_lowercase().contains(&agent)
                || r.requested_by.display_name.to_lowercase().contains(&agent)
        });
    }
    if let Some(q) = params
        .q
        .as_deref()
        .map(str::to_lowercase)
        .filter(|q| !q.is_empty())
    {
        requests.retain(|r| {
            r.id.to_lowercase().contains(&q)
                || r.action.description.to_lowercase().contains(&q)
                || r.action
                    .details
                    .iter()
                    .any(|(k, v)| k.to_lowercase().contains(&q) || v.to_lowercase().contains(&q))
        });
    }
    let (set, since) = state.gate.policies_since().await?;
    let views: Vec<ListedRequest> = requests
        .iter()
        .map(|r| ListedRequest {
            view: RequestView::new(r, &viewer, &state.gate.accounts_for(r, &viewer)),
            why: WhyView::of(r, &set, since).map(WhyView::brief),
        })
        .collect();
    Ok(Json(serde_json::json!({"requests": views})))
}

/// A request in the dashboard's lists, with a short "why" (the policies' ids).
#[derive(Serialize)]
struct ListedRequest {
    #[serde(flatten)]
    view: RequestView,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<WhyView>,
}

/// Why a person decides this request, or which policy decided it: `{"why": ...}`, null
/// when policies had no part in it. Only for a session that may see the request.
pub(super) async fn request_why(
    State(state): State<AppState>,
    Dashboard(session): Dashboard,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let request = state.gate.get(&session.user.principal(), &id).await?;
    let (set, since) = state.gate.policies_since().await?;
    Ok(Json(
        serde_json::json!({"why": WhyView::of(&request, &set, since)}),
    ))
}

// ---- live updates ---------------------------------------------------------------------

/// Every committed change, as `event: change` with `{seq, type, subject}`; the page
/// reloads what it shows. A reader that falls behind gets a change with no subject and
/// reloads everything.
pub(super) async fn events(
    State(state): State<AppState>,
    _session: Dashboard,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let stream = BroadcastStream::new(state.gate.feed().subscribe()).map(|item| {
        let data = match item {
            Ok(stored) => serde_json::json!({
                "seq": stored.seq,
                "type": stored.entry.kind.as_str(),
                "subject": stored.entry.subject,
            }),
            Err(_) => serde_json::json!({"seq": null, "type": "resync", "subject": null}),
        };
        Ok(SseEvent::default().event("change").data(data.to_string()))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
