//! Authentication, once per request, by the surface's middleware: a bearer token on
//! `/api/v1` and `/mcp`, a dashboard session on `/ui/api` (its CSRF token checked on
//! every state change). Either way the handler gets a [`Caller`] with a `Principal`, so
//! one handler serves both surfaces. Roles are types: a handler that takes an
//! [`Approver`] cannot run for an agent credential, one that takes an [`Admin`] only for
//! an admin. And every route names the scope it needs ([`RequireScope`], in the route
//! tables): a token narrowed to some scopes, or an executor's, reaches nothing else. A
//! token caller on a route that names no scope is refused, so a route cannot be added
//! that every token reaches by omission.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use countersign_core::accounts::User;
use countersign_core::{Channel, Decider, Principal, Role, Scope};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, header};
use subtle::ConstantTimeEq;

use super::AppState;
use futures_util::future::BoxFuture;

use super::check::{AsyncCheck, Check};
use super::error::ApiError;
use crate::error::GateError;
use crate::gate::Gate;

/// The dashboard's session cookie.
pub const COOKIE: &str = "cs_session";

/// A signed-in dashboard account.
pub struct SignedIn {
    pub user: User,
    /// The CSRF token its page echoes on every state change.
    pub csrf: String,
    /// The session token (to sign out).
    pub token: String,
}

/// Who is calling, as the surface's middleware authenticated it (a request extension).
#[derive(Clone)]
struct Authenticated {
    principal: Principal,
    channel: Channel,
    session: Option<Arc<SignedIn>>,
}

/// An authenticated call: the gate, and who calls it.
pub struct Caller {
    pub gate: Arc<Gate>,
    pub who: Principal,
    /// The channel a decision made by this caller is recorded under: `api` for a token,
    /// `dashboard` for a session.
    pub channel: Channel,
    /// The dashboard session, when signed in through one.
    pub session: Option<Arc<SignedIn>>,
}

/// Resolves the bearer token to a principal and attaches it to the request (as a
/// [`Caller`], and as a `Principal` for the MCP service); answers 401 when there is none
/// or it is not valid.
#[derive(Clone)]
pub struct RequireToken(pub AppState);

impl AsyncCheck for RequireToken {
    fn check(&self, mut req: Request) -> BoxFuture<'static, Result<Request, Response>> {
        let state = self.0.clone();
        Box::pin(async move {
            let token = bearer_token(req.headers())
                .map_err(|message| unauthorized(GateError::Unauthenticated(message)))?
                .to_string();
            match state.gate.authenticate(&token).await {
                Ok(principal) => {
                    req.extensions_mut().insert(principal.clone());
                    req.extensions_mut().insert(Authenticated {
                        principal,
                        channel: Channel::Api,
                        session: None,
                    });
                    Ok(req)
                }
                Err(err @ GateError::Unauthenticated(_)) => Err(unauthorized(err)),
                Err(err) => Err(ApiError(err).into_response()),
            }
        })
    }
}

/// Resolves the session cookie to a signed-in account and, on anything but a read,
/// checks the CSRF token the page sends in `X-CSRF-Token`; answers 401 without a valid
/// session and 403 without the right token.
#[derive(Clone)]
pub struct RequireSession(pub AppState);

impl AsyncCheck for RequireSession {
    fn check(&self, mut req: Request) -> BoxFuture<'static, Result<Request, Response>> {
        let state = self.0.clone();
        Box::pin(async move {
            let signed_in = signed_in(&state, req.headers())
                .await
                .map_err(|err| ApiError(err).into_response())?;
            if !matches!(*req.method(), Method::GET | Method::HEAD) {
                let sent = req
                    .headers()
                    .get("x-csrf-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !bool::from(sent.as_bytes().ct_eq(signed_in.csrf.as_bytes())) {
                    return Err(ApiError(GateError::Forbidden(
                        "missing or wrong CSRF token: reload the page and try again".into(),
                    ))
                    .into_response());
                }
            }
            req.extensions_mut().insert(Authenticated {
                principal: signed_in.user.principal(),
                channel: Channel::Dashboard,
                session: Some(Arc::new(signed_in)),
            });
            Ok(req)
        })
    }
}

/// Set on a request once [`RequireScope`] let it through.
#[derive(Clone, Copy)]
struct ScopeChecked;

