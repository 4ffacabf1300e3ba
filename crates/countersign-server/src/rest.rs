//! The REST API under `/api/v1`, plus `/healthz` and the JWKS.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use countersign_core::{Channel, DecisionInput, Role, Status, TokenRecord};
use countersign_store::RequestQuery;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::auth::{AdminAuth, AnyAuth, ApproverAuth};
use crate::error::GateError;
use crate::mcp::{DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS, parse_decision};
use crate::views::{
    ApprovalView, DecisionBody, RequestApprovalInput, RequestApprovalOutput, VerifyOutput,
    VerifyProofInput,
};

/// An error as a JSON response: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug)]
pub struct ApiError(pub GateError);

impl From<GateError> for ApiError {
    fn from(err: GateError) -> Self {
        ApiError(err)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let err = self.0;
        if err.code() == "internal" {
            tracing::error!(%err, "request failed");
        }
        let body = serde_json::json!({
            "error": {"code": err.code(), "message": err.public_message()}
        });
        (err.status(), Json(body)).into_response()
    }
}

/// `Json<T>` whose rejections say what was wrong in countersign's error shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Response;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> Response {
    let (status, code) = match &rejection {
        JsonRejection::MissingJsonContentType(_) => {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
        }
        JsonRejection::BytesRejection(_) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        }
        _ => (StatusCode::BAD_REQUEST, "invalid_input"),
    };
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than max_body_bytes allows".to_string()
        }
        _ => rejection.body_text(),
    };
    error_response(status, code, message)
}

/// countersign's error shape, `{"error": {"code", "message"}}`, for an extractor's
/// rejection.
fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// `Query<T>` with countersign's error shape.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(query_rejection(&rejection)),
        }
    }
}

/// `Path<T>` with countersign's error shape (a path segment that does not parse, e.g. a
/// log index that is not a number, is a JSON 400 like every other bad input).
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(error_response(
                rejection.status(),
                "invalid_input",
                rejection.body_text(),
            )),
        }
    }
}

fn query_rejection(rejection: &QueryRejection) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        "invalid_input",
        rejection.body_text(),
    )
}

pub fn api_routes() -> Router<AppState> {
    Router::new()
        .route("/requests", post(create_request).get(list_requests))
        .route("/requests/{id}", get(get_request))
        .route("/requests/{id}/wait", get(wait_request))
        .route("/requests/{id}/decision", post(decide))
        .route("/requests/{id}/cancel", post(cancel))
        .route("/requests/{id}/actions", post(record_action))
        .route("/proofs/verify", post(verify_proof))
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}/revoke", post(revoke_token))
        .route("/requests/{id}/outcome", post(record_outcome))
        .route("/requests/{id}/review", post(record_review))
        .route("/decisions", post(record_decision))
        .route("/evidence/{subject}", get(get_evidence))
        .route("/evidence/verify", post(verify_evidence))
        .route("/deliveries", get(deliveries))
        .route("/log/checkpoint", get(log_checkpoint))
        .route("/log/key", get(log_key))
        .route("/log/entries/{index}", get(log_entry))
        .route("/log/proof/inclusion", get(inclusion_proof))
        .route("/log/proof/consistency", get(consistency_proof))
}

pub fn public_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/.well-known/jwks.json", get(jwks))
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.gate.store().check().await {
        Ok(()) => Json(serde_json::json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
            "kid": state.gate.keys().signer().kid(),
        }))
        .into_response(),
        Err(err) => {
            tracing::warn!(%err, "health check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "unavailable", "error": err.to_string()})),
            )
                .into_response()
        }
    }
}

async fn jwks(State(state): State<AppState>) -> Result<Response, ApiError> {
    // Another process may have rotated the key; the JWKS must include it.
    let _ = state.gate.keys().reload();
    Ok((
        [(http::header::CACHE_CONTROL, "public, max-age=300")],
        Json(state.gate.jwks().await?),
    )
        .into_response())
}

