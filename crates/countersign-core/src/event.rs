//! Events: what every state change emits, in the same transaction as the change, and the
//! log entries they become.
//!
//! An event has public data (who, what kind, digests, decisions) and, optionally, a
//! sensitive payload (the action's text, comments, free-form details). Sealing an event
//! with a random salt produces its **log entry**: the RFC 8785 canonical JSON of
//! `{"v":1, "type", "at", "actor", "subject", "data", "payload"}` where `payload` is a
//! salted commitment `sha256:hex(SHA-256(salt || JCS(payload)))` instead of the payload
//! itself. The entry's exact bytes are the Merkle leaf. The payload and its salt are
//! kept beside the log: disclosing them opens the commitment; withholding them (a
//! redacted evidence bundle) hides the values while everything else still verifies.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::decision::Decision;
use crate::request::ApprovalRequest;
use crate::time::Timestamp;

/// The log entry format version.
pub const ENTRY_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RequestCreated,
    RequestDecided,
    /// An approval of a request that needs more than one: it stays pending.
    RequestApprovalRecorded,
    RequestTimedOut,
    RequestCancelled,
    ActionRecorded,
    ProofRedeemed,
    OutcomeRecorded,
    ReviewRecorded,
    DecisionRecorded,
    TokenCreated,
    TokenRevoked,
    KeyRotated,
    KeyEndorsed,
    UserCreated,
    UserActivated,
    UserDisabled,
    RoomCreated,
    RoomRenamed,
    RoomDeleted,
    RoomRestored,
    RoomPurged,
    RoomRestricted,
    MemberJoined,
    MemberLeft,
    MemberKicked,
    PresenceSet,
    MessagePosted,
    QuestionAnswered,
    BlockerResolved,
    /// The scheduled audit found the database disagreeing with the log.
    AuditMismatch,
    /// A policy set was loaded (its digest, file names, and their text in the payload).
    PolicySetLoaded,
    /// A person gave a standing grant (its bounds in the payload).
    GrantCreated,
    /// A grant approved a request (one more use).
    GrantUsed,
    GrantRevoked,
}

impl EventKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::RequestCreated => "request_created",
            EventKind::RequestDecided => "request_decided",
            EventKind::RequestApprovalRecorded => "request_approval_recorded",
            EventKind::RequestTimedOut => "request_timed_out",
            EventKind::RequestCancelled => "request_cancelled",
            EventKind::ActionRecorded => "action_recorded",
            EventKind::ProofRedeemed => "proof_redeemed",
            EventKind::OutcomeRecorded => "outcome_recorded",
            EventKind::ReviewRecorded => "review_recorded",
            EventKind::DecisionRecorded => "decision_recorded",
            EventKind::TokenCreated => "token_created",
            EventKind::TokenRevoked => "token_revoked",
            EventKind::KeyRotated => "key_rotated",
            EventKind::KeyEndorsed => "key_endorsed",
            EventKind::UserCreated => "user_created",
            EventKind::UserActivated => "user_activated",
            EventKind::UserDisabled => "user_disabled",
            EventKind::RoomCreated => "room_created",
            EventKind::RoomRenamed => "room_renamed",
            EventKind::RoomDeleted => "room_deleted",
            EventKind::RoomRestored => "room_restored",
            EventKind::RoomPurged => "room_purged",
            EventKind::RoomRestricted => "room_restricted",
            EventKind::MemberJoined => "member_joined",
            EventKind::MemberLeft => "member_left",
            EventKind::MemberKicked => "member_kicked",
            EventKind::PresenceSet => "presence_set",
            EventKind::MessagePosted => "message_posted",
            EventKind::QuestionAnswered => "question_answered",
            EventKind::BlockerResolved => "blocker_resolved",
            EventKind::AuditMismatch => "audit_mismatch",
            EventKind::PolicySetLoaded => "policy_set_loaded",
            EventKind::GrantCreated => "grant_created",
            EventKind::GrantUsed => "grant_used",
            EventKind::GrantRevoked => "grant_revoked",
        }
    }
}

/// An event before sealing.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    pub at: Timestamp,
    /// The authenticated principal that caused it; `None` for the system (expiry).
    pub actor: Option<String>,
    /// The request (or recorded decision) it is about; `None` for tokens and keys.
    pub subject: Option<String>,
    /// Public fields, always in the log entry.
    pub data: Map<String, Value>,
    /// Sensitive fields, committed to in the log entry and kept beside it.
    pub payload: Option<Value>,
}

/// The log entry: what the Merkle leaf is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogEntry {
    pub v: u32,
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub at: Timestamp,
    pub actor: Option<String>,
    pub subject: Option<String>,
    pub data: Map<String, Value>,
    /// `sha256:` + hex of SHA-256(salt || JCS(payload)), when the event has a payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

