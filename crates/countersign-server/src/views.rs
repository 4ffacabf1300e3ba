//! The shapes clients see: inputs of the agent calls and their results, shared by the
//! REST API and the MCP tools (which publish them as input and output schemas).

use std::collections::BTreeMap;

use countersign_core::proof::Problem;
use countersign_core::{ApprovalRequest, Envelope, NewRequest, Status, VerifyReport};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod decisions;
mod evidence;
mod redemption;
mod reviews;
mod why;

pub use decisions::{
    BatchBody, BatchView, GrantBody, GrantRefView, GrantView, NewGrantBody, NotDecided, QuorumView,
    RecordedApprovalView, SelectedRequest,
};
pub use evidence::{
    BundleReportView, ModelInput, RecordDecisionInput, RecordDecisionOutput, RecordOutcomeInput,
    RecordReviewInput,
};
pub use redemption::{RedeemOutput, RedeemProofInput};
pub use reviews::{ReviewOutput, ReviewView};
pub use why::{WhyKind, WhyPolicy, WhyView};

/// `request_approval`'s input.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestApprovalInput {
    /// What you want to do, in words the human approver will read and decide on.
    pub action_description: String,
    /// The exact parameters of the action (amounts and ids as strings). The approval is
    /// bound to these: a proof for one set of details is not valid for another.
    #[serde(default)]
    pub action_details: BTreeMap<String, String>,
    /// Email address of an approver to notify as well. Only known approvers are
    /// accepted; the server's configured routes are notified in any case.
    #[serde(default)]
    pub recipient_email: Option<String>,
    /// Slack user or channel of an approver to notify as well. Only known approvers are
    /// accepted; the server's configured routes are notified in any case.
    #[serde(default)]
    pub recipient_slack: Option<String>,
    /// Hours to wait for a decision before the request times out (default 24, max 168).
    #[serde(default)]
    pub timeout_hours: Option<f64>,
    /// The same bound in seconds, for short waits. Give this or timeout_hours.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Seconds an approval stays usable after it is given (default 900).
    #[serde(default)]
    pub valid_for_seconds: Option<u64>,
    /// A key of your choosing: retrying with the same key and action returns the same
    /// request instead of creating another.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Names of fields the approver must fill in to approve (e.g. ["po_number"]); their
    /// values come back in the decision and the signed proof.
    #[serde(default)]
    pub requested_fields: Vec<String>,
    /// A room to show the request in as well (see join_room / post_message).
    #[serde(default)]
    pub room: Option<String>,
    /// How many distinct people must approve (2 to 10), where the server allows
    /// requests to ask ([limits] request_quorum); policies may require more.
    #[serde(default)]
    pub approvals: Option<u32>,
    /// The group ([groups]) every approver must be in, where the server allows it.
    #[serde(default)]
    pub approvers: Option<String>,
}

impl RequestApprovalInput {
    /// The quorum the request asks for, if any: (approvals, group).
    pub fn quorum(&self) -> Option<(u32, Option<String>)> {
        match (self.approvals, &self.approvers) {
            (None, None) => None,
            (n, group) => Some((n.unwrap_or(1), group.clone())),
        }
    }
}

impl From<RequestApprovalInput> for NewRequest {
    fn from(input: RequestApprovalInput) -> Self {
        NewRequest {
            description: input.action_description,
            details: input.action_details,
            recipient_email: input.recipient_email,
            recipient_slack: input.recipient_slack,
            timeout_hours: input.timeout_hours,
            timeout_seconds: input.timeout_seconds,
            valid_for_seconds: input.valid_for_seconds,
            idempotency_key: input.idempotency_key,
            requested_fields: input.requested_fields,
            room: input.room,
        }
    }
}

/// `request_approval`'s result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestApprovalOutput {
    pub request_id: String,
    /// `pending` for a new request.
    pub status: String,
    /// When the request times out if nobody decides (UTC, RFC 3339).
    pub expires_at: String,
    /// `sha256:` + hex SHA-256 of the RFC 8785 JSON of {description, details}.
    pub action_digest: String,
    pub valid_for_seconds: u64,
    /// True when this is an earlier request returned for a retried idempotency key.
    pub existing: bool,
    /// When a policy requires several approvals (or approvers from a group): how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<QuorumView>,
    /// What to do next.
    pub message: String,
}

