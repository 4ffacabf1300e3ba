//! Approval requests and their state machine.
//!
//! ```text
//! pending ──decide──▶ approved ──record_action or redeem──▶ (used once)
//!    │    └─decide──▶ rejected
//!    ├──approve, short of its quorum──▶ pending (the approval recorded: quorum.rs)
//!    ├──expires_at──▶ timed_out   (fail closed: never approved by silence)
//!    └──cancel──────▶ cancelled
//! ```
//!
//! Every transition is a pure function from the current request and the current time to
//! the next request and the event it emits. The store applies it with a compare-and-swap
//! on `version`, so concurrent deciders cannot both win.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionDigest};
use crate::decision::{ActionRecord, Decision};
use crate::error::{CoreError, NotUsable};
use crate::event::{Event, EventKind};
use crate::principal::{Principal, Requester};
use crate::proof::Envelope;
use crate::quorum::{Quorum, RecordedApproval};
use crate::time::Timestamp;
use serde_json::json;

/// A state change: the request's next state and the event that records it. The store
/// writes both in one transaction or neither.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub request: ApprovalRequest,
    pub event: Event,
}

impl Transition {
    /// Seals the transition's event with `salt` (32 fresh random bytes).
    pub fn seal(&self, salt: [u8; 32]) -> SealedTransition {
        SealedTransition {
            request: self.request.clone(),
            event: self.event.seal(salt),
        }
    }
}

impl Transition {
    /// Whether the store may apply this transition over `stored`: the store's
    /// compare-and-swap, which writes a transition only over the version it was computed
    /// from. Two transitions computed from one state (a last approval and a rejection)
    /// both follow it, so the store keeps exactly one; one computed from an older state
    /// follows nothing stored and must be computed again from the current one.
    pub fn applies_to(&self, stored: &ApprovalRequest) -> bool {
        self.request.id == stored.id && self.request.version == stored.version + 1
    }
}

/// A transition ready to store: the request's next state and its sealed log entry.
#[derive(Debug, Clone, PartialEq)]
pub struct SealedTransition {
    pub request: ApprovalRequest,
    pub event: crate::event::SealedEvent,
}

/// A request id, e.g. `req_0193a0c4e8b27c3f9d0e5b1a2c3d4e5f`.
pub type RequestId = String;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Approved,
    Rejected,
    TimedOut,
    Cancelled,
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Rejected => "rejected",
            Status::TimedOut => "timed_out",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_final(&self) -> bool {
        !matches!(self, Status::Pending)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => Status::Pending,
            "approved" => Status::Approved,
            "rejected" => Status::Rejected,
            "timed_out" => Status::TimedOut,
            "cancelled" => Status::Cancelled,
            other => {
                return Err(CoreError::invalid(
                    "status",
                    format!(
                        "{other:?} is not one of pending, approved, rejected, timed_out, cancelled"
                    ),
                ));
            }
        })
    }
}

/// Bounds on what a request may carry. The defaults suit every deployment we know of;
/// they exist so that one oversized request cannot fill the database or a proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_description_bytes: usize,
    pub max_details: usize,
    pub max_detail_key_bytes: usize,
    pub max_detail_value_bytes: usize,
    pub max_comment_bytes: usize,
    pub max_fields: usize,
    pub default_timeout_seconds: u64,
    pub max_timeout_seconds: u64,
    pub default_valid_for_seconds: u64,
    pub max_valid_for_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_description_bytes: 4096,
            max_details: 100,
            max_detail_key_bytes: 256,
            max_detail_value_bytes: 16 * 1024,
            max_comment_bytes: 4096,
            max_fields: 50,
            default_timeout_seconds: 24 * 3600,
            max_timeout_seconds: 168 * 3600,
            default_valid_for_seconds: 15 * 60,
            max_valid_for_seconds: 24 * 3600,
        }
    }
}

