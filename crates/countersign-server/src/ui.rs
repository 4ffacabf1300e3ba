//! The approver's dashboard: embedded pages and assets, sign-in, the JSON the page uses,
//! and live updates over Server-Sent Events. Every asset is compiled into the binary.
//!
//! Security: sessions are HttpOnly, SameSite=Strict cookies; every state change is a
//! POST carrying the session's CSRF token in `X-CSRF-Token` (sign-in and account
//! creation, which have no session yet, only take JSON, which a cross-site form cannot
//! send); no GET changes anything; the Host/Origin guard runs before all of it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_core::{Channel, DecisionInput, Role, Status};
use countersign_store::RequestQuery;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use crate::AppState;
use crate::accounts::{SignIn, User};
use crate::error::GateError;
use crate::gate::Decider;
use crate::mcp::parse_decision;
use crate::rest::{ApiError, ApiJson, ApiPath, ApiQuery};
use crate::views::{ApprovalView, DecisionBody};

pub const COOKIE: &str = "cs_session";

const INDEX: &str = include_str!("../assets/index.html");
const LOGIN: &str = include_str!("../assets/login.html");
const SETUP: &str = include_str!("../assets/setup.html");
const APP_JS: &str = include_str!("../assets/app.js");
const ROOMS_JS: &str = include_str!("../assets/rooms.js");
const AUTH_JS: &str = include_str!("../assets/auth.js");
const APP_CSS: &str = include_str!("../assets/app.css");
const ICON: &str = include_str!("../assets/icon.svg");
const EMAIL_JS: &str = include_str!("../assets/email.js");

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index_page))
        .route("/requests/{id}", get(request_page))
        .route("/login", get(login_page))
        .route("/setup", get(setup_page))
        .route("/invite", get(setup_page))
        .route("/assets/{file}", get(asset))
        .route("/ui/login", post(sign_in))
        .route("/ui/accept", post(accept))
        .route("/ui/logout", post(sign_out))
        .route("/ui/logout-all", post(sign_out_everywhere))
        .route("/ui/events", get(events))
        .route("/ui/api/me", get(me))
        .route("/ui/api/requests", get(list_requests))
        .route("/ui/api/requests/{id}", get(get_request))
        .route("/ui/api/requests/{id}/decision", post(decide))
        .route("/ui/api/users", get(list_users))
        .route("/ui/api/users/invite", post(invite_user))
        .route("/ui/api/users/{id}/disable", post(disable_user))
        // Slack and email (crate::notify): Slack's signed interactivity requests, and the
        // page an emailed one-time decision link opens (its token only ever in POSTs).
        .route(
            "/slack/interactivity",
            post(crate::notify::slack::interactivity),
        )
        .route("/email/decide", get(crate::notify::email::decide_page))
        .route(
            "/email/api/request",
            post(crate::notify::email::token_request),
        )
        .route(
            "/email/api/decision",
            post(crate::notify::email::token_decision),
        )
}

// ---- pages and assets ---------------------------------------------------------------