impl RequestApprovalOutput {
    pub fn new(request: &ApprovalRequest, existing: bool) -> Self {
        Self {
            request_id: request.id.clone(),
            status: request.status.to_string(),
            expires_at: request.expires_at.to_string(),
            action_digest: request.action_digest.to_string(),
            valid_for_seconds: request.valid_for_seconds,
            existing,
            quorum: QuorumView::of(request),
            message: guidance(request),
        }
    }
}

/// An approver as shown to clients.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ApproverView {
    pub id: String,
    pub display_name: String,
    /// Where the decision was made (every channel countersign decides through).
    pub channel: countersign_core::Channel,
    /// How the approver authenticated (every way countersign knows).
    pub auth_method: countersign_core::AuthMethod,
    /// The account the approver counted as, on a request that needed a quorum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl ApproverView {
    pub fn of(a: &countersign_core::Approver) -> Self {
        Self {
            id: a.id.clone(),
            display_name: a.display_name.clone(),
            channel: a.channel,
            auth_method: a.auth_method,
            account: a.account.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DecisionView {
    /// approved or rejected.
    pub decision: String,
    /// human, policy or fallback.
    pub authorization_type: String,
    pub approvers: Vec<ApproverView>,
    pub comment: Option<String>,
    /// Structured reply fields from the approver (e.g. a PO number).
    pub fields: BTreeMap<String, String>,
    pub decided_at: String,
    /// The approval may be acted on until this time, once.
    pub valid_until: String,
    /// For a policy or fallback decision: the policy that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyView>,
    /// For a grant decision: the standing grant and who gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantRefView>,
}

/// A policy behind a decision, or the policies that sent a request to people.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PolicyView {
    /// The policy id (for a request sent to people: the ids, comma-separated).
    pub id: String,
    /// The policy set's digest, sha256:<hex>; its text is in the log's
    /// policy_set_loaded entry.
    pub policy_set: String,
    /// For a request sent to people: what a timeout becomes (approved or rejected, by
    /// fallback); absent, it times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OutcomeView {
    /// succeeded, failed, partial or unknown.
    pub status: String,
    pub summary: Option<String>,
    pub details: BTreeMap<String, String>,
    pub recorded_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct UsedView {
    pub tool: String,
    pub recorded_at: String,
}

/// The state of a request: what `check_approval` and `wait_for_approval` return.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalView {
    pub request_id: String,
    /// pending, approved, rejected, timed_out or cancelled.
    pub status: String,
    pub action_description: String,
    pub action_details: BTreeMap<String, String>,
    pub action_digest: String,
    pub requested_by: String,
    pub requested_at: String,
    pub expires_at: String,
    /// Fields the approver fills in to approve.
    pub requested_fields: Vec<String>,
    /// The room it is shown in.
    pub room: Option<String>,
    /// Why a person decides it: the policies that sent it to people (none: no policy
    /// matched, or no policies are configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyView>,
    /// For a request that needs several approvals (or approvers from a group): how many,
    /// who has approved, and how many are still needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<QuorumView>,
    pub decision: Option<DecisionView>,
    /// The signed proof (a DSSE envelope), once decided. Pass it to verify_proof, or
    /// verify it offline with the server's JWKS.
    pub proof: Option<ProofView>,
    /// Set once the approval has been used (record_action, or an executor redeemed the
    /// proof).
    pub used: Option<UsedView>,
    /// What came of the action (record_outcome).
    pub outcome: Option<OutcomeView>,
    /// What to do next.
    pub message: String,
}

/// A DSSE envelope.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProofView {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// Base64 (standard, padded) of the statement's JSON bytes.
    pub payload: String,
    pub signatures: Vec<SignatureView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SignatureView {
    pub keyid: String,
    pub sig: String,
}

impl From<&Envelope> for ProofView {
    fn from(e: &Envelope) -> Self {
        Self {
            payload_type: e.payload_type.clone(),
            payload: e.payload.clone(),
            signatures: e
                .signatures
                .iter()
                .map(|s| SignatureView {
                    keyid: s.keyid.clone(),
                    sig: s.sig.clone(),
                })
                .collect(),
        }
    }
}

impl From<ProofView> for Envelope {
    fn from(p: ProofView) -> Self {
        Envelope {
            payload_type: p.payload_type,
            payload: p.payload,
            signatures: p
                .signatures
                .into_iter()
                .map(|s| countersign_core::proof::EnvelopeSignature {
                    keyid: s.keyid,
                    sig: s.sig,
                })
                .collect(),
        }
    }
}

impl ApprovalView {
    pub fn new(request: &ApprovalRequest) -> Self {
        Self {
            request_id: request.id.clone(),
            status: request.status.to_string(),
            action_description: request.action.description.clone(),
            action_details: request.action.details.clone(),
            action_digest: request.action_digest.to_string(),
            requested_by: request.requested_by.id.clone(),
            requested_at: request.requested_at.to_string(),
            expires_at: request.expires_at.to_string(),
            requested_fields: request.requested_fields.clone(),
            room: request.room.clone(),
            policy: request.policy.as_ref().map(|p| PolicyView {
                id: p.policies.join(","),
                policy_set: p.policy_set.clone(),
                on_timeout: p.on_timeout.map(|v| v.as_str().to_string()),
            }),
            quorum: QuorumView::of(request),
            decision: request.decision.as_ref().map(|d| DecisionView {
                decision: d.decision.as_str().to_string(),
                authorization_type: enum_str(&d.authorization_type),
                approvers: d.approvers.iter().map(ApproverView::of).collect(),
                comment: d.comment.clone(),
                fields: d.fields.clone(),
                decided_at: d.decided_at.to_string(),
                valid_until: d.valid_until.to_string(),
                policy: d.policy.as_ref().map(|p| PolicyView {
                    id: p.id.clone(),
                    policy_set: p.policy_set.clone(),
                    on_timeout: None,
                }),
                grant: d.grant.as_ref().map(|g| GrantRefView {
                    id: g.id.clone(),
                    granted_by: ApproverView::of(&g.granted_by),
                }),
            }),
            proof: request.proof.as_ref().map(ProofView::from),
            used: request.used().map(|(at, tool)| UsedView {
                tool,
                recorded_at: at.to_string(),
            }),
            outcome: request.outcome.as_ref().map(|o| OutcomeView {
                status: enum_str(&o.status),
                summary: o.summary.clone(),
                details: o.details.clone(),
                recorded_at: o.recorded_at.to_string(),
            }),
            message: guidance(request),
        }
    }
}

/// A serde unit enum as its string.
pub(crate) fn enum_str<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// The plain statement an agent reads next to a status.
pub fn guidance(request: &ApprovalRequest) -> String {
    let who = request
        .decision
        .as_ref()
        .map(|d| match (&d.policy, d.authorization_type) {
            (Some(p), countersign_core::AuthorizationType::Fallback) => {
                format!("fallback (policy {}, nobody decided in time)", p.id)
            }
            (Some(p), _) => format!("policy {}", p.id),
            (None, countersign_core::AuthorizationType::Grant) => d
                .grant
                .as_ref()
                .map(|g| format!("grant {} (given by {})", g.id, g.granted_by.display_name))
                .unwrap_or_else(|| "a grant".to_string()),
            (None, _) => d
                .approvers
                .iter()
                .map(|a| a.display_name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
        .unwrap_or_default();
    match request.status {
        Status::Pending => format!(
            "Pending{}: do NOT perform this action until the request is approved. Call wait_for_approval with request_id {} to wait for the decision (it times out at {}).",
            QuorumView::of(request)
                .map(|q| format!(" ({})", q.summary()))
                .unwrap_or_default(),
            request.id,
            request.expires_at
        ),
        Status::Approved => match (request.used(), &request.decision) {
            (Some((at, tool)), _) => format!(
                "Approved by {who}, and already used at {at} ({tool}). The approval is single use: request a new one to act again."
            ),
            (None, Some(d)) => format!(
                "Approved by {who}. You may perform exactly this action, once, before {}. Call record_action with request_id {} when you do.",
                d.valid_until, request.id
            ),
            (None, None) => "Approved.".to_string(),
        },
        Status::Rejected => {
            let reason = request
                .decision
                .as_ref()
                .and_then(|d| d.comment.as_deref())
                .map(|c| format!(" Reason: {c}"))
                .unwrap_or_default();
            format!("Rejected by {who}. Do NOT perform this action.{reason}")
        }
        Status::TimedOut => "Timed out without a decision: it is NOT approved. Do NOT perform this action; ask again if it is still needed.".to_string(),
        Status::Cancelled => "Cancelled: it is NOT approved. Do NOT perform this action.".to_string(),
    }
}

/// `verify_proof`'s input.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyProofInput {
    /// The DSSE envelope returned with the decision.
    pub proof: ProofView,
    /// The action about to be performed; when given, the proof must be for exactly it.
    #[serde(default)]
    pub action_description: Option<String>,
    #[serde(default)]
    pub action_details: Option<BTreeMap<String, String>>,
}

impl VerifyProofInput {
    /// The action to check the proof against, if the caller gave one.
    pub fn action(&self) -> Result<Option<countersign_core::Action>, crate::GateError> {
        match (&self.action_description, &self.action_details) {
            (None, None) => Ok(None),
            (Some(description), details) => Ok(Some(countersign_core::Action::new(
                description.clone(),
                details.clone().unwrap_or_default(),
            ))),
            (None, Some(_)) => Err(crate::GateError::BadInput(
                "action_details were given without action_description; give both to check the action".into(),
            )),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProblemView {
    /// A stable code: malformed_envelope, wrong_payload_type, unknown_key, bad_signature,
    /// malformed_statement, digest_mismatch, not_approved, expired, already_used,
    /// action_mismatch.
    pub code: String,
    pub message: String,
}

/// `verify_proof`'s result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct VerifyOutput {
    /// Whether the proof is valid: the signature, the key and the approval's state and,
    /// when `bound`, the action.
    pub valid: bool,
    /// Whether the proof was checked against the action given. When false, `valid`
    /// does not say the proof is for the action you are about to perform.
    pub bound: bool,
    /// Set when the action was not checked: what `valid` does not say.
    pub warning: Option<String>,
    /// Every reason the proof is not valid (empty when it is).
    pub reasons: Vec<ProblemView>,
    pub request_id: Option<String>,
    pub decision: Option<String>,
    pub action_digest: Option<String>,
    pub valid_until: Option<String>,
    /// The key that signed it.
    pub keyid: Option<String>,
}

impl From<VerifyReport> for VerifyOutput {
    fn from(report: VerifyReport) -> Self {
        let statement = report.statement.as_ref();
        Self {
            valid: report.valid,
            bound: report.bound,
            warning: report.warning().map(str::to_string),
            reasons: report
                .reasons
                .iter()
                .map(|p: &Problem| ProblemView {
                    code: enum_str(&p.code),
                    message: p.message.clone(),
                })
                .collect(),
            request_id: statement.map(|s| s.request_id.clone()),
            decision: statement.map(|s| s.decision.as_str().to_string()),
            action_digest: statement.map(|s| s.action_digest.to_string()),
            valid_until: statement.map(|s| s.valid_until.to_string()),
            keyid: report.keyid,
        }
    }
}

/// `record_action`'s input.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordActionInput {
    pub request_id: String,
    /// The tool or operation that performs the approved action.
    pub tool: String,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
}

/// A decision's input (REST and the operator tools). Who decides comes from the
/// credential, never from here.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// approved or rejected.
    pub decision: String,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
    /// The request's version when the decider looked at it (the dashboard sends it): if
    /// the request closed since, the answer says what closed it.
    #[serde(default)]
    pub expected_version: Option<u64>,
    /// With an approval: also allow this agent this tool from now on, within bounds
    /// (a standing grant; docs/policies.md#standing-grants).
    #[serde(default)]
    pub grant: Option<GrantBody>,
}

/// A request as a person (or the agent that asked) looks at it: the request, its
/// version, and whether this viewer may decide it now (and if not, why).
#[derive(Debug, Clone, Serialize)]
pub struct RequestView {
    #[serde(flatten)]
    pub view: ApprovalView,
    pub version: u64,
    pub can_decide: bool,
    pub cannot_decide_reason: Option<String>,
    /// The standing grant given with this decision, if one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantView>,
    /// Why the grant asked for with this approval was not given (the approval stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant_error: Option<String>,
}

impl RequestView {
    /// `accounts`: the viewer's and the requester's accounts ([`crate::gate::Gate::accounts_for`]).
    pub fn new(
        request: &ApprovalRequest,
        viewer: &countersign_core::Principal,
        accounts: &countersign_core::DecisionAccounts,
    ) -> Self {
        let pending = request.status == Status::Pending;
        let reason = if !pending {
            None
        } else if !viewer.role.may_decide() {
            Some("An agent credential cannot decide requests.".to_string())
        } else {
            request.why_not_decider(viewer, accounts)
        };
        Self {
            view: ApprovalView::new(request),
            version: request.version,
            can_decide: pending && reason.is_none(),
            cannot_decide_reason: reason,
            grant: None,
            grant_error: None,
        }
    }
}

/// A room, as the REST API and the dashboard list it.
#[derive(Debug, Clone, Serialize)]
pub struct RoomView {
    pub name: String,
    pub title: String,
    pub created_at: String,
    pub created_by: String,
    pub deleted_at: Option<String>,
    pub purged_at: Option<String>,
    /// Who besides its creator and the people who decide may use it (principal ids
    /// and `group:<name>`s); empty: anyone.
    pub allowed: Vec<String>,
    /// In listings: what waits for a person there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention: Option<countersign_core::rooms::Attention>,
}

impl RoomView {
    pub fn new(room: &countersign_core::rooms::Room) -> Self {
        Self {
            name: room.name.clone(),
            title: room.title.clone(),
            created_at: room.created_at.to_string(),
            created_by: room.created_by.clone(),
            deleted_at: room.deleted_at.map(|t| t.to_string()),
            purged_at: room.purged_at.map(|t| t.to_string()),
            allowed: room.allowed.clone(),
            attention: None,
        }
    }
}

/// Parses an evidence mode name.
pub fn parse_mode(mode: Option<&str>) -> Result<countersign_core::bundle::Mode, crate::GateError> {
    match mode.unwrap_or("redacted") {
        "redacted" => Ok(countersign_core::bundle::Mode::Redacted),
        "full" => Ok(countersign_core::bundle::Mode::Full),
        other => Err(crate::GateError::BadInput(format!(
            "mode {other:?} is not redacted or full"
        ))),
    }
}

/// What a process operation came to (the approval-gate profile's changes and
/// `/api/v1/operate`): `state` is `done`, `pending` or `refused`.
#[derive(Debug, Clone, Serialize)]
pub struct OperationView {
    pub state: &'static str,
    pub request: ApprovalView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executed: Option<crate::operate::Executed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl OperationView {
    pub fn new(performed: &crate::operate::Performed) -> Self {
        use crate::operate::Performed;
        match performed {
            Performed::Done { request, executed } => Self {
                state: "done",
                request: ApprovalView::new(request),
                executed: Some(executed.clone()),
                reason: None,
            },
            Performed::Pending { request } => Self {
                state: "pending",
                request: ApprovalView::new(request),
                executed: None,
                reason: None,
            },
            Performed::Refused { request, reason } => Self {
                state: "refused",
                request: ApprovalView::new(request),
                executed: None,
                reason: Some(reason.clone()),
            },
        }
    }
}
