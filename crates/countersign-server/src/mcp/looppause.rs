//! The LoopPause profile: LoopPause's three MCP tools (`request_approval`,
//! `check_approval`, `verify_proof`) with its parameter names, statuses and result
//! shapes, over countersign's one model, so that an agent written for LoopPause works
//! with only its MCP server config changed (docs/migrating.md, "From LoopPause").
//! Served by `countersign mcp --profile looppause` (stdio) and at
//! `/mcp/profile/looppause` (Streamable HTTP, the same token rules as `/mcp`).
//!
//! The statuses map explicitly: countersign's `pending` is `pending`; `approved` and
//! `rejected` are `responded` (with `response.decision`); `timed_out` is `timed_out`;
//! `cancelled` (withdrawn by hand) is `expired`, which LoopPause's page defines as a
//! pause cancelled by hand. `authorization_type` keeps countersign's values except
//! `fallback`, which LoopPause calls `system_fallback`.
//!
//! `verify_proof` takes the whole `check_approval` result (or the DSSE proof alone) and
//! runs countersign's own DSSE/Ed25519 verification on the proof inside; when given the
//! whole result it also checks that every decision field the result shows
//! (`response.decision`, `comment`, `fields`, `nonce`, `signature`, ...) is the signed
//! one, so an edited result is never `valid`.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use countersign_core::proof::Envelope;
use countersign_core::{ApprovalRequest, AuthorizationType, Principal, Scope, Status};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, RoleServer, ServerHandler, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Identity, ToolError, http_principal};
use crate::error::GateError;
use crate::gate::Gate;
use crate::views::{ProblemView, ProofView, enum_str};

/// The profile's name, in `--profile` and `/mcp/profile/<name>`.
pub const PROFILE: &str = "looppause";

const INSTRUCTIONS: &str = "LoopPause-compatible approval tools, served by countersign. Before \
any consequential action call request_approval, then call check_approval with the pause_id \
until status is not pending. Act only when status is responded, response.decision is approved, \
and verify_proof on the whole check_approval result answers valid: true. Never act on pending, \
timed_out or expired.";

const MANDATORY_NEXT_STEP: &str = "You MUST call check_approval with this pause_id and wait for decision: 'approved' before taking any action. Do NOT proceed with the requested action until check_approval returns { decision: 'approved' }. Proceeding without approval is a safety violation.";

