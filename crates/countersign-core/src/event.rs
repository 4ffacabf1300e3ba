//! Events: what every state change emits, in the same transaction as the change.
//!
//! The store keeps them in order; waiters and live views are woken by them, and the
//! transparency log is built over their exact bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionDigest};
use crate::decision::{Decision, Verdict};
use crate::principal::{Approver, Requester, Role};
use crate::proof::AuthorizationType;
use crate::request::ApprovalRequest;
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at: Timestamp,
    /// The authenticated principal that caused it; `None` for the system (expiry).
    pub actor: Option<String>,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    RequestCreated {
        request_id: String,
        action: Action,
        action_digest: ActionDigest,
        requested_by: Requester,
        expires_at: Timestamp,
        valid_for_seconds: u64,
    },
    RequestDecided {
        request_id: String,
        decision: Verdict,
        authorization_type: AuthorizationType,
        approvers: Vec<Approver>,
        comment: Option<String>,
        fields: BTreeMap<String, String>,
        valid_until: Timestamp,
        nonce: String,
    },
    RequestTimedOut {
        request_id: String,
        expires_at: Timestamp,
    },
    RequestCancelled {
        request_id: String,
    },
    ActionRecorded {
        request_id: String,
        action_digest: ActionDigest,
        tool: String,
        details: BTreeMap<String, String>,
    },
    TokenCreated {
        token_id: String,
        name: String,
        role: Role,
    },
    TokenRevoked {
        token_id: String,
        name: String,
    },
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match &self.body {
            EventBody::RequestCreated { .. } => "request_created",
            EventBody::RequestDecided { .. } => "request_decided",
            EventBody::RequestTimedOut { .. } => "request_timed_out",
            EventBody::RequestCancelled { .. } => "request_cancelled",
            EventBody::ActionRecorded { .. } => "action_recorded",
            EventBody::TokenCreated { .. } => "token_created",
            EventBody::TokenRevoked { .. } => "token_revoked",
        }
    }

    /// The request this event is about, if any: what waiters are keyed by.
    pub fn request_id(&self) -> Option<&str> {
        match &self.body {
            EventBody::RequestCreated { request_id, .. }
            | EventBody::RequestDecided { request_id, .. }
            | EventBody::RequestTimedOut { request_id, .. }
            | EventBody::RequestCancelled { request_id }
            | EventBody::ActionRecorded { request_id, .. } => Some(request_id),
            EventBody::TokenCreated { .. } | EventBody::TokenRevoked { .. } => None,
        }
    }

    /// The exact bytes the store keeps (and the log will hash).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Strings, maps and enums always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn created(request: &ApprovalRequest) -> Self {
        Self {
            at: request.requested_at,
            actor: Some(request.requested_by.id.clone()),
            body: EventBody::RequestCreated {
                request_id: request.id.clone(),
                action: request.action.clone(),
                action_digest: request.action_digest.clone(),
                requested_by: request.requested_by.clone(),
                expires_at: request.expires_at,
                valid_for_seconds: request.valid_for_seconds,
            },
        }
    }

    pub fn decided(request_id: &str, decision: &Decision) -> Self {
        Self {
            at: decision.decided_at,
            actor: decision.approvers.first().map(|a| a.id.clone()),
            body: EventBody::RequestDecided {
                request_id: request_id.to_string(),
                decision: decision.decision,
                authorization_type: decision.authorization_type,
                approvers: decision.approvers.clone(),
                comment: decision.comment.clone(),
                fields: decision.fields.clone(),
                valid_until: decision.valid_until,
                nonce: decision.nonce.clone(),
            },
        }
    }
}
