//! Authentication as axum middleware and extractors. Roles are types: a handler that
//! takes an [`ApproverAuth`] cannot run for an agent credential.

use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use countersign_core::{Principal, Role};
use http::request::Parts;
use http::{HeaderValue, header};

use crate::AppState;
use crate::error::GateError;
use crate::gate::Decider;
use crate::rest::ApiError;

/// Resolves the bearer token to a principal and attaches it to the request; answers
/// 401 when there is none or it is not valid.
pub async fn require_token(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = match bearer_token(req.headers()) {
        Ok(token) => token,
        Err(message) => return unauthorized(GateError::Unauthenticated(message)),
    };
    match state.gate.authenticate(token).await {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(err @ GateError::Unauthenticated(_)) => unauthorized(err),
        Err(err) => ApiError(err).into_response(),
    }
}

fn bearer_token(headers: &http::HeaderMap) -> Result<&str, String> {
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

fn principal(parts: &Parts) -> Result<Principal, ApiError> {
    parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
        ApiError(GateError::Unauthenticated(
            "this route needs a bearer token".into(),
        ))
    })
}

/// Any authenticated caller.
pub struct AnyAuth(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for AnyAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        principal(parts).map(AnyAuth)
    }
}

/// A caller allowed to decide: an approver or admin token. Agents get 403.
pub struct ApproverAuth(pub Decider);

impl<S: Send + Sync> FromRequestParts<S> for ApproverAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(ApproverAuth(Decider::new(principal(parts)?)?))
    }
}

/// An admin token. Everyone else gets 403.
pub struct AdminAuth(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for AdminAuth {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let p = principal(parts)?;
        if p.role == Role::Admin {
            Ok(AdminAuth(p))
        } else {
            Err(ApiError(GateError::Forbidden(format!(
                "{} is not an admin; managing tokens needs an admin token",
                p.id
            ))))
        }
    }
}