/// A request as the agent states it, before validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewRequest {
    pub description: String,
    pub details: BTreeMap<String, String>,
    pub recipient_email: Option<String>,
    pub recipient_slack: Option<String>,
    /// Hours the request may wait for a decision (default 24, at most 168).
    pub timeout_hours: Option<f64>,
    /// The same bound in seconds, for short waits; give one of the two.
    pub timeout_seconds: Option<u64>,
    /// How long an approval stays usable after it is given (default 15 minutes).
    pub valid_for_seconds: Option<u64>,
    pub idempotency_key: Option<String>,
    /// Structured fields the approver must fill in to approve (e.g. `po_number`); they
    /// go into the signed proof.
    pub requested_fields: Vec<String>,
    /// A room the request is shown in, besides the approvals list.
    pub room: Option<String>,
}

/// An approval request and everything that has happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub id: RequestId,
    /// Incremented by every transition; the store's compare-and-swap token.
    pub version: u64,
    pub status: Status,
    pub action: Action,
    pub action_digest: ActionDigest,
    pub requested_by: Requester,
    pub requested_at: Timestamp,
    pub expires_at: Timestamp,
    pub valid_for_seconds: u64,
    #[serde(default)]
    pub recipient_email: Option<String>,
    #[serde(default)]
    pub recipient_slack: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Fields the approver must fill in to approve.
    #[serde(default)]
    pub requested_fields: Vec<String>,
    /// The room it is shown in.
    #[serde(default)]
    pub room: Option<String>,
    #[serde(default)]
    pub decision: Option<Decision>,
    /// The signed proof of the decision (approvals and rejections alike).
    #[serde(default)]
    pub proof: Option<Envelope>,
    /// When the request timed out or was cancelled.
    #[serde(default)]
    pub closed_at: Option<Timestamp>,
    /// The action carried out under this approval; set once, which makes it single use.
    #[serde(default)]
    pub action_record: Option<ActionRecord>,
    /// The proof redeemed by the executor that acted on it: the same single use as
    /// `action_record`, so at most one of the two is ever set.
    #[serde(default)]
    pub redemption: Option<crate::redeem::Redemption>,
    /// What happened when the action ran; recorded once, after the action.
    #[serde(default)]
    pub outcome: Option<crate::evidence::OutcomeRecord>,
    /// Reviews by the operator-configured reviewer.
    #[serde(default)]
    pub reviews: Vec<crate::evidence::ReviewRecord>,
    /// Why policies sent it to people, and what a timeout becomes; absent when no
    /// policy matched (or none is configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyHold>,
    /// How many distinct accounts must approve, and from which group; absent for one
    /// approver from anyone, as every request needed before quorum existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<Quorum>,
    /// The approvals recorded while it waited for more (each its own
    /// `request_approval_recorded` entry), in order; the final decision names them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<RecordedApproval>,
}

/// What the matching policies said of a request they sent to people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyHold {
    /// The policy set, `sha256:<hex>`.
    pub policy_set: String,
    /// The policies whose requirements apply (ids).
    pub policies: Vec<String>,
    /// What the request becomes when nobody decides in time: a signed `fallback`
    /// decision; absent, it times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<crate::decision::Verdict>,
}

