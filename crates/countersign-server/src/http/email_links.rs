//! The pages an emailed one-time decision link opens (`crate::links` issues and redeems
//! the tokens). `GET /email/decide` is static: the token stays in the URL fragment, and
//! the page's script sends it only in POST bodies; showing the request changes nothing,
//! and only the Confirm click (a POST) decides.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use countersign_core::{DecisionInput, Status, Verdict};

use serde_json::{Value, json};

use super::error::{ApiError, ApiJson};
use super::{AppState, Channels};
use crate::error::GateError;
use crate::links;
use crate::notify::outcome_line;
use crate::views::ApprovalView;
fn token_decisions_on(channels: &Option<Extension<Arc<Channels>>>) -> Result<(), GateError> {
    match channels {
        Some(Extension(c)) if c.config.email.as_ref().is_some_and(|e| e.token_decisions) => Ok(()),
        _ => Err(GateError::Forbidden(
            "Email decision links are off on this server: open the request in the dashboard."
                .into(),
        )),
    }
}

input!(TokenBody { token: String });

/// `POST /email/api/request`: what a token's page shows. Changes nothing.
pub(super) async fn token_request(
    State(state): State<AppState>,
    channels: Option<Extension<Arc<Channels>>>,
    ApiJson(body): ApiJson<TokenBody>,
) -> Result<Json<Value>, ApiError> {
    token_decisions_on(&channels)?;
    let gate = &state.gate;
    let record = links::lookup(gate, &body.token).await?.body;
    let decider = links::decider(gate, &record).await?;
    let request = gate.get(decider.principal(), &record.request_id).await?;
    Ok(Json(json!({
        "request": ApprovalView::new(&request),
        "approver": {"username": record.username, "display_name": decider.principal().display_name},
        "token_expires_at": record.expires_at,
        "can_decide": request.status == Status::Pending,
        "outcome": if request.status == Status::Pending { None } else { Some(outcome_line(&request)) },
        "dashboard_url": format!("/requests/{}", request.id),
    })))
}

input!(TokenDecisionBody { token: String, decision: String, #[serde(default)] comment: Option<String>, #[serde(default)] fields: BTreeMap<String, String> });

/// `POST /email/api/decision`: the Confirm click. Consumes the token, then decides as
/// the approver it is bound to (channel `email`, authenticated by `email_token`).
pub(super) async fn token_decision(
    State(state): State<AppState>,
    channels: Option<Extension<Arc<Channels>>>,
    ApiJson(body): ApiJson<TokenDecisionBody>,
) -> Result<Json<Value>, ApiError> {
    token_decisions_on(&channels)?;
    let verdict: Verdict = body.decision.parse()?;
    let input = DecisionInput {
        comment: body.comment.filter(|c| !c.trim().is_empty()),
        fields: body.fields,
    };
    let request = links::decide(&state.gate, &body.token, verdict, input).await?;
    Ok(Json(json!({
        "request": ApprovalView::new(&request),
        "outcome": outcome_line(&request),
    })))
}

const PAGE: &str = include_str!("../../assets/email.html");

/// `GET /email/decide`: the page a token link opens. Static: the token stays in the
/// fragment, and the page's script sends it only in POST bodies.
pub(super) async fn decide_page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        PAGE,
    )
        .into_response()
}