/// Refuses (403) a caller whose credential lacks `scope`; the route tables put it on
/// every route.
#[derive(Clone)]
pub struct RequireScope(pub Scope);

impl Check for RequireScope {
    fn refusal(&self, req: &mut Request) -> Option<Response> {
        let scope = self.0;
        let Some(auth) = req.extensions().get::<Authenticated>() else {
            return Some(unauthorized(GateError::Unauthenticated(
                "this route needs a bearer token or a dashboard session".into(),
            )));
        };
        let who = &auth.principal;
        if !who.may(scope) {
            return Some(
                ApiError(GateError::Forbidden(format!(
                    "{} ({} token, scopes {}) may not do this: it needs the {scope} scope",
                    who.id, who.role, who.scopes
                )))
                .into_response(),
            );
        }
        req.extensions_mut().insert(ScopeChecked);
        None
    }
}

pub(super) fn bearer_token(headers: &HeaderMap) -> Result<&str, String> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        "missing bearer token: send `Authorization: Bearer <token>` (create one with `countersign token create`)".to_string()
    })?;
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not ASCII".to_string())?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| "the Authorization header must be `Bearer <token>`".to_string())?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(format!(
            "the Authorization scheme is {scheme:?}; countersign takes `Bearer <token>`"
        ));
    }
    Ok(token.trim())
}

fn unauthorized(err: GateError) -> Response {
    let mut response = ApiError(err).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"countersign\""),
    );
    response
}

/// The session cookie's value.
pub fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The account signed in with the request's session cookie.
pub async fn signed_in(state: &AppState, headers: &HeaderMap) -> Result<SignedIn, GateError> {
    let token =
        session_token(headers).ok_or_else(|| GateError::Unauthenticated("sign in first".into()))?;
    match state.gate.accounts().session(&token).await? {
        Some((user, session)) => Ok(SignedIn {
            user,
            csrf: session.csrf,
            token,
        }),
        None => Err(GateError::Unauthenticated(
            "your session ended; sign in again".into(),
        )),
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let auth = parts
            .extensions
            .get::<Authenticated>()
            .cloned()
            .ok_or_else(|| {
                ApiError(GateError::Unauthenticated(
                    "this route needs a bearer token or a dashboard session".into(),
                ))
            })?;
        if auth.session.is_none() && parts.extensions.get::<ScopeChecked>().is_none() {
            // A route table left this route without a scope: fail closed.
            return Err(ApiError(GateError::Internal(format!(
                "the route {} names no scope",
                parts.uri.path()
            ))));
        }
        Ok(Caller {
            gate: state.gate.clone(),
            who: auth.principal,
            channel: auth.channel,
            session: auth.session,
        })
    }
}

/// Extractors that narrow a [`Caller`]: each says what the caller must be, and refuses
/// everyone else before the handler runs.
macro_rules! narrows_caller {
    ($name:ident, |$caller:ident| $narrow:expr) => {
        impl FromRequestParts<AppState> for $name {
            type Rejection = ApiError;
            async fn from_request_parts(
                parts: &mut Parts,
                state: &AppState,
            ) -> Result<Self, Self::Rejection> {
                let $caller = Caller::from_request_parts(parts, state).await?;
                $narrow
            }
        }
    };
}

/// A caller allowed to decide: an approver or admin. Agents get 403.
pub struct Approver {
    pub gate: Arc<Gate>,
    pub decider: Decider,
    pub channel: Channel,
}

narrows_caller!(Approver, |caller| Ok(Approver {
    gate: caller.gate,
    decider: Decider::new(caller.who)?,
    channel: caller.channel,
}));

/// An admin. Everyone else gets 403.
pub struct Admin(pub Caller);

narrows_caller!(Admin, |caller| {
    if caller.who.role == Role::Admin {
        Ok(Admin(caller))
    } else {
        Err(ApiError(GateError::Forbidden(format!(
            "{} is not an admin; this needs an admin (token or account)",
            caller.who.id
        ))))
    }
});

/// A caller signed in through the dashboard (its account and session).
pub struct Dashboard(pub Arc<SignedIn>);

narrows_caller!(Dashboard, |caller| caller
    .session
    .map(Dashboard)
    .ok_or_else(|| ApiError(GateError::Unauthenticated(
        "sign in first".into()
    ))));
