//! The domain's one error type. Messages are written for the person who must act on them.

use crate::request::Status;
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// An input is malformed or out of bounds; `field` names it.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },

    /// The request was already decided, timed out or cancelled.
    #[error("request {request_id} is already {status}{}", describe_decider(.decided_by, .decided_at))]
    AlreadyDecided {
        request_id: String,
        status: Status,
        decided_by: Option<String>,
        decided_at: Option<Timestamp>,
    },

    /// The request's time to be decided ran out; nobody can decide it now.
    #[error(
        "request {request_id} expired at {expires_at} without a decision (fail closed: it is not approved)"
    )]
    Expired {
        request_id: String,
        expires_at: Timestamp,
    },

    /// The principal asked for this request and may not decide it.
    #[error("{principal} requested {request_id} and may not decide it: a different approver must")]
    SelfApproval {
        request_id: String,
        principal: String,
    },

    /// A quorum's rules keep this decider from counting (separation of duties).
    #[error("{0}")]
    NotCounted(NotCounted),

    /// The principal lacks the role for this operation.
    #[error("{0}")]
    Forbidden(String),

    /// A well-formed input that the current state refuses (a room in the trash, a
    /// question already answered, a username taken); the message says what to do.
    #[error("{0}")]
    Refused(String),

    /// The approval cannot be used to act (not approved, used, or past its validity).
    #[error("{0}")]
    NotUsable(NotUsable),

    /// The same idempotency key was used with a different action.
    #[error(
        "idempotency key {key:?} was already used for a different action (request {request_id}); use a new key for a new action"
    )]
    IdempotencyMismatch { key: String, request_id: String },
}

fn describe_decider(by: &Option<String>, at: &Option<Timestamp>) -> String {
    match (by, at) {
        (Some(by), Some(at)) => format!(" (by {by} at {at})"),
        (None, Some(at)) => format!(" (at {at})"),
        (Some(by), None) => format!(" (by {by})"),
        (None, None) => String::new(),
    }
}

/// Why a decider does not count toward a request's quorum. Quorum counts accounts, so
/// these name the account (and the identity it came through).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotCounted {
    /// The account already approved this request: one account counts once, whichever
    /// identity (token, dashboard, Slack, email) it approves through.
    #[error(
        "account {account} already approved request {request_id} ({approved_by} at {approved_at}); one account counts once: a different approver must give the next approval"
    )]
    AlreadyApproved {
        request_id: String,
        account: String,
        /// How the earlier approval came: `<display name> via <channel>`.
        approved_by: String,
        approved_at: Timestamp,
    },
    /// The request needs its approvers from a group the account is not in.
    #[error(
        "account {account} is not in group {group:?}: request {request_id} must be decided by members of {group:?}"
    )]
    NotEligible {
        request_id: String,
        account: String,
        group: String,
    },
}

/// Why an approval may not be acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotUsable {
    #[error("request {request_id} is {status}, not approved: do not perform the action")]
    NotApproved { request_id: String, status: Status },
    #[error(
        "the approval for {request_id} was already used at {used_at} ({tool}); an approval is single use, request a new one"
    )]
    AlreadyUsed {
        request_id: String,
        used_at: Timestamp,
        tool: String,
    },
    #[error(
        "the approval for {request_id} was valid until {valid_until} and has expired; request a new one"
    )]
    ValidityExpired {
        request_id: String,
        valid_until: Timestamp,
    },
    /// Redeemed for an action other than the one approved.
    #[error(
        "the approval for {request_id} is for the action {approved}, not the given one ({given}): do not perform it"
    )]
    ActionMismatch {
        request_id: String,
        approved: String,
        given: String,
    },
    /// Not a genuine proof of this server's (its signature, key or shape is wrong).
    #[error("the proof is not valid: {reasons}; do not perform the action")]
    InvalidProof { reasons: String },
}

impl CoreError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