impl LogEntry {
    /// The entry's exact bytes: RFC 8785 canonical JSON.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Maps of JSON values always canonicalize.
        self.canonical().unwrap_or_default()
    }

    /// The RFC 8785 form written member by member, in the order RFC 8785 sorts them
    /// (`actor`, `at`, `data`, `payload`, `subject`, `type`, `v`), without first copying
    /// the entry into a JSON value: every event is sealed this way. The unit tests hold
    /// it to the generic canonical form of the same entry.
    fn canonical(&self) -> Result<Vec<u8>, serde_json::Error> {
        use crate::jcs::{write_object, write_string};
        let optional = |text: &Option<String>, out: &mut Vec<u8>| match text {
            Some(text) => write_string(text, out),
            None => {
                out.extend_from_slice(b"null");
                Ok(())
            }
        };
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"actor\":");
        optional(&self.actor, &mut out)?;
        out.extend_from_slice(b",\"at\":");
        write_string(&self.at.to_string(), &mut out)?;
        out.extend_from_slice(b",\"data\":");
        write_object(&self.data, &mut out)?;
        if let Some(payload) = &self.payload {
            out.extend_from_slice(b",\"payload\":");
            write_string(payload, &mut out)?;
        }
        out.extend_from_slice(b",\"subject\":");
        optional(&self.subject, &mut out)?;
        out.extend_from_slice(b",\"type\":");
        write_string(self.kind.as_str(), &mut out)?;
        out.extend_from_slice(b",\"v\":");
        out.extend_from_slice(self.v.to_string().as_bytes());
        out.push(b'}');
        Ok(out)
    }

    /// The request version this entry records, for request events.
    pub fn version(&self) -> Option<u64> {
        self.data.get("version").and_then(Value::as_u64)
    }
}

/// The opening of a payload commitment: the salt (hex) and the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadOpening {
    pub salt: String,
    pub payload: Value,
}

impl PayloadOpening {
    /// The commitment this opening opens, or `None` if the salt is not 32 hex bytes.
    pub fn commitment(&self) -> Option<String> {
        let salt = hex::decode(&self.salt).ok()?;
        // Only the canonical spelling (64 lowercase hex digits) opens a commitment, so
        // no byte of an opening can change without changing its meaning.
        if salt.len() != 32 || hex::encode(&salt) != self.salt {
            return None;
        }
        Some(commitment(&salt, &self.payload))
    }
}

