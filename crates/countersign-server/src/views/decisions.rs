//! The shapes of deciding with others and ahead of time: how far a quorum has come, standing
//! grants (asked for with an approval, on their own, as listed), and batch decisions.

use std::collections::BTreeMap;

use countersign_core::ApprovalRequest;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ApproverView;

/// How far a request that needs several approvals has come.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QuorumView {
    /// Distinct accounts that must approve.
    pub required: u32,
    /// The group (`[groups]`) every approver must be in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The approvals recorded so far, in order.
    pub approvals: Vec<RecordedApprovalView>,
    /// Approvals still needed (0 once decided).
    pub still_needed: u32,
}

/// One approval recorded toward a quorum.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordedApprovalView {
    pub approver: ApproverView,
    pub approved_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl QuorumView {
    pub fn of(request: &ApprovalRequest) -> Option<Self> {
        let quorum = request.quorum.as_ref()?;
        let (so_far, required) = request.quorum_progress()?;
        let decided = request.status != countersign_core::Status::Pending;
        let mut approvals: Vec<RecordedApprovalView> = request
            .approvals
            .iter()
            .map(|a| RecordedApprovalView {
                approver: ApproverView::of(&a.approver),
                approved_at: a.approved_at.to_string(),
                comment: a.comment.clone(),
            })
            .collect();
        // The approval that reached the quorum is the decision's last approver.
        if let Some(d) = &request.decision
            && d.decision == countersign_core::Verdict::Approved
            && d.authorization_type == countersign_core::AuthorizationType::Human
            && let Some(last) = d.approvers.last()
        {
            approvals.push(RecordedApprovalView {
                approver: ApproverView::of(last),
                approved_at: d.decided_at.to_string(),
                comment: d.comment.clone(),
            });
        }
        Some(Self {
            required,
            group: quorum.group.clone(),
            approvals,
            still_needed: if decided {
                0
            } else {
                required.saturating_sub(so_far)
            },
        })
    }

    /// Who has approved so far, each as "<display name> via <channel>" (text as given:
    /// a channel that needs escaping escapes it).
    pub fn approved_by(&self) -> Vec<String> {
        self.approvals
            .iter()
            .map(|a| {
                format!(
                    "{} via {}",
                    a.approver.display_name,
                    a.approver.channel.as_str()
                )
            })
            .collect()
    }

    /// "1 of 2 approvals; 1 more needed, from sre".
    pub fn summary(&self) -> String {
        let so_far = self.approvals.len();
        let mut line = format!("{so_far} of {} approvals", self.required);
        if self.still_needed > 0 {
            line.push_str(&format!("; {} more needed", self.still_needed));
            if let Some(group) = &self.group {
                line.push_str(&format!(", from {group}"));
            }
        }
        line
    }
}

/// The standing grant behind a decision.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct GrantRefView {
    pub id: String,
    pub granted_by: ApproverView,
}

/// Many decisions with one confirmation (`POST /api/v1/requests/decisions`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// approved or rejected, for every request.
    pub decision: String,
    #[serde(default)]
    pub comment: Option<String>,
    /// The requests, each with the version it was selected at.
    pub requests: Vec<SelectedRequest>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectedRequest {
    pub id: String,
    pub version: u64,
}

/// A request a batch did not decide, and why.
#[derive(Debug, Clone, Serialize)]
pub struct NotDecided {
    pub request_id: String,
    /// A stable code (`changed`, `already_decided`, `expired`, `self_approval`, ...).
    pub code: &'static str,
    pub message: String,
}

/// What a batch decision did, as the API and the CLI answer it.
#[derive(Debug, Clone, Serialize)]
pub struct BatchView {
    /// The requests decided, each with its own proof.
    pub decided: Vec<super::ApprovalView>,
    pub not_decided: Vec<NotDecided>,
}

impl BatchView {
    pub fn of(batch: &crate::gate::Batch) -> Self {
        Self {
            decided: batch.decided.iter().map(super::ApprovalView::new).collect(),
            not_decided: batch
                .not_decided
                .iter()
                .map(|(id, err)| NotDecided {
                    request_id: id.clone(),
                    code: err.code(),
                    message: err.public_message(),
                })
                .collect(),
        }
    }
}

/// A standing grant asked for with an approval: the request's agent and tool.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// How long it lasts, in seconds (default 3600, at most 30 days).
    #[serde(default)]
    pub for_seconds: Option<u64>,
    /// How many requests it may approve (default: any number until it expires).
    #[serde(default)]
    pub max_uses: Option<u32>,
    /// Details a covered request must have with this request's values.
    #[serde(default)]
    pub exact: Vec<String>,
    /// Details a covered request must have as numbers at most these.
    #[serde(default)]
    pub max: BTreeMap<String, String>,
}

impl From<GrantBody> for crate::gate::GrantTerms {
    fn from(body: GrantBody) -> Self {
        Self {
            for_seconds: body.for_seconds,
            max_uses: body.max_uses,
            exact: body.exact,
            max: body.max,
        }
    }
}

/// A new standing grant on its own (`POST /api/v1/grants`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewGrantBody {
    /// The agent's principal id (`token:deploy-bot`).
    pub agent: String,
    /// The tool (a request's `tool` detail).
    pub tool: String,
    #[serde(default)]
    pub exact: BTreeMap<String, String>,
    #[serde(default)]
    pub max: BTreeMap<String, String>,
    #[serde(default)]
    pub for_seconds: Option<u64>,
    #[serde(default)]
    pub max_uses: Option<u32>,
}

/// A standing grant as approvers see it.
#[derive(Debug, Clone, Serialize)]
pub struct GrantView {
    #[serde(flatten)]
    pub grant: countersign_core::Grant,
    /// active, expired, used_up or revoked.
    pub status: &'static str,
}

impl GrantView {
    pub fn new(grant: countersign_core::Grant, now: countersign_core::Timestamp) -> Self {
        Self {
            status: grant.status(now),
            grant,
        }
    }
}
