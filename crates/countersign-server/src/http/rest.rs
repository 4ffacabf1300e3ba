//! The REST API's handlers: `/api/v1` (bearer tokens), plus `/healthz` and the JWKS.
//! `get_request` and `decide` also serve the dashboard under `/ui/api` (see the route
//! tables in `http/mod.rs`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;

use countersign_core::{
    ApprovalRequest, DecisionInput, Role, Scopes, Status, TokenRecord, Verdict,
};
use countersign_store::RequestQuery;
use serde::Serialize;

use super::AppState;
use super::auth::{Admin, Approver, Caller};
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery};
use crate::error::GateError;
use crate::gate::{DEFAULT_WAIT_SECONDS, EntryShown, NewToken, wait_time};
use crate::views::{
    ApprovalView, BatchBody, BatchView, DecisionBody, GrantView, NewGrantBody, RedeemOutput,
    RedeemProofInput, RequestApprovalInput, RequestApprovalOutput, RequestView, ReviewOutput,
    VerifyOutput, VerifyProofInput,
};

/// Public: whether the server and its database answer. Why the database does not is
/// shown only to an admin's token (it may name hosts, users or paths); everyone else,
/// and the server's log, get the rest.
pub(super) async fn healthz(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    match state.gate.store().check().await {
        Ok(()) => {
            let mut body = serde_json::json!({
                "status": "ok",
                "version": env!("CARGO_PKG_VERSION"),
                "kid": state.gate.keys().signer().kid(),
            });
            // The detail is for admins only: with an admin's bearer token.
            if let Some(detail) = health_detail(&state, &headers).await {
                body["detail"] = detail;
            }
            Json(body).into_response()
        }
        Err(err) => {
            tracing::warn!(%err, "health check failed");
            let admin = match super::auth::bearer_token(&headers) {
                Ok(token) => state
                    .gate
                    .authenticate(token)
                    .await
                    .is_ok_and(|who| who.role == Role::Admin),
                Err(_) => false,
            };
            let error = if admin {
                err.to_string()
            } else {
                "the database is not answering; the server's log (or /healthz with an admin token) has the details".to_string()
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "unavailable", "error": error})),
            )
                .into_response()
        }
    }
}

/// What `/healthz` adds for an admin: the scheduled audit's last result.
async fn health_detail(state: &AppState, headers: &http::HeaderMap) -> Option<serde_json::Value> {
    let token = super::auth::bearer_token(headers).ok()?;
    let who = state.gate.authenticate(token).await.ok()?;
    if !who.may(countersign_core::Scope::Admin) {
        return None;
    }
    let audit = match crate::audit::last(&state.gate).await {
        Ok(Some(status)) => serde_json::json!({
            "status": if status.ok { "ok" } else { "mismatch" },
            "at": status.at,
            "entries": status.entries,
            "rows": status.rows,
            "differences": status.differences,
            "shown": status.shown,
        }),
        Ok(None) => serde_json::json!({"status": "not run (see [audit] interval)"}),
        Err(err) => serde_json::json!({"status": "unreadable", "error": err.to_string()}),
    };
    Some(serde_json::json!({"audit": audit}))
}

pub(super) async fn jwks(State(state): State<AppState>) -> Result<Response, ApiError> {
    // Another process may have rotated the key; the JWKS must include it.
    let _ = state.gate.keys().reload();
    Ok((
        [(http::header::CACHE_CONTROL, "public, max-age=300")],
        Json(state.gate.jwks().await?),
    )
        .into_response())
}

/// `/.well-known/looppause-signing-key.json`: the same keys in LoopPause's shape (the
/// LoopPause profile, docs/migrating.md).
pub(super) async fn looppause_signing_key(
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let _ = state.gate.keys().reload();
    let jwks = state.gate.jwks().await?;
    let current = state.gate.keys().signer().kid().to_string();
    Ok((
        [(http::header::CACHE_CONTROL, "public, max-age=300")],
        Json(crate::mcp::looppause::signing_key_document(&jwks, &current)),
    )
        .into_response())
}