impl ApprovalRequest {
    /// Validates `new` and builds the pending request. `id` is chosen by the caller.
    pub fn create(
        id: RequestId,
        new: NewRequest,
        requested_by: &Principal,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        let action = Action::new(new.description, new.details);
        validate_action(&action, limits)?;
        let timeout = timeout_seconds(new.timeout_hours, new.timeout_seconds, limits)?;
        let valid_for = match new.valid_for_seconds {
            None => limits.default_valid_for_seconds,
            Some(0) => {
                return Err(CoreError::invalid(
                    "valid_for_seconds",
                    "must be at least 1 second",
                ));
            }
            Some(v) if v > limits.max_valid_for_seconds => {
                return Err(CoreError::invalid(
                    "valid_for_seconds",
                    format!(
                        "{v} exceeds the maximum of {}",
                        limits.max_valid_for_seconds
                    ),
                ));
            }
            Some(v) => v,
        };
        let recipient_email = optional_text("recipient_email", new.recipient_email, 320)?;
        if let Some(email) = &recipient_email {
            let valid = email
                .split_once('@')
                .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'));
            if !valid || email.chars().any(char::is_whitespace) {
                return Err(CoreError::invalid(
                    "recipient_email",
                    format!("{email:?} is not an email address"),
                ));
            }
        }
        let recipient_slack = optional_text("recipient_slack", new.recipient_slack, 256)?;
        let idempotency_key = optional_text("idempotency_key", new.idempotency_key, 255)?;
        let requested_fields = validate_field_names(new.requested_fields, limits)?;
        let room = new
            .room
            .as_deref()
            .map(crate::rooms::room_name)
            .transpose()?;
        let request = Self {
            id,
            version: 1,
            status: Status::Pending,
            action_digest: action.digest(),
            action,
            requested_by: requested_by.as_requester(),
            requested_at: now,
            expires_at: now.plus_seconds(timeout),
            valid_for_seconds: valid_for,
            recipient_email,
            recipient_slack,
            idempotency_key,
            requested_fields,
            room,
            decision: None,
            proof: None,
            closed_at: None,
            action_record: None,
            redemption: None,
            outcome: None,
            reviews: Vec::new(),
            policy: None,
            quorum: None,
            approvals: Vec::new(),
        };
        Ok(Transition {
            event: Event::created(&request),
            request,
        })
    }

    /// Whether the request's time to be decided has run out at `now`.
    pub fn is_past_expiry(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// The status as of `now`: a pending request past its expiry reads as timed out even
    /// before the sweeper has recorded it, so nothing ever treats it as still open.
    pub fn effective_status(&self, now: Timestamp) -> Status {
        if self.status == Status::Pending && self.is_past_expiry(now) {
            Status::TimedOut
        } else {
            self.status
        }
    }

    /// The error for any attempt to decide or cancel a request that is no longer pending.
    pub fn closed_error(&self, now: Timestamp) -> Option<CoreError> {
        match self.effective_status(now) {
            Status::Pending => None,
            Status::TimedOut if self.status == Status::Pending => Some(CoreError::Expired {
                request_id: self.id.clone(),
                expires_at: self.expires_at,
            }),
            status => Some(CoreError::AlreadyDecided {
                request_id: self.id.clone(),
                status,
                decided_by: self.decision.as_ref().map(|d| {
                    d.approvers
                        .iter()
                        .map(|a| format!("{} via {}", a.display_name, a.channel.as_str()))
                        .collect::<Vec<_>>()
                        .join(", ")
                }),
                decided_at: self
                    .decision
                    .as_ref()
                    .map(|d| d.decided_at)
                    .or(self.closed_at),
            }),
        }
    }

    /// The pending request becomes `timed_out`. Fails if it is not pending or not yet due.
    pub fn time_out(&self, now: Timestamp) -> Result<Transition, CoreError> {
        if self.status != Status::Pending {
            return Err(self
                .closed_error(now)
                .unwrap_or_else(|| CoreError::invalid("status", "request is not pending")));
        }
        if !self.is_past_expiry(now) {
            return Err(CoreError::invalid(
                "expires_at",
                format!("request {} is not due until {}", self.id, self.expires_at),
            ));
        }
        let request = Self {
            version: self.version + 1,
            status: Status::TimedOut,
            closed_at: Some(now),
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::RequestTimedOut,
                &request,
                now,
                None,
                json!({"expires_at": self.expires_at}),
                None,
            ),
            request,
        })
    }

    /// The requester withdraws its pending request.
    pub fn cancel(&self, by: &Principal, now: Timestamp) -> Result<Transition, CoreError> {
        if let Some(err) = self.closed_error(now) {
            return Err(err);
        }
        if by.id != self.requested_by.id && !by.role.may_decide() {
            return Err(CoreError::Forbidden(format!(
                "only the requester ({}) or an approver may cancel request {}",
                self.requested_by.id, self.id
            )));
        }
        let request = Self {
            version: self.version + 1,
            status: Status::Cancelled,
            closed_at: Some(now),
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::RequestCancelled,
                &request,
                now,
                Some(by.id.clone()),
                json!({}),
                None,
            ),
            request,
        })
    }

    /// Whether the approval may be acted on at `now`; the reason when it may not.
    pub fn check_usable(&self, now: Timestamp) -> Result<&Decision, NotUsable> {
        let not_approved = || NotUsable::NotApproved {
            request_id: self.id.clone(),
            status: self.effective_status(now),
        };
        if self.status != Status::Approved {
            return Err(not_approved());
        }
        let decision = self.decision.as_ref().ok_or_else(not_approved)?;
        if let Some((used_at, tool)) = self.used() {
            return Err(NotUsable::AlreadyUsed {
                request_id: self.id.clone(),
                used_at,
                tool,
            });
        }
        if now >= decision.valid_until {
            return Err(NotUsable::ValidityExpired {
                request_id: self.id.clone(),
                valid_until: decision.valid_until,
            });
        }
        Ok(decision)
    }

    /// When the approval was used, and how: the tool `record_action` named, or who
    /// redeemed the proof.
    pub fn used(&self) -> Option<(Timestamp, String)> {
        match (&self.action_record, &self.redemption) {
            (Some(record), _) => Some((record.recorded_at, record.tool.clone())),
            (None, Some(r)) => Some((r.redeemed_at, format!("redeemed by {}", r.redeemed_by))),
            (None, None) => None,
        }
    }

    /// Records that the approved action is being carried out, consuming the approval.
    pub fn record_action(
        &self,
        tool: String,
        details: BTreeMap<String, String>,
        by: &Principal,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        if tool.trim().is_empty() {
            return Err(CoreError::invalid(
                "tool",
                "must name the tool that performs the action",
            ));
        }
        if tool.len() > limits.max_detail_key_bytes {
            return Err(CoreError::invalid(
                "tool",
                format!("longer than {} bytes", limits.max_detail_key_bytes),
            ));
        }
        validate_map("details", &details, limits.max_details, limits)?;
        if by.id != self.requested_by.id {
            return Err(CoreError::Forbidden(format!(
                "request {} was made by {}; only the requester may act on its approval",
                self.id, self.requested_by.id
            )));
        }
        self.check_usable(now).map_err(CoreError::NotUsable)?;
        let request = Self {
            version: self.version + 1,
            action_record: Some(ActionRecord {
                tool: tool.clone(),
                details: details.clone(),
                recorded_by: by.id.clone(),
                recorded_at: now,
            }),
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::ActionRecorded,
                &request,
                now,
                Some(by.id.clone()),
                json!({"action_digest": self.action_digest, "tool": tool}),
                Some(json!({"details": details})),
            ),
            request,
        })
    }
}