async fn create_request(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiJson(input): ApiJson<RequestApprovalInput>,
) -> Result<Response, ApiError> {
    let requested = state.gate.request_approval(&who, input.into()).await?;
    let status = if requested.existing {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(RequestApprovalOutput::new(
            &requested.request,
            requested.existing,
        )),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    status: Option<String>,
    requested_by: Option<String>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct RequestList {
    requests: Vec<ApprovalView>,
}

async fn list_requests(
    State(state): State<AppState>,
    ApproverAuth(decider): ApproverAuth,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<RequestList>, ApiError> {
    let status = params
        .status
        .as_deref()
        .map(str::parse::<Status>)
        .transpose()
        .map_err(GateError::from)?;
    let query = RequestQuery {
        status,
        requested_by: params.requested_by,
        limit: params.limit.unwrap_or(100).clamp(1, 1000),
    };
    let requests = state.gate.list(&decider, &query).await?;
    Ok(Json(RequestList {
        requests: requests.iter().map(ApprovalView::new).collect(),
    }))
}

async fn get_request(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = state.gate.get(&who, &id).await?;
    Ok(Json(ApprovalView::new(&request)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitParams {
    timeout_seconds: Option<u64>,
}

/// Long poll: returns as soon as the request is decided, or after `timeout_seconds`.
async fn wait_request(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<WaitParams>,
) -> Result<Json<ApprovalView>, ApiError> {
    let seconds = params.timeout_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
    if seconds > MAX_WAIT_SECONDS {
        return Err(GateError::BadInput(format!(
            "timeout_seconds is {seconds}; at most {MAX_WAIT_SECONDS} is allowed"
        ))
        .into());
    }
    let request = state
        .gate
        .wait(&who, &id, Duration::from_secs(seconds), &mut |_| {})
        .await?;
    Ok(Json(ApprovalView::new(&request)))
}

async fn decide(
    State(state): State<AppState>,
    ApproverAuth(decider): ApproverAuth,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<DecisionBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    let verdict = parse_decision(&body)?;
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
            Channel::Api,
        )
        .await?;
    Ok(Json(ApprovalView::new(&request)))
}

async fn cancel(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = state.gate.cancel(&who, &id).await?;
    Ok(Json(ApprovalView::new(&request)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    tool: String,
    #[serde(default)]
    details: std::collections::BTreeMap<String, String>,
}

async fn record_action(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ActionBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = state
        .gate
        .record_action(&who, &id, body.tool, body.details)
        .await?;
    Ok(Json(ApprovalView::new(&request)))
}

async fn verify_proof(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    ApiJson(input): ApiJson<VerifyProofInput>,
) -> Result<Json<VerifyOutput>, ApiError> {
    let action = input.action()?;
    let report = state
        .gate
        .verify_proof(&input.proof.into(), action.as_ref())
        .await?;
    Ok(Json(report.into()))
}

#[derive(Debug, Serialize)]
struct TokenView {
    id: String,
    name: String,
    role: Role,
    created_at: String,
    revoked_at: Option<String>,
}

impl From<&TokenRecord> for TokenView {
    fn from(t: &TokenRecord) -> Self {
        Self {
            id: t.id.clone(),
            name: t.name.clone(),
            role: t.role,
            created_at: t.created_at.to_string(),
            revoked_at: t.revoked_at.map(|r| r.to_string()),
        }
    }
}

async fn list_tokens(
    State(state): State<AppState>,
    AdminAuth(_admin): AdminAuth,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tokens = state.gate.list_tokens().await?;
    let views: Vec<TokenView> = tokens.iter().map(TokenView::from).collect();
    Ok(Json(serde_json::json!({ "tokens": views })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTokenBody {
    name: String,
    role: String,
}

async fn create_token(
    State(state): State<AppState>,
    AdminAuth(admin): AdminAuth,
    ApiJson(body): ApiJson<CreateTokenBody>,
) -> Result<Response, ApiError> {
    let role: Role = body.role.parse().map_err(GateError::BadInput)?;
    let (record, secret) = state.gate.create_token(&body.name, role, &admin).await?;
    let mut view = serde_json::to_value(TokenView::from(&record))
        .map_err(|e| GateError::BadInput(e.to_string()))?;
    view["token"] = serde_json::Value::String(secret);
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn revoke_token(
    State(state): State<AppState>,
    AdminAuth(admin): AdminAuth,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<TokenView>, ApiError> {
    let record = state.gate.revoke_token(&id, &admin).await?;
    Ok(Json(TokenView::from(&record)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutcomeBody {
    status: String,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    details: std::collections::BTreeMap<String, String>,
}

async fn record_outcome(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<OutcomeBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    let status = body.status.parse().map_err(GateError::from)?;
    let request = state
        .gate
        .record_outcome(&who, &id, status, body.summary, body.details)
        .await?;
    Ok(Json(ApprovalView::new(&request)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewBody {
    verdict: String,
    #[serde(default)]
    notes: Option<String>,
}

async fn record_review(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReviewBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    let verdict = body.verdict.parse().map_err(GateError::from)?;
    let request = state
        .gate
        .record_review(&who, &id, verdict, body.notes)
        .await?;
    Ok(Json(ApprovalView::new(&request)))
}

async fn record_decision(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiJson(input): ApiJson<crate::views::RecordDecisionInput>,
) -> Result<Response, ApiError> {
    let (record_id, log_index) = state.gate.record_decision(&who, input.into()).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"record_id": record_id, "log_index": log_index})),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvidenceParams {
    mode: Option<String>,
}

async fn get_evidence(
    State(state): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(subject): ApiPath<String>,
    ApiQuery(params): ApiQuery<EvidenceParams>,
) -> Result<Response, ApiError> {
    let mode = crate::views::parse_mode(params.mode.as_deref())?;
    let zip = state.gate.evidence(&who, &subject, mode).await?;
    let disposition = format!("attachment; filename=\"{subject}.evidence.zip\"");
    Ok((
        [
            (http::header::CONTENT_TYPE, "application/zip".to_string()),
            (http::header::CONTENT_DISPOSITION, disposition),
        ],
        zip,
    )
        .into_response())
}

async fn verify_evidence(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    body: axum::body::Bytes,
) -> Json<crate::views::BundleReportView> {
    Json(match state.gate.verify_evidence(&body).await {
        Ok(report) => report.into(),
        Err(err) => {
            tracing::error!(%err, "could not read the published keys");
            crate::views::BundleReportView {
                valid: false,
                reasons: vec![format!(
                    "the server could not read its keys: {}",
                    err.public_message()
                )],
                subject: None,
                mode: None,
                log_origin: None,
                tree_size: None,
                events: Vec::new(),
                decisions: 0,
            }
        }
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointParams {
    size: Option<u64>,
}

/// The signed checkpoint as a C2SP note (text/plain).
async fn log_checkpoint(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    ApiQuery(params): ApiQuery<CheckpointParams>,
) -> Result<Response, ApiError> {
    let checkpoint = state.gate.log().checkpoint(params.size).await?;
    Ok((
        [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        checkpoint.note,
    )
        .into_response())
}

async fn log_key(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
) -> Result<Json<serde_json::Value>, ApiError> {
    let origin = state.gate.log().origin().to_string();
    let keys: Vec<serde_json::Value> = state
        .gate
        .jwks()
        .await?
        .keys
        .iter()
        .map(|jwk| {
            serde_json::json!({
                "kid": jwk.kid,
                "verifier_key": countersign_core::checkpoint::verifier_key(&origin, jwk),
            })
        })
        .collect();
    Ok(Json(serde_json::json!({"origin": origin, "keys": keys})))
}

async fn log_entry(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    ApiPath(index): ApiPath<u64>,
) -> Result<Json<serde_json::Value>, ApiError> {
    use base64::Engine;
    let event = state.gate.log().entry(index).await?;
    let leaf = countersign_core::merkle::leaf_hash(&event.bytes);
    let engine = base64::engine::general_purpose::STANDARD;
    Ok(Json(serde_json::json!({
        "index": index,
        "leaf_hash": engine.encode(leaf),
        "entry_base64": engine.encode(&event.bytes),
        "entry": event.entry,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InclusionParams {
    index: u64,
    tree_size: Option<u64>,
}

async fn inclusion_proof(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    ApiQuery(params): ApiQuery<InclusionParams>,
) -> Result<Json<countersign_core::bundle::InclusionProof>, ApiError> {
    Ok(Json(
        state
            .gate
            .log()
            .inclusion(params.index, params.tree_size)
            .await?,
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsistencyParams {
    first: u64,
    second: u64,
}

async fn consistency_proof(
    State(state): State<AppState>,
    AnyAuth(_who): AnyAuth,
    ApiQuery(params): ApiQuery<ConsistencyParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    use base64::Engine;
    let path = state
        .gate
        .log()
        .consistency(params.first, params.second)
        .await?;
    let engine = base64::engine::general_purpose::STANDARD;
    Ok(Json(serde_json::json!({
        "first": params.first,
        "second": params.second,
        "path": path.iter().map(|h| engine.encode(h)).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryParams {
    limit: Option<usize>,
}

/// Notification deliveries (webhooks, Slack, email), newest first: admins only.
async fn deliveries(
    State(state): State<AppState>,
    AdminAuth(_admin): AdminAuth,
    ApiQuery(params): ApiQuery<DeliveryParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = params.limit.unwrap_or(100).clamp(1, 1000);
    let history = crate::notify::history(state.gate.store(), limit).await?;
    let views: Vec<serde_json::Value> = history
        .iter()
        .map(|d| {
            serde_json::json!({
                "id": d.id,
                "message_id": d.message_id,
                "event_type": d.event_type,
                "subject": d.subject,
                "channel": d.channel.label(),
                "status": d.status,
                "attempts": d.attempts,
                "last_error": d.last_error,
                "created_at": d.created_at.to_string(),
                "next_at": d.next_at.to_string(),
                "finished_at": d.finished_at.map(|t| t.to_string()),
            })
        })
        .collect();
    Ok(Json(serde_json::json!({"deliveries": views})))
}