fn html(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

async fn index_page(session: Option<PageSession>) -> Response {
    match session {
        Some(_) => html(INDEX),
        None => Redirect::to("/login").into_response(),
    }
}

async fn request_page(session: Option<PageSession>, ApiPath(id): ApiPath<String>) -> Response {
    match session {
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

async fn login_page() -> Response {
    html(LOGIN)
}

async fn setup_page() -> Response {
    html(SETUP)
}

async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "rooms.js" => (ROOMS_JS, "text/javascript; charset=utf-8"),
        "auth.js" => (AUTH_JS, "text/javascript; charset=utf-8"),
        "email.js" => (EMAIL_JS, "text/javascript; charset=utf-8"),
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        "icon.svg" => (ICON, "image/svg+xml"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Security headers on every dashboard response: a strict CSP (scripts only from this
/// origin, no inline scripts or styles), no framing, no referrer, no sniffing.
pub async fn security_headers(
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
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
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

fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// A signed-in account (for the JSON API: 401 without one).
pub struct ApiSession {
    pub user: User,
    pub csrf: String,
    pub token: String,
}

impl FromRequestParts<AppState> for ApiSession {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = session_token(&parts.headers)
            .ok_or_else(|| ApiError(GateError::Unauthenticated("sign in first".into())))?;
        match state.gate.accounts().session(&token).await? {
            Some((user, session)) => Ok(ApiSession {
                user,
                csrf: session.csrf,
                token,
            }),
            None => Err(ApiError(GateError::Unauthenticated(
                "your session ended; sign in again".into(),
            ))),
        }
    }
}

/// A signed-in account for a page (absent: the page redirects to sign-in).
pub struct PageSession;

impl axum::extract::OptionalFromRequestParts<AppState> for PageSession {
    type Rejection = Infallible;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(ApiSession::from_request_parts(parts, state)
            .await
            .ok()
            .map(|_| PageSession))
    }
}

/// A signed-in account making a state change: the CSRF token must match.
pub struct CsrfSession(pub ApiSession);

impl FromRequestParts<AppState> for CsrfSession {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let session = ApiSession::from_request_parts(parts, state).await?;
        let sent = parts
            .headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !bool::from(sent.as_bytes().ct_eq(session.csrf.as_bytes())) {
            return Err(ApiError(GateError::Forbidden(
                "missing or wrong CSRF token: reload the page and try again".into(),
            )));
        }
        Ok(CsrfSession(session))
    }
}

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

/// Sign-in attempts per client address, so one address cannot try passwords across
/// accounts faster than the per-account lockout allows.
#[derive(Default)]
pub struct Throttle(Mutex<HashMap<IpAddr, (u32, Instant)>>);

const THROTTLE_WINDOW: Duration = Duration::from_secs(300);
const THROTTLE_MAX: u32 = 20;

impl Throttle {
    fn allow(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip else { return true };
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        map.retain(|_, (_, since)| now.duration_since(*since) < THROTTLE_WINDOW);
        let entry = map.entry(ip).or_insert((0, now));
        entry.0 += 1;
        entry.0 <= THROTTLE_MAX
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignInBody {
    username: String,
    password: String,
}

/// The client's address, when the server was started with connection info.
pub struct ClientIp(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = Infallible;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Infallible> {
        Ok(ClientIp(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip()),
        ))
    }
}

async fn sign_in(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    ApiJson(body): ApiJson<SignInBody>,
) -> Result<Response, ApiError> {
    if !state.throttle.allow(ip) {
        return Ok((
            StatusCode::TOO_MANY_REQUESTS,
            Json(serde_json::json!({"error": {"code": "rate_limited", "message": "too many sign-in attempts from this address; wait a few minutes"}})),
        )
            .into_response());
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcceptBody {
    token: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    password: String,
}

/// Creates the first admin (setup link) or activates an invited account, then signs in.
async fn accept(
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

async fn sign_out(
    State(state): State<AppState>,
    CsrfSession(session): CsrfSession,
) -> Result<Response, ApiError> {
    state.gate.accounts().sign_out(&session.token).await?;
    Ok(cleared_cookie(&state))
}

async fn sign_out_everywhere(
    State(state): State<AppState>,
    CsrfSession(session): CsrfSession,
) -> Result<Response, ApiError> {
    state
        .gate
        .accounts()
        .sign_out_everywhere(&session.user.id)
        .await?;
    Ok(cleared_cookie(&state))
}

#[derive(Debug, Serialize)]
struct UserView {
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

async fn me(session: ApiSession) -> Json<serde_json::Value> {
    Json(serde_json::json!({"user": UserView::from(&session.user), "csrf_token": session.csrf}))
}

fn require_admin(session: &ApiSession) -> Result<(), ApiError> {
    if session.user.role == Role::Admin {
        Ok(())
    } else {
        Err(ApiError(GateError::Forbidden(
            "only admins manage accounts".into(),
        )))
    }
}

async fn list_users(
    State(state): State<AppState>,
    session: ApiSession,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&session)?;
    let users = state.gate.accounts().users().await?;
    let views: Vec<UserView> = users.iter().map(UserView::from).collect();
    Ok(Json(serde_json::json!({"users": views})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InviteBody {
    username: String,
    #[serde(default)]
    display_name: Option<String>,
    role: String,
}

/// How long an invitation link works.
pub const INVITE_SECONDS: u64 = 24 * 3600;

async fn invite_user(
    State(state): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiJson(body): ApiJson<InviteBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&session)?;
    let role: Role = body.role.parse().map_err(GateError::BadInput)?;
    let (user, token) = state
        .gate
        .accounts()
        .invite(
            &body.username,
            body.display_name.as_deref(),
            role,
            &session.user.principal(),
            INVITE_SECONDS,
        )
        .await?;
    let link = format!(
        "{}/invite?kind=invite&username={}&token={token}",
        state.public_url.trim_end_matches('/'),
        user.username
    );
    Ok(Json(
        serde_json::json!({"user": UserView::from(&user), "link": link}),
    ))
}

async fn disable_user(
    State(state): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&session)?;
    if id == session.user.id {
        return Err(ApiError(GateError::BadInput(
            "you cannot disable your own account".into(),
        )));
    }
    let user = state
        .gate
        .accounts()
        .disable(&id, &session.user.principal())
        .await?;
    Ok(Json(serde_json::json!({"user": UserView::from(&user)})))
}

// ---- requests -------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct UiRequest {
    #[serde(flatten)]
    view: ApprovalView,
    version: u64,
    can_decide: bool,
    cannot_decide_reason: Option<String>,
}

fn ui_request(request: &countersign_core::ApprovalRequest, user: &User) -> UiRequest {
    let principal = user.principal();
    let reason = if request.status != Status::Pending {
        None
    } else if request.requested_by.id == principal.id {
        Some("You asked for this request, so another approver must decide it.".to_string())
    } else {
        None
    };
    UiRequest {
        view: ApprovalView::new(request),
        version: request.version,
        can_decide: request.status == Status::Pending && reason.is_none(),
        cannot_decide_reason: reason,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    view: Option<String>,
    q: Option<String>,
    agent: Option<String>,
    status: Option<String>,
}

async fn list_requests(
    State(state): State<AppState>,
    session: ApiSession,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let decider = Decider::new(session.user.principal())?;
    let history = params.view.as_deref() == Some("history");
    let status = match params.status.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(s.parse::<Status>().map_err(GateError::from)?),
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
    let views: Vec<UiRequest> = requests
        .iter()
        .map(|r| ui_request(r, &session.user))
        .collect();
    Ok(Json(serde_json::json!({"requests": views})))
}

async fn get_request(
    State(state): State<AppState>,
    session: ApiSession,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<UiRequest>, ApiError> {
    let request = state.gate.get(&session.user.principal(), &id).await?;
    Ok(Json(ui_request(&request, &session.user)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UiDecisionBody {
    decision: String,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    fields: std::collections::BTreeMap<String, String>,
    /// The version the page showed; a request that moved on since is not decided blind.
    #[serde(default)]
    expected_version: Option<u64>,
}

async fn decide(
    State(state): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UiDecisionBody>,
) -> Result<Json<UiRequest>, ApiError> {
    let decider = Decider::new(session.user.principal())?;
    let verdict = parse_decision(&DecisionBody {
        decision: body.decision,
        comment: None,
        fields: Default::default(),
    })?;
    if let Some(expected) = body.expected_version {
        let current = state.gate.get(decider.principal(), &id).await?;
        if current.version != expected
            && let Some(err) = current.closed_error(state.gate.clock().now())
        {
            return Err(ApiError(err.into()));
        }
    }
    let request = state
        .gate
        .decide(
            &decider,
            &id,
            verdict,
            DecisionInput {
                comment: body.comment,
                fields: body.fields,
            },
            Channel::Dashboard,
        )
        .await?;
    Ok(Json(ui_request(&request, &session.user)))
}

// ---- live updates ---------------------------------------------------------------------

/// Every committed change, as `event: change` with `{seq, type, subject}`; the page
/// reloads what it shows. A reader that falls behind gets a change with no subject and
/// reloads everything.
async fn events(
    State(state): State<AppState>,
    _session: ApiSession,
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