fn optional_text(
    field: &str,
    value: Option<String>,
    max_bytes: usize,
) -> Result<Option<String>, CoreError> {
    match value.map(|v| v.trim().to_string()) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) if v.len() > max_bytes => Err(CoreError::invalid(
            field,
            format!("longer than {max_bytes} bytes"),
        )),
        Some(v) if v.chars().any(char::is_control) => {
            Err(CoreError::invalid(field, "contains control characters"))
        }
        Some(v) => Ok(Some(v)),
    }
}

fn validate_field_names(names: Vec<String>, limits: &Limits) -> Result<Vec<String>, CoreError> {
    if names.len() > limits.max_fields {
        return Err(CoreError::invalid(
            "requested_fields",
            format!("at most {} fields may be requested", limits.max_fields),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let name = name.trim().to_string();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(CoreError::invalid(
                "requested_fields",
                format!("{name:?} is not a field name (letters, digits, _ - ., at most 64)"),
            ));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

fn timeout_seconds(
    hours: Option<f64>,
    seconds: Option<u64>,
    limits: &Limits,
) -> Result<u64, CoreError> {
    let max = limits.max_timeout_seconds;
    match (hours, seconds) {
        (Some(_), Some(_)) => Err(CoreError::invalid(
            "timeout_hours",
            "give timeout_hours or timeout_seconds, not both",
        )),
        (None, None) => Ok(limits.default_timeout_seconds),
        (None, Some(0)) => Err(CoreError::invalid("timeout_seconds", "must be at least 1")),
        (None, Some(s)) if s > max => Err(CoreError::invalid(
            "timeout_seconds",
            format!("{s} exceeds the maximum of {max} ({} hours)", max / 3600),
        )),
        (None, Some(s)) => Ok(s),
        (Some(h), None) if !h.is_finite() || h <= 0.0 => Err(CoreError::invalid(
            "timeout_hours",
            format!("{h} is not a positive number of hours"),
        )),
        (Some(h), None) => {
            let s = (h * 3600.0).round();
            if s > max as f64 {
                Err(CoreError::invalid(
                    "timeout_hours",
                    format!("{h} exceeds the maximum of {} hours", max / 3600),
                ))
            } else {
                // In range 0..=max and rounded, so the cast is exact.
                Ok((s as u64).max(1))
            }
        }
    }
}

pub(crate) fn validate_action(action: &Action, limits: &Limits) -> Result<(), CoreError> {
    if action.description.trim().is_empty() {
        return Err(CoreError::invalid(
            "action_description",
            "must say what the agent wants to do",
        ));
    }
    if action.description.len() > limits.max_description_bytes {
        return Err(CoreError::invalid(
            "action_description",
            format!("longer than {} bytes", limits.max_description_bytes),
        ));
    }
    validate_map(
        "action_details",
        &action.details,
        limits.max_details,
        limits,
    )
}

pub(crate) fn validate_map(
    field: &str,
    map: &BTreeMap<String, String>,
    max_entries: usize,
    limits: &Limits,
) -> Result<(), CoreError> {
    if map.len() > max_entries {
        return Err(CoreError::invalid(
            field,
            format!(
                "has {} entries, at most {max_entries} are allowed",
                map.len()
            ),
        ));
    }
    for (key, value) in map {
        if key.is_empty() {
            return Err(CoreError::invalid(field, "keys must not be empty"));
        }
        if key.len() > limits.max_detail_key_bytes {
            return Err(CoreError::invalid(
                field,
                format!(
                    "key {:?}… is longer than {} bytes",
                    key.chars().take(32).collect::<String>(),
                    limits.max_detail_key_bytes
                ),
            ));
        }
        if value.len() > limits.max_detail_value_bytes {
            return Err(CoreError::invalid(
                field,
                format!(
                    "value of {key:?} is longer than {} bytes",
                    limits.max_detail_value_bytes
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use crate::{Channel, DecisionInput, Role, Signer, Verdict};

    #[test]
    fn create_validates_and_defaults() {
        let limits = Limits::default();
        let t = ApprovalRequest::create(
            "req_x".into(),
            NewRequest {
                description: "Delete staging database".into(),
                ..NewRequest::default()
            },
            &agent(),
            t0(),
            &limits,
        )
        .unwrap();
        assert_eq!(t.request.status, Status::Pending);
        assert_eq!(t.request.expires_at, t0().plus_seconds(24 * 3600));
        assert_eq!(t.request.valid_for_seconds, 900);
        assert_eq!(t.event.kind(), "request_created");
        assert_eq!(t.event.subject(), Some("req_x"));
        assert_eq!(
            t.request.action_digest.as_str(),
            "sha256:63f9d847294aced392cec1056dda9f0b363c14c0f6838dd72844f3e926fa2adb"
        );
    }

    #[test]
    fn create_rejects_bad_input_naming_the_field() {
        let limits = Limits::default();
        let cases: Vec<(NewRequest, &str)> = vec![
            (
                NewRequest {
                    description: "  ".into(),
                    ..new_request()
                },
                "action_description",
            ),
            (
                NewRequest {
                    timeout_hours: Some(169.0),
                    timeout_seconds: None,
                    ..new_request()
                },
                "timeout_hours",
            ),
            (
                NewRequest {
                    timeout_hours: Some(-1.0),
                    timeout_seconds: None,
                    ..new_request()
                },
                "timeout_hours",
            ),
            (
                NewRequest {
                    timeout_hours: Some(f64::NAN),
                    timeout_seconds: None,
                    ..new_request()
                },
                "timeout_hours",
            ),
            (
                NewRequest {
                    timeout_hours: Some(1.0),
                    ..new_request()
                },
                "timeout_hours",
            ),
            (
                NewRequest {
                    timeout_seconds: Some(0),
                    ..new_request()
                },
                "timeout_seconds",
            ),
            (
                NewRequest {
                    timeout_seconds: Some(168 * 3600 + 1),
                    ..new_request()
                },
                "timeout_seconds",
            ),
            (
                NewRequest {
                    valid_for_seconds: Some(0),
                    ..new_request()
                },
                "valid_for_seconds",
            ),
            (
                NewRequest {
                    recipient_email: Some("not-an-email".into()),
                    ..new_request()
                },
                "recipient_email",
            ),
            (
                NewRequest {
                    description: "x".repeat(5000),
                    ..new_request()
                },
                "action_description",
            ),
            (
                NewRequest {
                    details: BTreeMap::from([(String::new(), "v".to_string())]),
                    ..new_request()
                },
                "action_details",
            ),
        ];
        for (input, field) in cases {
            match ApprovalRequest::create("r".into(), input.clone(), &agent(), t0(), &limits) {
                Err(CoreError::Invalid { field: f, .. }) => assert_eq!(f, field, "{input:?}"),
                other => panic!("expected invalid {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn timeout_hours_max_is_accepted() {
        let t = ApprovalRequest::create(
            "r".into(),
            NewRequest {
                timeout_hours: Some(168.0),
                timeout_seconds: None,
                ..new_request()
            },
            &agent(),
            t0(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(t.request.expires_at, t0().plus_seconds(168 * 3600));
    }

    #[test]
    fn decide_records_approver_and_bumps_version() {
        let req = pending();
        let t = decide(&req, Verdict::Approved, t0().plus_seconds(5));
        assert_eq!(t.request.status, Status::Approved);
        assert_eq!(t.request.version, req.version + 1);
        let d = t.request.decision.as_ref().unwrap();
        assert_eq!(d.approvers[0].id, "token:alice");
        assert_eq!(d.approvers[0].channel, Channel::Api);
        assert_eq!(d.valid_until, t0().plus_seconds(5 + 600));
        assert!(t.request.proof.is_some());
        assert_eq!(t.event.kind(), "request_decided");
    }

    #[test]
    fn second_decision_is_refused_and_names_the_first_decider() {
        let decided = decide(&pending(), Verdict::Rejected, t0()).request;
        let err = decided
            .decide(
                Verdict::Approved,
                DecisionInput::default(),
                &Principal::from_token("bob", Role::Approver),
                Channel::Api,
                t0(),
                "n".into(),
                &signer(),
                &Limits::default(),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            CoreError::AlreadyDecided {
                status: Status::Rejected,
                ..
            }
        ));
        assert!(err.to_string().contains("alice via api"), "{err}");
    }

    #[test]
    fn agents_and_requesters_cannot_decide() {
        let req = pending();
        let attempt = |p: &Principal| {
            req.decide(
                Verdict::Approved,
                DecisionInput::default(),
                p,
                Channel::Api,
                t0(),
                "n".into(),
                &Signer::from_seed([1; 32]),
                &Limits::default(),
            )
        };
        assert!(matches!(attempt(&agent()), Err(CoreError::Forbidden(_))));
        // The same identity holding an approver role still may not approve its own ask.
        let same_identity = Principal::from_token("deploy-bot", Role::Approver);
        assert!(matches!(
            attempt(&same_identity),
            Err(CoreError::SelfApproval { .. })
        ));
    }

    #[test]
    fn expiry_fails_closed() {
        let req = pending();
        let at_expiry = req.expires_at;
        assert_eq!(req.effective_status(at_expiry), Status::TimedOut);
        let err = req
            .decide(
                Verdict::Approved,
                DecisionInput::default(),
                &approver(),
                Channel::Api,
                at_expiry,
                "n".into(),
                &signer(),
                &Limits::default(),
            )
            .unwrap_err();
        assert!(matches!(err, CoreError::Expired { .. }), "{err}");
        assert!(req.time_out(t0()).is_err(), "not due yet");
        let timed_out = req.time_out(at_expiry).unwrap();
        assert_eq!(timed_out.request.status, Status::TimedOut);
        assert_eq!(timed_out.event.kind(), "request_timed_out");
        assert!(timed_out.request.check_usable(at_expiry).is_err());
    }

    #[test]
    fn approval_is_single_use_and_time_bound() {
        let limits = Limits::default();
        let approved = decide(&pending(), Verdict::Approved, t0()).request;
        let valid_until = approved.decision.as_ref().unwrap().valid_until;
        // Past validity: refused with that reason.
        let late = approved
            .record_action(
                "pay".into(),
                BTreeMap::new(),
                &agent(),
                valid_until,
                &limits,
            )
            .unwrap_err();
        assert!(
            matches!(
                late,
                CoreError::NotUsable(NotUsable::ValidityExpired { .. })
            ),
            "{late}"
        );
        // Another principal may not use it.
        let other = Principal::from_token("other-bot", Role::Agent);
        assert!(matches!(
            approved.record_action("pay".into(), BTreeMap::new(), &other, t0(), &limits),
            Err(CoreError::Forbidden(_))
        ));
        let used = approved
            .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), &limits)
            .unwrap();
        assert_eq!(used.event.kind(), "action_recorded");
        let again = used
            .request
            .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), &limits)
            .unwrap_err();
        assert!(
            matches!(again, CoreError::NotUsable(NotUsable::AlreadyUsed { .. })),
            "{again}"
        );
        assert!(again.to_string().contains("single use"));
    }

    #[test]
    fn rejected_requests_cannot_be_used() {
        let rejected = decide(&pending(), Verdict::Rejected, t0()).request;
        let err = rejected
            .record_action(
                "pay".into(),
                BTreeMap::new(),
                &agent(),
                t0(),
                &Limits::default(),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            CoreError::NotUsable(NotUsable::NotApproved {
                status: Status::Rejected,
                ..
            })
        ));
    }

    #[test]
    fn requested_fields_must_be_filled_to_approve() {
        let limits = Limits::default();
        let req = ApprovalRequest::create(
            "r".into(),
            NewRequest {
                requested_fields: vec!["po_number".into(), "po_number".into()],
                ..new_request()
            },
            &agent(),
            t0(),
            &limits,
        )
        .unwrap()
        .request;
        assert_eq!(req.requested_fields, vec!["po_number".to_string()]);
        let attempt = |fields: BTreeMap<String, String>, verdict| {
            req.decide(
                verdict,
                DecisionInput {
                    comment: None,
                    fields,
                },
                &approver(),
                Channel::Api,
                t0(),
                "n".into(),
                &signer(),
                &limits,
            )
        };
        let err = attempt(BTreeMap::new(), Verdict::Approved).unwrap_err();
        assert!(err.to_string().contains("po_number"), "{err}");
        assert!(
            attempt(BTreeMap::new(), Verdict::Rejected).is_ok(),
            "a rejection needs no fields"
        );
        let ok = attempt(
            BTreeMap::from([("po_number".to_string(), "PO-1".to_string())]),
            Verdict::Approved,
        )
        .unwrap();
        assert_eq!(ok.request.decision.unwrap().fields["po_number"], "PO-1");
        let bad = ApprovalRequest::create(
            "r".into(),
            NewRequest {
                requested_fields: vec!["no spaces".into()],
                ..new_request()
            },
            &agent(),
            t0(),
            &limits,
        );
        assert!(matches!(bad, Err(CoreError::Invalid { .. })));
    }

    #[test]
    fn cancel_by_requester_only() {
        let req = pending();
        let stranger = Principal::from_token("stranger", Role::Agent);
        assert!(matches!(
            req.cancel(&stranger, t0()),
            Err(CoreError::Forbidden(_))
        ));
        let t = req.cancel(&agent(), t0()).unwrap();
        assert_eq!(t.request.status, Status::Cancelled);
        assert!(t.request.cancel(&agent(), t0()).is_err());
    }
}