pub(super) async fn create_request(
    Caller { gate, who, .. }: Caller,
    ApiJson(input): ApiJson<RequestApprovalInput>,
) -> Result<Response, ApiError> {
    let quorum = input.quorum();
    let requested = gate
        .request_approval_with(&who, input.into(), quorum)
        .await?;
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

input!(ListParams { status: Option<String>, requested_by: Option<String>, limit: Option<usize> });

#[derive(Debug, Serialize)]
pub(super) struct RequestList {
    requests: Vec<ApprovalView>,
}

pub(super) async fn list_requests(
    Approver { gate, decider, .. }: Approver,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<RequestList>, ApiError> {
    let status = params
        .status
        .as_deref()
        .map(str::parse::<Status>)
        .transpose()?;
    let query = RequestQuery {
        status,
        requested_by: params.requested_by,
        limit: params.limit.unwrap_or(100).clamp(1, 1000),
    };
    let requests = gate.list(&decider, &query).await?;
    Ok(Json(RequestList {
        requests: requests.iter().map(ApprovalView::new).collect(),
    }))
}

input!(OwnParams { status: Option<String>, limit: Option<usize> });

/// The caller's own requests (any token with the request scope): an agent sees only
/// its own, so this is all it may list.
pub(super) async fn own_requests(
    Caller { gate, who, .. }: Caller,
    ApiQuery(params): ApiQuery<OwnParams>,
) -> Result<Json<RequestList>, ApiError> {
    let status = params
        .status
        .as_deref()
        .map(str::parse::<Status>)
        .transpose()?;
    let limit = params.limit.unwrap_or(100).clamp(1, 10_000);
    let requests = gate.own_requests(&who, status, limit).await?;
    Ok(Json(RequestList {
        requests: requests.iter().map(ApprovalView::new).collect(),
    }))
}

pub(super) async fn get_request(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<RequestView>, ApiError> {
    let request = gate.get(&who, &id).await?;
    let accounts = gate.accounts_for(&request, &who);
    Ok(Json(RequestView::new(&request, &who, &accounts)))
}

input!(WaitParams { timeout_seconds: Option<u64> });

/// Long poll: returns as soon as the request is decided, or after `timeout_seconds`.
pub(super) async fn wait_request(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<WaitParams>,
) -> Result<Json<ApprovalView>, ApiError> {
    let timeout = wait_time(params.timeout_seconds, DEFAULT_WAIT_SECONDS)?;
    let request = gate.wait(&who, &id, timeout, &mut |_| {}).await?;
    Ok(Json(ApprovalView::new(&request)))
}

/// A person decides: with an approver or admin token (channel `api`), or signed in to
/// the dashboard (channel `dashboard`). `expected_version`, when given, is the version
/// the decider saw: a request closed since is reported as what closed it.
pub(super) async fn decide(
    Approver {
        gate,
        decider,
        channel,
    }: Approver,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<DecisionBody>,
) -> Result<Json<RequestView>, ApiError> {
    let verdict: Verdict = body.decision.parse()?;
    let input = DecisionInput {
        comment: body.comment,
        fields: body.fields,
    };
    // A grant asked for with the approval is checked before anything is decided, and
    // given once the approval is final.
    let grant = match body.grant {
        Some(_) if verdict != Verdict::Approved => {
            return Err(GateError::BadInput(
                "grant: a standing grant comes with an approval, not a rejection".into(),
            )
            .into());
        }
        Some(terms) => {
            let request = gate.get(decider.principal(), &id).await?;
            let new = gate.grant_for(&request, terms.into())?;
            gate.check_grant(&decider, &new)?;
            Some(new)
        }
        None => None,
    };
    let request = gate
        .decide_seen(
            &decider,
            &id,
            body.expected_version,
            verdict,
            input,
            channel,
        )
        .await?;
    // The approval stands whatever becomes of the grant: a grant that cannot be stored
    // now (it was checked before deciding) is reported beside the approval, not as an
    // error that would hide it.
    let (granted, grant_error) = match grant {
        Some(new) if request.status == countersign_core::Status::Approved => {
            match gate.create_grant(&decider, new, channel).await {
                Ok(grant) => (Some(grant), None),
                Err(err) => {
                    tracing::warn!(request = %request.id, %err, "approved, but the grant asked for with it was not stored");
                    (
                        None,
                        Some(format!(
                            "approved; the grant was not given: {}",
                            err.public_message()
                        )),
                    )
                }
            }
        }
        _ => (None, None),
    };
    let accounts = gate.accounts_for(&request, decider.principal());
    let mut view = RequestView::new(&request, decider.principal(), &accounts);
    view.grant = granted.map(|g| GrantView::new(g, gate.now()));
    view.grant_error = grant_error;
    Ok(Json(view))
}

/// Many decisions with one confirmation: each request at the version it was selected
/// at, each with its own proof; those that changed meanwhile are reported, not decided.
pub(super) async fn decide_batch(
    Approver {
        gate,
        decider,
        channel,
    }: Approver,
    ApiJson(body): ApiJson<BatchBody>,
) -> Result<Json<BatchView>, ApiError> {
    let verdict: Verdict = body.decision.parse()?;
    let selected: Vec<(String, u64)> = body
        .requests
        .into_iter()
        .map(|r| (r.id, r.version))
        .collect();
    let input = DecisionInput {
        comment: body.comment,
        fields: BTreeMap::new(),
    };
    let batch = gate
        .decide_batch(&decider, &selected, verdict, input, channel)
        .await?;
    Ok(Json(BatchView::of(&batch)))
}

input!(GrantListParams { limit: Option<usize> });

input!(RecordsParams {
    bridge: Option<String>,
    n: Option<usize>,
});

/// The bridged processes' records joined with their requests (docs/bridge.md): the
/// dashboard view, or the summary with the `n` most recent when `n` is given
/// (approvers).
pub(super) async fn records(
    State(state): State<AppState>,
    Approver { gate, decider, .. }: Approver,
    ApiQuery(params): ApiQuery<RecordsParams>,
) -> Result<Json<crate::bridge::records::RecordsReport>, ApiError> {
    use crate::bridge::records::{RecordsView, report};
    let view = match params.n {
        Some(recent) => RecordsView::Summary { recent },
        None => RecordsView::Dashboard,
    };
    let report = report(
        &gate,
        &decider,
        &state.bridges,
        params.bridge.as_deref(),
        view,
    )
    .await?;
    Ok(Json(report))
}

/// Standing grants, newest first (approvers).
pub(super) async fn list_grants(
    Approver { gate, decider, .. }: Approver,
    ApiQuery(params): ApiQuery<GrantListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = params.limit.unwrap_or(200).clamp(1, 1000);
    let now = gate.now();
    let grants: Vec<GrantView> = gate
        .list_grants(&decider, limit)
        .await?
        .into_iter()
        .map(|g| GrantView::new(g, now))
        .collect();
    Ok(Json(serde_json::json!({"grants": grants})))
}

/// A standing grant on its own, by an approver.
pub(super) async fn create_grant(
    Approver {
        gate,
        decider,
        channel,
    }: Approver,
    ApiJson(body): ApiJson<NewGrantBody>,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
    let new = countersign_core::NewGrant {
        agent: body.agent,
        tool: body.tool,
        exact: body.exact,
        max: body.max,
        for_seconds: body
            .for_seconds
            .unwrap_or(crate::gate::DEFAULT_GRANT_SECONDS),
        max_uses: body.max_uses,
        from_request: None,
    };
    let grant = gate.create_grant(&decider, new, channel).await?;
    let now = gate.now();
    Ok((StatusCode::CREATED, Json(GrantView::new(grant, now))))
}

/// Revokes a grant at once (its maker or an admin).
pub(super) async fn revoke_grant(
    Approver { gate, decider, .. }: Approver,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<GrantView>, ApiError> {
    let grant = gate.revoke_grant(&decider, &id).await?;
    let now = gate.now();
    Ok(Json(GrantView::new(grant, now)))
}

pub(super) async fn cancel(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = gate.cancel(&who, &id).await?;
    Ok(Json(ApprovalView::new(&request)))
}

pub(super) async fn verify_proof(
    Caller { gate, .. }: Caller,
    ApiJson(input): ApiJson<VerifyProofInput>,
) -> Result<Json<VerifyOutput>, ApiError> {
    let action = input.action()?;
    let report = gate
        .verify_proof(&input.proof.into(), action.as_ref())
        .await?;
    Ok(Json(report.into()))
}

/// A relying party redeems a proof for the exact action it is about to perform: once.
pub(super) async fn redeem_proof(
    Caller { gate, who, .. }: Caller,
    ApiJson(input): ApiJson<RedeemProofInput>,
) -> Result<Json<RedeemOutput>, ApiError> {
    let action = input.action();
    let redeemed = gate
        .redeem_proof(&who, &input.proof.into(), &action)
        .await?;
    Ok(Json(RedeemOutput::new(&redeemed)))
}

#[derive(Debug, Serialize)]
pub(super) struct TokenView {
    id: String,
    name: String,
    role: Role,
    /// What it may reach: its own scopes, or all of its role's.
    scopes: Scopes,
    /// Whether it was narrowed to `scopes` (rather than having all of its role's).
    scoped: bool,
    created_at: String,
    expires_at: Option<String>,
    revoked_at: Option<String>,
    /// active, expired or revoked.
    status: &'static str,
}

impl TokenView {
    fn new(t: &TokenRecord, now: countersign_core::Timestamp) -> Self {
        Self {
            id: t.id.clone(),
            name: t.name.clone(),
            role: t.role,
            scopes: t.effective_scopes(),
            scoped: t.scopes.is_some(),
            created_at: t.created_at.to_string(),
            expires_at: t.expires_at.map(|r| r.to_string()),
            revoked_at: t.revoked_at.map(|r| r.to_string()),
            status: t.status(now),
        }
    }
}

pub(super) async fn list_tokens(
    Admin(Caller { gate, .. }): Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tokens = gate.list_tokens().await?;
    let now = gate.now();
    let views: Vec<TokenView> = tokens.iter().map(|t| TokenView::new(t, now)).collect();
    Ok(Json(serde_json::json!({ "tokens": views })))
}

input!(CreateTokenBody {
    name: String,
    role: String,
    /// A duration (`30d`) or an RFC 3339 time; absent: it never expires.
    #[serde(default)]
    expires: Option<String>,
    /// A subset of the role's scopes; absent: all of them.
    #[serde(default)]
    scopes: Option<Vec<String>>,
});

pub(super) async fn create_token(
    Admin(admin): Admin,
    ApiJson(body): ApiJson<CreateTokenBody>,
) -> Result<Response, ApiError> {
    let role: Role = body.role.parse().map_err(GateError::BadInput)?;
    let scopes = body
        .scopes
        .map(|list| Scopes::parse_list(&list.join(",")))
        .transpose()
        .map_err(|e| GateError::BadInput(format!("invalid scopes: {e}")))?;
    let new = NewToken {
        name: body.name,
        role,
        expires: body.expires,
        scopes,
    };
    let (record, secret) = admin.gate.create_token_as(new, &admin.who).await?;
    let mut view = serde_json::to_value(TokenView::new(&record, admin.gate.now()))
        .map_err(|e| GateError::internal("encode a token", e))?;
    view["token"] = serde_json::Value::String(secret);
    Ok(super::created(view))
}

pub(super) async fn revoke_token(
    Admin(admin): Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<TokenView>, ApiError> {
    let record = admin.gate.revoke_token(&id, &admin.who).await?;
    Ok(Json(TokenView::new(&record, admin.gate.now())))
}

input!(ActionBody { tool: String, #[serde(default)] details: BTreeMap<String, String> });
input!(OutcomeBody { status: String, #[serde(default)] summary: Option<String>, #[serde(default)] details: BTreeMap<String, String> });
input!(ReviewBody { verdict: String, #[serde(default)] notes: Option<String> });

/// What the requester records about a request after its decision: the action taken,
/// its outcome.
pub(super) trait Record: serde::de::DeserializeOwned + Send {
    fn record(
        self,
        call: &Caller,
        id: &str,
    ) -> impl Future<Output = Result<ApprovalRequest, GateError>> + Send;
}

impl Record for ActionBody {
    async fn record(self, call: &Caller, id: &str) -> Result<ApprovalRequest, GateError> {
        let (tool, details) = (self.tool, self.details);
        call.gate.record_action(&call.who, id, tool, details).await
    }
}

impl Record for OutcomeBody {
    async fn record(self, call: &Caller, id: &str) -> Result<ApprovalRequest, GateError> {
        let (status, summary) = (self.status.parse()?, self.summary);
        let gate = &call.gate;
        gate.record_outcome(&call.who, id, status, summary, self.details)
            .await
    }
}

/// `POST /requests/{id}/review`: the configured reviewer's review, once per request;
/// answered with the review as recorded.
pub(super) async fn review(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReviewBody>,
) -> Result<Json<ReviewOutput>, ApiError> {
    let verdict = body.verdict.parse()?;
    let request = gate.record_review(&who, &id, verdict, body.notes).await?;
    Ok(Json(ReviewOutput::new(&request, &who.id)))
}

/// `POST /requests/{id}/actions` and `/outcome`.
pub(super) async fn record<B: Record>(
    call: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<B>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = body.record(&call, &id).await?;
    Ok(Json(ApprovalView::new(&request)))
}

pub(super) async fn record_decision(
    Caller { gate, who, .. }: Caller,
    ApiJson(input): ApiJson<crate::views::RecordDecisionInput>,
) -> Result<Response, ApiError> {
    let (record_id, log_index) = gate.record_decision(&who, input.into()).await?;
    Ok(super::created(
        serde_json::json!({"record_id": record_id, "log_index": log_index}),
    ))
}

input!(EvidenceParams { mode: Option<String> });

pub(super) async fn get_evidence(
    Caller { gate, who, .. }: Caller,
    ApiPath(subject): ApiPath<String>,
    ApiQuery(params): ApiQuery<EvidenceParams>,
) -> Result<Response, ApiError> {
    let mode = crate::views::parse_mode(params.mode.as_deref())?;
    let zip = gate.evidence(&who, &subject, mode).await?;
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

pub(super) async fn verify_evidence(
    Caller { gate, .. }: Caller,
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Response {
    use axum::extract::FromRequest;
    // The turn first, the body after: an upload the server is too busy for is refused
    // (503, retry) before its bytes are read. What the bundle itself gets wrong is in
    // the report.
    let turn = match gate.evidence_turn().await {
        Ok(turn) => turn,
        Err(err) => return ApiError(err).into_response(),
    };
    let body = match axum::body::Bytes::from_request(request, &state).await {
        Ok(body) => body,
        Err(rejection) => return rejection.into_response(),
    };
    match gate.verify_evidence_in(turn, Vec::from(body)).await {
        Ok(report) => Json(crate::views::BundleReportView::from(report)).into_response(),
        Err(err) => ApiError(err).into_response(),
    }
}

input!(CheckpointParams { size: Option<u64> });

/// The signed checkpoint as a C2SP note (text/plain).
pub(super) async fn log_checkpoint(
    Caller { gate, .. }: Caller,
    ApiQuery(params): ApiQuery<CheckpointParams>,
) -> Result<Response, ApiError> {
    let checkpoint = gate.log().checkpoint(params.size).await?;
    Ok((
        [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        checkpoint.note,
    )
        .into_response())
}

pub(super) async fn log_key(
    Caller { gate, .. }: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let origin = gate.log().origin().to_string();
    let keys: Vec<serde_json::Value> = gate
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

/// A log entry: whole to who may read it, else its index, type and commitments only
/// (the leaf hash still proves its place in the tree).
pub(super) async fn log_entry(
    Caller { gate, who, .. }: Caller,
    ApiPath(index): ApiPath<u64>,
) -> Result<Json<serde_json::Value>, ApiError> {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    Ok(Json(match gate.log_entry(&who, index).await? {
        EntryShown::Full(event) => serde_json::json!({
            "index": index,
            "leaf_hash": engine.encode(countersign_core::merkle::leaf_hash(&event.bytes)),
            "entry_base64": engine.encode(&event.bytes),
            "entry": event.entry,
        }),
        EntryShown::Redacted(event) => serde_json::json!({
            "index": index,
            "leaf_hash": engine.encode(countersign_core::merkle::leaf_hash(&event.bytes)),
            "type": event.entry.kind,
            "payload": event.entry.payload,
            "redacted": true,
        }),
    }))
}

input!(InclusionParams { index: u64, tree_size: Option<u64> });

pub(super) async fn inclusion_proof(
    Caller { gate, .. }: Caller,
    ApiQuery(params): ApiQuery<InclusionParams>,
) -> Result<Json<countersign_core::bundle::InclusionProof>, ApiError> {
    Ok(Json(
        gate.log().inclusion(params.index, params.tree_size).await?,
    ))
}

input!(ConsistencyParams {
    first: u64,
    second: u64
});

pub(super) async fn consistency_proof(
    Caller { gate, .. }: Caller,
    ApiQuery(params): ApiQuery<ConsistencyParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    use base64::Engine;
    let path = gate.log().consistency(params.first, params.second).await?;
    let engine = base64::engine::general_purpose::STANDARD;
    Ok(Json(serde_json::json!({
        "first": params.first,
        "second": params.second,
        "path": path.iter().map(|h| engine.encode(h)).collect::<Vec<_>>(),
    })))
}

input!(DeliveryParams { limit: Option<usize> });

/// Notification deliveries (webhooks, Slack, email), newest first: admins only.
pub(super) async fn deliveries(
    Admin(Caller { gate, .. }): Admin,
    ApiQuery(params): ApiQuery<DeliveryParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = params.limit.unwrap_or(100).clamp(1, 1000);
    let history = crate::notify::history(gate.store(), limit).await?;
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