/// `sha256:` + hex(SHA-256(salt || JCS(payload))).
pub fn commitment(salt: &[u8], payload: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(crate::jcs::value_to_vec(payload).unwrap_or_default());
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// An event ready to store: its entry, the entry's bytes, and the payload opening.
#[derive(Debug, Clone, PartialEq)]
pub struct SealedEvent {
    pub entry: LogEntry,
    pub bytes: Vec<u8>,
    pub payload: Option<PayloadOpening>,
}

impl Event {
    /// Seals the event with `salt` (32 fresh random bytes, supplied by the caller).
    pub fn seal(&self, salt: [u8; 32]) -> SealedEvent {
        let payload = self.payload.as_ref().map(|p| PayloadOpening {
            salt: hex::encode(salt),
            payload: p.clone(),
        });
        let entry = LogEntry {
            v: ENTRY_VERSION,
            kind: self.kind,
            at: self.at,
            actor: self.actor.clone(),
            subject: self.subject.clone(),
            data: self.data.clone(),
            payload: self.payload.as_ref().map(|p| commitment(&salt, p)),
        };
        SealedEvent {
            bytes: entry.to_bytes(),
            entry,
            payload,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.kind.as_str()
    }

    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// An event about a request at `request.version` (after the transition).
    pub fn about(
        kind: EventKind,
        request: &ApprovalRequest,
        at: Timestamp,
        actor: Option<String>,
        data: Value,
        payload: Option<Value>,
    ) -> Self {
        let mut map = match data {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        map.insert("version".into(), json!(request.version));
        Self {
            kind,
            at,
            actor,
            subject: Some(request.id.clone()),
            data: map,
            payload,
        }
    }

    pub fn created(request: &ApprovalRequest) -> Self {
        Self::about(
            EventKind::RequestCreated,
            request,
            request.requested_at,
            Some(request.requested_by.id.clone()),
            {
                let mut data = json!({
                    "action_digest": request.action_digest,
                    "requested_by": request.requested_by,
                    "expires_at": request.expires_at,
                    "valid_for_seconds": request.valid_for_seconds,
                    "requested_fields": request.requested_fields,
                    "room": request.room,
                });
                // Why policies sent it to people, when they did.
                if let Some(policy) = &request.policy {
                    data["policy"] = json!(policy);
                }
                // How many must approve, when more than one (or from a group) must.
                if let Some(quorum) = &request.quorum {
                    data["quorum"] = json!(quorum);
                }
                data
            },
            Some(json!({
                "action": request.action,
                "recipient_email": request.recipient_email,
                "recipient_slack": request.recipient_slack,
            })),
        )
    }

    pub fn decided(request: &ApprovalRequest, decision: &Decision) -> Self {
        let mut data = json!({
            "decision": decision.decision,
            "authorization_type": decision.authorization_type,
            "approvers": decision.approvers,
            "action_digest": request.action_digest,
            "valid_until": decision.valid_until,
            "nonce": decision.nonce,
        });
        // Only a rule's decision names a policy; a person's entry keeps its shape.
        if let Some(policy) = &decision.policy {
            data["policy"] = json!(policy);
        }
        if let Some(grant) = &decision.grant {
            data["grant"] = json!(grant);
        }
        Self::about(
            EventKind::RequestDecided,
            request,
            decision.decided_at,
            // Who made it final: the last of a quorum's approvers, the only one otherwise.
            decision.approvers.last().map(|a| a.id.clone()),
            data,
            Some(json!({"comment": decision.comment, "fields": decision.fields})),
        )
    }

    /// An event with no subject (tokens, keys).
    pub fn system(kind: EventKind, at: Timestamp, actor: Option<String>, data: Value) -> Self {
        Self {
            kind,
            at,
            actor,
            subject: None,
            data: match data {
                Value::Object(map) => map,
                _ => Map::new(),
            },
            payload: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn entries_written_member_by_member_are_their_canonical_json() {
        let at = Timestamp::from_millis(1_800_000_000_123).unwrap();
        let mut entries = Vec::new();
        for (actor, subject, payload) in [
            (None, None, None),
            (Some("token:bot"), Some("req_1"), Some("sha256:00ff")),
            (Some("user:ünïcode \"quoted\"\n"), None, None),
            (None, Some("room:ops/😀"), Some("x")),
        ] {
            let data = json!({
                "version": 3, "status": "approved", "big": 9007199254740992u64, "neg": -7,
                "nested": {"z": [1, "two", null, true], "\u{20ac}": {}, "a": "\u{1}"},
                "Upper": "before lower", "\u{fb33}": 1.5,
            });
            let Value::Object(data) = data else {
                unreachable!()
            };
            entries.push(LogEntry {
                v: ENTRY_VERSION,
                kind: EventKind::RequestDecided,
                at,
                actor: actor.map(str::to_string),
                subject: subject.map(str::to_string),
                data,
                payload: payload.map(str::to_string),
            });
        }
        entries.push(Event::created(&pending()).seal([1; 32]).entry);
        for entry in entries {
            let bytes = entry.to_bytes();
            assert_eq!(
                String::from_utf8(bytes.clone()).unwrap(),
                String::from_utf8(serde_json_canonicalizer::to_vec(&entry).unwrap()).unwrap()
            );
            assert_eq!(bytes, crate::jcs::to_vec(&entry).unwrap());
            let back: LogEntry = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, entry);
        }
    }

    #[test]
    fn sealing_commits_to_the_payload_without_revealing_it() {
        let request = pending();
        let event = Event::created(&request);
        let sealed = event.seal([7; 32]);
        let text = String::from_utf8(sealed.bytes.clone()).unwrap();
        assert!(
            !text.contains("Globex") && !text.contains("Transfer"),
            "{text}"
        );
        assert!(text.contains(request.action_digest.as_str()));
        assert!(
            text.starts_with("{\"actor\":"),
            "canonical key order: {text}"
        );
        let opening = sealed.payload.clone().unwrap();
        assert_eq!(opening.commitment(), sealed.entry.payload);
        // A different salt gives a different commitment: equal payloads are unlinkable.
        assert_ne!(event.seal([8; 32]).entry.payload, sealed.entry.payload);
        // Any change to the payload breaks the opening.
        let mut forged = opening.clone();
        forged.payload["action"]["details"]["amount"] = json!("99999");
        assert_ne!(forged.commitment(), sealed.entry.payload);
        // The bytes round-trip.
        let parsed: LogEntry = serde_json::from_slice(&sealed.bytes).unwrap();
        assert_eq!(parsed, sealed.entry);
        assert_eq!(parsed.to_bytes(), sealed.bytes);
        assert_eq!(parsed.version(), Some(1));
    }

    #[test]
    fn events_without_payload_have_no_commitment() {
        let event = Event::system(
            EventKind::TokenCreated,
            t0(),
            None,
            json!({"token_id": "tok_1"}),
        );
        let sealed = event.seal([0; 32]);
        assert!(sealed.payload.is_none());
        assert!(!String::from_utf8(sealed.bytes).unwrap().contains("payload"));
    }
}