/// What `verify_proof` says beside `valid: false`.
pub const FAILED_WARNING: &str = "Proof verification FAILED. Do NOT execute the action.";

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestInput {
    /// What the agent is about to do (shown to the human).
    pub action_description: String,
    /// Key-value context (amount, vendor, ...). The approval is bound to these.
    #[serde(default)]
    pub action_details: BTreeMap<String, String>,
    /// Email address of an approver (only known approvers are accepted; the server's
    /// configured routes are notified in any case).
    #[serde(default)]
    pub recipient_email: Option<String>,
    /// Slack channel (#approvals) or user ID (U12345) of an approver.
    #[serde(default)]
    pub recipient_slack: Option<String>,
    /// Hours to wait for a response (default 24, max 168).
    #[serde(default)]
    pub timeout_hours: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestOutput {
    pub pause_id: String,
    /// `pending`.
    pub status: String,
    pub expires_at: String,
    /// `sha256:` + hex of the action the approval is bound to.
    pub action_digest: String,
    #[serde(rename = "MANDATORY_NEXT_STEP")]
    pub mandatory_next_step: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckInput {
    /// The pause_id returned by request_approval.
    pub pause_id: String,
}

/// The human's (or policy's) response, with the signature LoopPause shows.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ResponseView {
    /// approved or rejected.
    pub decision: String,
    pub comment: Option<String>,
    pub fields: BTreeMap<String, String>,
    /// Who responded (the approver's id; several, comma-separated, for a quorum).
    pub responder: String,
    pub responded_at: String,
    /// Where: slack, email, dashboard, api, cli, mcp; `policy` for a policy decision.
    pub channel: String,
    /// human, policy, grant, or system_fallback (a configured default, not a person).
    pub authorization_type: String,
    /// The approval may be acted on until this time, once.
    pub valid_until: String,
    pub nonce: String,
    pub signing_key_id: String,
    pub signature_alg: String,
    /// `ed25519=` + base64url of the DSSE signature over `proof`.
    pub signature: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CheckOutput {
    pub pause_id: String,
    /// The requester's id (authenticated, not claimed).
    pub agent_id: String,
    /// pending, responded, timed_out or expired.
    pub status: String,
    pub created_at: String,
    pub expires_at: String,
    pub action_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseView>,
    /// The signed DSSE envelope the response comes from (verify it with verify_proof or
    /// verifyLoopPauseProof / verify_looppause_proof).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<ProofView>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyInput {
    /// The full result of check_approval (or its `proof` alone).
    pub proof: Value,
    /// The action about to be performed; when given, the proof must be for exactly it.
    #[serde(default)]
    pub action_description: Option<String>,
    #[serde(default)]
    pub action_details: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct VerifyOutput {
    pub valid: bool,
    pub verified_at: String,
    /// The key that signed it (the proof's signing key id when the signature failed).
    pub key_id: Option<String>,
    /// Set when it is not valid, or when the action was not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Whether the proof was checked against the action given.
    pub bound: bool,
    /// Every reason it is not valid.
    pub reasons: Vec<ProblemView>,
    pub pause_id: Option<String>,
    pub decision: Option<String>,
}

/// countersign's status as LoopPause's.
pub fn status(s: Status) -> &'static str {
    match s {
        Status::Pending => "pending",
        Status::Approved | Status::Rejected => "responded",
        Status::TimedOut => "timed_out",
        Status::Cancelled => "expired",
    }
}

/// countersign's authorization type as LoopPause's.
pub fn authorization_type(t: AuthorizationType) -> String {
    match t {
        AuthorizationType::Fallback => "system_fallback".to_string(),
        other => enum_str(&other),
    }
}

impl CheckOutput {
    pub fn new(request: &ApprovalRequest) -> Self {
        let statement = request
            .proof
            .as_ref()
            .and_then(Envelope::unverified_statement);
        let response = match (&request.decision, &request.proof) {
            (Some(d), Some(proof)) => {
                let sig = proof.signatures.first();
                let channel = match d.authorization_type {
                    AuthorizationType::Policy | AuthorizationType::Fallback => "policy".into(),
                    _ => d
                        .approvers
                        .first()
                        .map(|a| a.channel.as_str().to_string())
                        .unwrap_or_default(),
                };
                Some(ResponseView {
                    decision: d.decision.as_str().to_string(),
                    comment: d.comment.clone(),
                    fields: d.fields.clone(),
                    responder: responder(d),
                    responded_at: d.decided_at.to_string(),
                    channel,
                    authorization_type: authorization_type(d.authorization_type),
                    valid_until: d.valid_until.to_string(),
                    nonce: statement.map(|s| s.nonce).unwrap_or_default(),
                    signing_key_id: sig.map(|s| s.keyid.clone()).unwrap_or_default(),
                    signature_alg: "Ed25519".into(),
                    signature: sig.map(|s| signature_text(&s.sig)).unwrap_or_default(),
                })
            }
            _ => None,
        };
        let message = match request.status {
            Status::Pending => "pending: the human has not responded yet. Call check_approval again; do NOT proceed.".to_string(),
            Status::Approved => "responded: approved. Call verify_proof with this whole result before executing the action, once.".to_string(),
            Status::Rejected => "responded: rejected. Do NOT execute the action.".to_string(),
            Status::TimedOut => "timed_out: no response in time; it is NOT approved. Do NOT execute the action.".to_string(),
            Status::Cancelled => "expired: the pause was cancelled; it is NOT approved. Do NOT execute the action.".to_string(),
        };
        Self {
            pause_id: request.id.clone(),
            agent_id: request.requested_by.id.clone(),
            status: status(request.status).to_string(),
            created_at: request.requested_at.to_string(),
            expires_at: request.expires_at.to_string(),
            action_digest: request.action_digest.to_string(),
            response,
            proof: request.proof.as_ref().map(ProofView::from),
            message,
        }
    }
}

fn responder(d: &countersign_core::Decision) -> String {
    if let Some(p) = &d.policy
        && d.approvers.is_empty()
    {
        return format!("policy:{}", p.id);
    }
    d.approvers
        .iter()
        .map(|a| a.id.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `ed25519=` + base64url (unpadded) of a DSSE signature (standard base64).
fn signature_text(sig: &str) -> String {
    match STANDARD.decode(sig) {
        Ok(bytes) => format!("ed25519={}", URL_SAFE_NO_PAD.encode(bytes)),
        Err(_) => String::new(),
    }
}

/// The DSSE envelope in what `verify_proof` was given: the envelope itself, or the
/// `proof` of a whole `check_approval` result. With the result, also the fields it shows
/// that must match the signed statement.
fn envelope_of(given: &Value) -> Result<(Envelope, Option<&Value>), String> {
    let (envelope, whole) = if given.get("payloadType").is_some() {
        (given, None)
    } else if let Some(inner) = given.get("proof").filter(|p| p.is_object()) {
        (inner, Some(given))
    } else if given.get("status").is_some() {
        return Err(format!(
            "this check_approval result has no proof: its status is {}, not responded",
            given["status"]
        ));
    } else {
        return Err("no proof here: give the whole check_approval result, or its proof (a DSSE envelope with payloadType, payload and signatures)".into());
    };
    let view: ProofView = serde_json::from_value(envelope.clone())
        .map_err(|e| format!("the proof is not a DSSE envelope: {e}"))?;
    Ok((view.into(), whole))
}

/// Where the fields a whole `check_approval` result shows differ from the signed
/// statement and envelope (empty when they agree).
fn result_mismatches(whole: &Value, envelope: &Envelope) -> Vec<String> {
    let Some(statement) = envelope.unverified_statement() else {
        return Vec::new(); // the verification reports it
    };
    let mut bad = Vec::new();
    let mut check = |name: &str, shown: Option<&Value>, signed: Value| {
        if let Some(shown) = shown
            && *shown != signed
        {
            bad.push(name.to_string());
        }
    };
    check(
        "pause_id",
        whole.get("pause_id"),
        Value::from(statement.request_id.clone()),
    );
    check(
        "action_digest",
        whole.get("action_digest"),
        Value::from(statement.action_digest.to_string()),
    );
    let status = match statement.decision {
        countersign_core::Verdict::Approved | countersign_core::Verdict::Rejected => "responded",
    };
    check("status", whole.get("status"), Value::from(status));
    if let Some(response) = whole.get("response") {
        if !response.is_object() {
            bad.push("response".into());
            return bad;
        }
        let r = |k: &str| response.get(k);
        check(
            "response.decision",
            r("decision"),
            Value::from(statement.decision.as_str()),
        );
        check(
            "response.comment",
            r("comment"),
            statement.comment.clone().map_or(Value::Null, Value::from),
        );
        check(
            "response.fields",
            r("fields"),
            serde_json::to_value(&statement.fields).unwrap_or(Value::Null),
        );
        check(
            "response.authorization_type",
            r("authorization_type"),
            Value::from(authorization_type(statement.authorization_type)),
        );
        check(
            "response.responded_at",
            r("responded_at"),
            Value::from(statement.decided_at.to_string()),
        );
        check(
            "response.valid_until",
            r("valid_until"),
            Value::from(statement.valid_until.to_string()),
        );
        check("response.nonce", r("nonce"), Value::from(statement.nonce));
        let sig = envelope.signatures.first();
        check(
            "response.signing_key_id",
            r("signing_key_id"),
            Value::from(sig.map(|s| s.keyid.clone()).unwrap_or_default()),
        );
        check(
            "response.signature",
            r("signature"),
            Value::from(sig.map(|s| signature_text(&s.sig)).unwrap_or_default()),
        );
        let ids: Vec<&str> = statement.approvers.iter().map(|a| a.id.as_str()).collect();
        if let Some(Value::String(shown)) = r("responder")
            && !ids.is_empty()
            && *shown != ids.join(",")
        {
            bad.push("response.responder".into());
        }
    }
    bad
}

/// Who calls the profile's tools.
#[derive(Debug, Clone)]
enum Caller {
    /// One fixed principal (stdio, no token given).
    Fixed(Principal),
    /// The bearer token of a stdio process (`--token-file`, LOOPPAUSE_API_KEY),
    /// authenticated at every call.
    Token(Arc<str>),
    /// Streamable HTTP: the principal the authentication middleware attached.
    PerRequest,
}

#[derive(Clone)]
pub struct LoopPauseService {
    gate: Arc<Gate>,
    caller: Caller,
    router: ToolRouter<LoopPauseService>,
}

impl LoopPauseService {
    pub fn new(gate: Arc<Gate>, identity: Identity) -> Self {
        let caller = match identity {
            Identity::Fixed(p) => Caller::Fixed(p),
            Identity::PerRequest => Caller::PerRequest,
        };
        Self {
            gate,
            caller,
            router: Self::profile_router(),
        }
    }

    /// The profile over stdio for the holder of `token`: checked at every call.
    pub fn with_token(gate: Arc<Gate>, token: String) -> Self {
        Self {
            gate,
            caller: Caller::Token(token.into()),
            router: Self::profile_router(),
        }
    }

    async fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, GateError> {
        match &self.caller {
            Caller::Fixed(p) => Ok(p.clone()),
            Caller::Token(token) => self.gate.authenticate(token).await,
            Caller::PerRequest => http_principal(ctx).ok_or_else(|| {
                GateError::Unauthenticated("no authenticated principal on this request".into())
            }),
        }
    }

    /// The scope a tool of this profile needs.
    fn need(tool: &str) -> Scope {
        match tool {
            "verify_proof" => Scope::Verify,
            _ => Scope::Request,
        }
    }
}

#[tool_router(router = profile_router, vis = "pub(crate)")]
impl LoopPauseService {
    #[tool(
        description = "Send an approval request to a human and return at once with a pause_id. Do NOT proceed until check_approval returns status responded with response.decision approved.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn request_approval(
        &self,
        Parameters(input): Parameters<RequestInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RequestOutput>, ToolError> {
        let who = self.caller(&ctx).await?;
        let new = countersign_core::NewRequest {
            description: input.action_description,
            details: input.action_details,
            recipient_email: input.recipient_email,
            recipient_slack: input.recipient_slack,
            timeout_hours: input.timeout_hours,
            timeout_seconds: None,
            valid_for_seconds: None,
            idempotency_key: None,
            requested_fields: Vec::new(),
            room: None,
        };
        let requested = self.gate.request_approval_with(&who, new, None).await?;
        let request = requested.request;
        Ok(Json(RequestOutput {
            pause_id: request.id.clone(),
            status: status(request.status).to_string(),
            expires_at: request.expires_at.to_string(),
            action_digest: request.action_digest.to_string(),
            mandatory_next_step: MANDATORY_NEXT_STEP.to_string(),
        }))
    }

    #[tool(
        description = "Check an approval request's current state. Call repeatedly until status is not pending: responded (check response.decision), timed_out or expired. Never proceed while pending.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn check_approval(
        &self,
        Parameters(input): Parameters<CheckInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckOutput>, ToolError> {
        let who = self.caller(&ctx).await?;
        let request = self.gate.get(&who, &input.pause_id).await?;
        Ok(Json(CheckOutput::new(&request)))
    }

    #[tool(
        description = "Verify the Ed25519 signature of the proof from check_approval (pass the whole check_approval result as proof) against the server's published keys, and that every decision field the result shows is the signed one. Call before any irreversible action. Give action_description and action_details to bind the check to the action you are about to perform.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn verify_proof(
        &self,
        Parameters(input): Parameters<VerifyInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VerifyOutput>, ToolError> {
        self.caller(&ctx).await?;
        let verified_at = self.gate.now().to_string();
        let action = match (&input.action_description, &input.action_details) {
            (None, None) => None,
            (Some(d), details) => Some(countersign_core::Action::new(
                d.clone(),
                details.clone().unwrap_or_default(),
            )),
            (None, Some(_)) => {
                return Err(GateError::BadInput(
                    "action_details were given without action_description; give both to check the action".into(),
                )
                .into());
            }
        };
        let (envelope, whole) = match envelope_of(&input.proof) {
            Ok(found) => found,
            Err(why) => {
                return Ok(Json(VerifyOutput {
                    valid: false,
                    verified_at,
                    key_id: None,
                    warning: Some(format!("{FAILED_WARNING} ({why})")),
                    bound: false,
                    reasons: vec![ProblemView {
                        code: "malformed_envelope".into(),
                        message: why,
                    }],
                    pause_id: None,
                    decision: None,
                }));
            }
        };
        let report = self.gate.verify_proof(&envelope, action.as_ref()).await?;
        let mut reasons: Vec<ProblemView> = report
            .reasons
            .iter()
            .map(|p| ProblemView {
                code: enum_str(&p.code),
                message: p.message.clone(),
            })
            .collect();
        if let Some(whole) = whole {
            let bad = result_mismatches(whole, &envelope);
            if !bad.is_empty() {
                reasons.push(ProblemView {
                    code: "result_mismatch".into(),
                    message: format!(
                        "the result's {} differ from the signed proof: it was altered",
                        bad.join(", ")
                    ),
                });
            }
        }
        let valid = report.valid && reasons.is_empty();
        let statement = report.statement.as_ref();
        let warning = if !valid {
            Some(format!(
                "{FAILED_WARNING} ({})",
                reasons
                    .iter()
                    .map(|r| r.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        } else {
            report.warning().map(str::to_string)
        };
        Ok(Json(VerifyOutput {
            valid,
            verified_at,
            key_id: report
                .keyid
                .clone()
                .or_else(|| envelope.signatures.first().map(|s| s.keyid.clone())),
            warning,
            bound: report.bound,
            reasons,
            pause_id: statement.map(|s| s.request_id.clone()),
            decision: statement.map(|s| s.decision.as_str().to_string()),
        }))
    }
}

impl ServerHandler for LoopPauseService {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "countersign-looppause",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = match self.caller(&context).await {
            Ok(who) => self
                .router
                .list_all()
                .into_iter()
                .filter(|t| who.may(Self::need(&t.name)))
                .collect(),
            Err(_) => Vec::new(),
        };
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.router.has_route(&request.name) {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool {} in the {PROFILE} profile (the native tools are at /mcp, or `countersign mcp` without --profile)",
                    request.name
                ),
                None,
            ));
        }
        let who = self.caller(&context).await.map_err(|err| {
            ErrorData::invalid_params(
                format!("tool {}: {}", request.name, err.public_message()),
                None,
            )
        })?;
        let need = Self::need(&request.name);
        if !who.may(need) {
            return Err(ErrorData::invalid_params(
                format!(
                    "tool {} needs the {need} scope, and {} ({} token) has {}",
                    request.name, who.id, who.role, who.scopes
                ),
                None,
            ));
        }
        self.router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.router.get(name).cloned()
    }
}

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 key bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// `/.well-known/looppause-signing-key.json`: the published keys in LoopPause's shape,
/// derived from countersign's JWKS. The top level is the key signing now (`key_id`,
/// `algorithm`, `public_key` as base64 SPKI DER, what verifyLoopPauseProof pins);
/// `keys` lists every published key (retired ones verify older proofs), each with its
/// JWK as well. A JWK that is not Ed25519 is left out.
pub fn signing_key_document(jwks: &countersign_core::Jwks, current: &str) -> Value {
    let keys: Vec<Value> = jwks
        .keys
        .iter()
        .filter(|k| k.kty == "OKP" && k.crv == "Ed25519")
        .filter_map(|k| {
            let raw = URL_SAFE_NO_PAD
                .decode(&k.x)
                .ok()
                .filter(|b| b.len() == 32)?;
            let mut der = ED25519_SPKI_PREFIX.to_vec();
            der.extend_from_slice(&raw);
            Some(serde_json::json!({
                "key_id": k.kid,
                "algorithm": "Ed25519",
                "public_key": STANDARD.encode(der),
                "format": "spki-der-base64",
                "current": k.kid == current,
                "jwk": k,
            }))
        })
        .collect();
    let top = keys
        .iter()
        .find(|k| k["current"] == true)
        .or_else(|| keys.first())
        .cloned()
        .unwrap_or(Value::Null);
    serde_json::json!({
        "key_id": top.get("key_id"),
        "algorithm": "Ed25519",
        "public_key": top.get("public_key"),
        "format": "spki-der-base64",
        "keys": keys,
        "jwks_uri": "/.well-known/jwks.json",
    })
}
