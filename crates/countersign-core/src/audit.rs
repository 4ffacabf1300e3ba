//! The database held to the log: replays the log's entries (with their payload
//! openings) into the state they imply, and compares it with the rows people read
//! (requests, tokens, accounts, rooms and their members). Each difference names its
//! table and id.
//!
//! Pure: the caller streams the entries in log order ([`Audit::push`]), then the rows
//! ([`Audit::request`], [`Audit::token`], ...), then calls [`Audit::finish`], which
//! also names what the log implies but no row holds. Memory grows with the number of
//! subjects (requests, tokens, accounts, rooms), not with the number of entries.
//!
//! What the log does not record cannot be checked against it, and is taken from the
//! row: a request's idempotency key (its proof is checked against the logged decision
//! instead), a token's hash, an account's password hash and lockout counters, a
//! member's presence note.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::decision::{ActionRecord, Decision};
use crate::event::{EventKind, LogEntry, PayloadOpening};
use crate::evidence::{OutcomeRecord, ReviewRecord};
use crate::proof::Statement;
use crate::redeem::Redemption;
use crate::request::{ApprovalRequest, Status};
use crate::rooms::Room;
use crate::{Action, TokenRecord};

/// One way the database disagrees with its log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    /// `requests`, `tokens`, `payloads`, `events`, `users`, `rooms`, `members`.
    pub table: &'static str,
    /// The row's id (a payload's and an event's: its sequence number).
    pub id: String,
    pub what: String,
}

impl Difference {
    pub fn new(table: &'static str, id: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            table,
            id: id.into(),
            what: what.into(),
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.table, self.id, self.what)
    }
}

/// What the log says of a token.
#[derive(Debug, Clone, PartialEq)]
struct ImpliedToken {
    name: Value,
    role: Value,
    created_at: crate::Timestamp,
    expires_at: Value,
    scopes: Value,
    revoked_at: Option<crate::Timestamp>,
}

/// What the log says of an account.
#[derive(Debug, Clone, PartialEq)]
struct ImpliedUser {
    username: Value,
    role: Value,
    disabled: bool,
}

/// The replay and the comparison. See the module's documentation.
#[derive(Default)]
pub struct Audit {
    requests: HashMap<String, ApprovalRequest>,
    /// Requests whose entries could not be replayed (reported once, then skipped).
    broken: HashSet<String>,
    tokens: HashMap<String, ImpliedToken>,
    users: HashMap<String, ImpliedUser>,
    /// Standing grants as the log implies them (a grant's JSON, without its proof).
    grants: HashMap<String, Map<String, Value>>,
    rooms: HashMap<String, Room>,
    members: HashSet<(String, String)>,
    /// Room entries whose opening is gone: fine only if the room was purged.
    erased: Vec<(u64, String)>,
    purged: HashSet<String>,
    differences: Vec<Difference>,
    entries: u64,
    rows: u64,
}

/// A short rendering of a value, for a difference's text.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

/// Member `name` of an entry's data or payload, read as `T` (absent reads as null).
pub(crate) fn field<T: DeserializeOwned>(
    data: &Map<String, Value>,
    name: &str,
) -> Result<T, String> {
    // Read in place: the replay reads every entry's fields, so no copy of the value.
    T::deserialize(data.get(name).unwrap_or(&Value::Null))
        .map_err(|e| format!("its {name:?} does not read: {e}"))
}

/// The members on which two JSON objects differ, by path (`action.description`):
/// objects on both sides are descended into, anything else is compared whole.
fn diff_objects(row: &Value, log: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_at("", row, log, &mut out);
    out
}

fn diff_at(path: &str, row: &Value, log: &Value, out: &mut Vec<String>) {
    if row == log {
        return;
    }
    match (row, log) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                let path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_at(&path, x, y, out);
            }
        }
        _ => out.push(format!(
            "{path} is {} in the row, the log says {}",
            short(row),
            short(log)
        )),
    }
}

impl Audit {
    pub fn new() -> Self {
        Self::default()
    }

    fn differ(&mut self, table: &'static str, id: impl Into<String>, what: impl Into<String>) {
        self.differences.push(Difference::new(table, id, what));
    }

    /// The next entry, in log order (`seq` = index + 1), with its payload opening as
    /// stored (`None` when there is none). The opening must open the entry's commitment.
    pub fn push(&mut self, seq: u64, entry: &LogEntry, opening: Option<&PayloadOpening>) {
        self.entries += 1;
        let payload = match (&entry.payload, opening) {
            (None, None) => None,
            (None, Some(_)) => {
                self.differ(
                    "payloads",
                    seq.to_string(),
                    "an opening for an entry that commits to no payload",
                );
                None
            }
            (Some(_), None) => {
                match &entry.subject {
                    Some(room) if room.starts_with("room:") => {
                        self.erased.push((seq, room.clone()));
                    }
                    _ => self.differ(
                        "payloads",
                        seq.to_string(),
                        format!(
                            "missing: the entry ({}) commits to one",
                            entry.kind.as_str()
                        ),
                    ),
                }
                None
            }
            (Some(commitment), Some(opening)) => {
                if opening.commitment().as_ref() != Some(commitment) {
                    self.differ(
                        "payloads",
                        seq.to_string(),
                        format!(
                            "does not open the commitment of entry {} ({}): the stored payload was changed",
                            seq - 1,
                            entry.kind.as_str()
                        ),
                    );
                }
                Some(&opening.payload)
            }
        };
        if let Err(what) = self.apply(seq, entry, payload) {
            let subject = entry.subject.clone().unwrap_or_default();
            if subject.starts_with("req_") {
                self.broken.insert(subject);
            }
            self.differ(
                "events",
                seq.to_string(),
                format!("entry {} ({}): {what}", seq - 1, entry.kind.as_str()),
            );
        }
    }

    fn apply(&mut self, seq: u64, entry: &LogEntry, payload: Option<&Value>) -> Result<(), String> {
        let data = &entry.data;
        let empty = Map::new();
        let payload = payload.and_then(Value::as_object).unwrap_or(&empty);
        let subject = entry.subject.clone().unwrap_or_default();
        let actor = entry.actor.clone().unwrap_or_default();
        match entry.kind {
            EventKind::RequestCreated => {
                if self.requests.contains_key(&subject) {
                    return Err(format!("{subject} is created a second time"));
                }
                let action: Action = field(payload, "action")?;
                let digest = field(data, "action_digest")?;
                if action.digest() != digest {
                    self.differ(
                        "payloads",
                        seq.to_string(),
                        format!("the action of {subject} does not hash to its logged digest"),
                    );
                }
                let request = ApprovalRequest {
                    id: subject.clone(),
                    version: 1,
                    status: Status::Pending,
                    action,
                    action_digest: digest,
                    requested_by: field(data, "requested_by")?,
                    requested_at: entry.at,
                    expires_at: field(data, "expires_at")?,
                    valid_for_seconds: field(data, "valid_for_seconds")?,
                    recipient_email: field(payload, "recipient_email")?,
                    recipient_slack: field(payload, "recipient_slack")?,
                    idempotency_key: None,
                    requested_fields: field::<Option<Vec<String>>>(data, "requested_fields")?
                        .unwrap_or_default(),
                    room: field(data, "room")?,
                    decision: None,
                    proof: None,
                    closed_at: None,
                    action_record: None,
                    redemption: None,
                    outcome: None,
                    reviews: Vec::new(),
                    policy: field(data, "policy")?,
                    quorum: field(data, "quorum")?,
                    approvals: Vec::new(),
                };
                if entry.version() != Some(1) {
                    return Err("its version is not 1".into());
                }
                self.requests.insert(subject, request);
            }
            EventKind::RequestDecided
            | EventKind::RequestApprovalRecorded
            | EventKind::RequestTimedOut
            | EventKind::RequestCancelled
            | EventKind::ActionRecorded
            | EventKind::ProofRedeemed
            | EventKind::OutcomeRecorded
            | EventKind::ReviewRecorded => {
                if self.broken.contains(&subject) {
                    return Ok(());
                }
                let Some(request) = self.requests.get_mut(&subject) else {
                    return Err(format!("{subject} was never created"));
                };
                let version = entry.version().unwrap_or(0);
                if version != request.version + 1 {
                    return Err(format!(
                        "records version {version} of {subject}, which is at version {}",
                        request.version
                    ));
                }
                request.version = version;
                match entry.kind {
                    EventKind::RequestDecided => {
                        let decision = Decision {
                            decision: field(data, "decision")?,
                            authorization_type: field(data, "authorization_type")?,
                            approvers: field(data, "approvers")?,
                            comment: field(payload, "comment")?,
                            fields: field::<Option<BTreeMap<String, String>>>(payload, "fields")?
                                .unwrap_or_default(),
                            decided_at: entry.at,
                            valid_until: field(data, "valid_until")?,
                            nonce: field(data, "nonce")?,
                            policy: field(data, "policy")?,
                            grant: field(data, "grant")?,
                        };
                        request.status = decision.decision.status();
                        request.decision = Some(decision);
                    }
                    EventKind::RequestApprovalRecorded => {
                        crate::quorum::replay_approval(request, data, payload, entry.at)?;
                    }
                    EventKind::RequestTimedOut => {
                        request.status = Status::TimedOut;
                        request.closed_at = Some(entry.at);
                    }
                    EventKind::RequestCancelled => {
                        request.status = Status::Cancelled;
                        request.closed_at = Some(entry.at);
                    }
                    EventKind::ActionRecorded => {
                        request.action_record = Some(ActionRecord {
                            tool: field(data, "tool")?,
                            details: field::<Option<BTreeMap<String, String>>>(payload, "details")?
                                .unwrap_or_default(),
                            recorded_by: actor,
                            recorded_at: entry.at,
                        });
                    }
                    EventKind::ProofRedeemed => {
                        request.redemption = Some(Redemption {
                            redeemed_by: actor,
                            redeemed_at: entry.at,
                        });
                    }
                    EventKind::OutcomeRecorded => {
                        request.outcome = Some(OutcomeRecord {
                            status: field(data, "status")?,
                            summary: field(payload, "summary")?,
                            details: field::<Option<BTreeMap<String, String>>>(payload, "details")?
                                .unwrap_or_default(),
                            recorded_by: actor,
                            recorded_at: entry.at,
                        });
                    }
                    _ => {
                        request.reviews.push(ReviewRecord {
                            reviewer: field(data, "reviewer")?,
                            verdict: field(data, "verdict")?,
                            notes: field(payload, "notes")?,
                            recorded_by: actor,
                            recorded_at: entry.at,
                        });
                    }
                }
            }
            EventKind::TokenCreated => {
                let id: String = field(data, "token_id")?;
                let token = ImpliedToken {
                    name: data.get("name").cloned().unwrap_or(Value::Null),
                    role: data.get("role").cloned().unwrap_or(Value::Null),
                    created_at: entry.at,
                    expires_at: data.get("expires_at").cloned().unwrap_or(Value::Null),
                    scopes: data.get("scopes").cloned().unwrap_or(Value::Null),
                    revoked_at: None,
                };
                if self.tokens.insert(id.clone(), token).is_some() {
                    return Err(format!("token {id} is created a second time"));
                }
            }
            EventKind::TokenRevoked => {
                let id: String = field(data, "token_id")?;
                match self.tokens.get_mut(&id) {
                    Some(token) if token.revoked_at.is_none() => token.revoked_at = Some(entry.at),
                    Some(_) => return Err(format!("token {id} is revoked a second time")),
                    None => return Err(format!("token {id} was never created")),
                }
            }
            EventKind::UserCreated | EventKind::UserActivated | EventKind::UserDisabled => {
                let id: String = field(data, "user_id")?;
                let disabled = entry.kind == EventKind::UserDisabled;
                let user = ImpliedUser {
                    username: data.get("username").cloned().unwrap_or(Value::Null),
                    role: data.get("role").cloned().unwrap_or(Value::Null),
                    disabled,
                };
                if entry.kind != EventKind::UserCreated && !self.users.contains_key(&id) {
                    return Err(format!("account {id} was never created"));
                }
                self.users.insert(id, user);
            }
            EventKind::RoomCreated => {
                let name: String = field(data, "room")?;
                let room = Room {
                    name: name.clone(),
                    title: field(data, "title")?,
                    created_at: entry.at,
                    created_by: actor,
                    deleted_at: None,
                    purged_at: None,
                    allowed: Vec::new(),
                };
                self.rooms.insert(name, room);
            }
            EventKind::RoomRenamed
            | EventKind::RoomDeleted
            | EventKind::RoomRestored
            | EventKind::RoomRestricted
            | EventKind::RoomPurged => {
                let name: String = field(data, "room")?;
                let Some(room) = self.rooms.get_mut(&name) else {
                    return Err(format!("room {name} was never created"));
                };
                match entry.kind {
                    EventKind::RoomRenamed => room.title = field(data, "title")?,
                    EventKind::RoomDeleted => room.deleted_at = Some(entry.at),
                    EventKind::RoomRestored => room.deleted_at = None,
                    EventKind::RoomRestricted => room.allowed = field(data, "allowed")?,
                    _ => {
                        room.purged_at = Some(entry.at);
                        self.purged.insert(crate::rooms::subject(&name));
                    }
                }
            }
            EventKind::MemberJoined => {
                self.members
                    .insert((field(data, "room")?, field(data, "member")?));
            }
            EventKind::MemberLeft | EventKind::MemberKicked => {
                self.members
                    .remove(&(field(data, "room")?, field(data, "member")?));
            }
            EventKind::GrantCreated | EventKind::GrantUsed | EventKind::GrantRevoked => {
                crate::grant::replay(&mut self.grants, entry, payload)?;
            }
            // Recorded decisions, key rotations and endorsements, presence and messages
            // live in the log (and their payloads) only: their openings were checked
            // above. (Which keys are trusted is traced from the key files by
            // `anchor`, which log verify runs too.)
            EventKind::DecisionRecorded
            | EventKind::KeyRotated
            | EventKind::KeyEndorsed
            | EventKind::PresenceSet
            | EventKind::MessagePosted
            | EventKind::QuestionAnswered
            | EventKind::BlockerResolved
            | EventKind::AuditMismatch
            | EventKind::PolicySetLoaded => {}
        }
        Ok(())
    }

    /// A request row as stored (its decoded `body`). Each row once, in any order.
    pub fn request(&mut self, row: &ApprovalRequest) {
        self.rows += 1;
        let id = row.id.clone();
        if self.broken.remove(&id) {
            self.requests.remove(&id);
            return;
        }
        let Some(mut implied) = self.requests.remove(&id) else {
            self.differ(
                "requests",
                id,
                "the log has no request_created entry for it",
            );
            return;
        };
        // Not in the log: taken from the row; the proof is checked against the decision.
        implied.idempotency_key = row.idempotency_key.clone();
        implied.proof = row.proof.clone();
        match (&row.proof, &implied.decision) {
            (None, None) => {}
            (Some(_), None) => self.differ(
                "requests",
                &id,
                "it carries a proof, the log has no decision",
            ),
            (None, Some(_)) => self.differ(
                "requests",
                &id,
                "the log has a decision, the row carries no proof",
            ),
            (Some(proof), Some(decision)) => {
                let logged = Statement::for_decision(&implied, decision);
                // The bytes a proof signs are the statement's JSON: equal bytes are the
                // same statement; other bytes are compared as statements.
                let same_bytes = serde_json::to_vec(&logged).is_ok_and(|bytes| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.encode(bytes) == proof.payload
                });
                if !same_bytes && proof.unverified_statement().as_ref() != Some(&logged) {
                    self.differ(
                        "requests",
                        &id,
                        "its proof's statement is not the decision the log records",
                    );
                }
            }
        }
        // Most rows agree: compare the values, and render them only when they differ.
        if *row == implied {
            return;
        }
        let (Ok(row_json), Ok(log_json)) =
            (serde_json::to_value(row), serde_json::to_value(&implied))
        else {
            return;
        };
        for what in diff_objects(&row_json, &log_json) {
            self.differ("requests", &id, what);
        }
    }

    /// A request row whose body cannot be compared (it does not decode, or names
    /// another request): named as a difference, and not reported missing.
    pub fn unreadable_request(&mut self, id: &str, what: impl Into<String>) {
        self.rows += 1;
        self.requests.remove(id);
        self.broken.remove(id);
        self.differ("requests", id, what);
    }

    /// A token row as stored. Each row once.
    pub fn token(&mut self, row: &TokenRecord) {
        self.rows += 1;
        let Some(implied) = self.tokens.remove(&row.id) else {
            self.differ(
                "tokens",
                &row.id,
                "the log has no token_created entry for it",
            );
            return;
        };
        let checks: [(&str, Value, Value); 6] = [
            ("name", to_json(&row.name), implied.name),
            ("role", to_json(&row.role), implied.role),
            (
                "created_at",
                to_json(&row.created_at),
                to_json(&implied.created_at),
            ),
            ("expires_at", to_json(&row.expires_at), implied.expires_at),
            ("scopes", to_json(&row.scopes), implied.scopes),
            (
                "revoked_at",
                to_json(&row.revoked_at),
                to_json(&implied.revoked_at),
            ),
        ];
        for (name, row_value, log_value) in checks {
            if row_value != log_value {
                self.differ(
                    "tokens",
                    &row.id,
                    format!(
                        "{name} is {} in the row, the log says {}",
                        short(&row_value),
                        short(&log_value)
                    ),
                );
            }
        }
    }

    /// An account as stored (the `user` document's id and body). Each once.
    pub fn user(&mut self, id: &str, body: &Value) {
        self.rows += 1;
        let Some(implied) = self.users.remove(id) else {
            self.differ("users", id, "the log has no user_created entry for it");
            return;
        };
        let get = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
        let checks = [
            ("username", get("username"), implied.username),
            ("role", get("role"), implied.role),
            ("disabled", get("disabled"), Value::Bool(implied.disabled)),
        ];
        for (name, row_value, log_value) in checks {
            if row_value != log_value {
                self.differ(
                    "users",
                    id,
                    format!(
                        "{name} is {} in the row, the log says {}",
                        short(&row_value),
                        short(&log_value)
                    ),
                );
            }
        }
    }

    /// A standing grant as stored (its document's body). Each once.
    pub fn grant(&mut self, id: &str, body: &Value) {
        self.rows += 1;
        let Some(implied) = self.grants.remove(id) else {
            self.differ("grants", id, "the log has no grant_created entry for it");
            return;
        };
        let mut row = body.as_object().cloned().unwrap_or_default();
        row.remove("proof");
        for what in diff_objects(&Value::Object(row), &Value::Object(implied)) {
            self.differ("grants", id, what);
        }
    }

    /// A room as stored. Each once.
    pub fn room(&mut self, row: &Room) {
        self.rows += 1;
        let Some(implied) = self.rooms.remove(&row.name) else {
            self.differ(
                "rooms",
                &row.name,
                "the log has no room_created entry for it",
            );
            return;
        };
        if let (Ok(a), Ok(b)) = (serde_json::to_value(row), serde_json::to_value(&implied)) {
            for what in diff_objects(&a, &b) {
                self.differ("rooms", &row.name, what);
            }
        }
    }

    /// A room membership as stored: the room and the member's principal id. Each once.
    pub fn member(&mut self, room: &str, member: &str) {
        self.rows += 1;
        if !self.members.remove(&(room.to_string(), member.to_string())) {
            self.differ(
                "members",
                format!("{room}/{member}"),
                "the log has no member_joined entry for it (or says it left)",
            );
        }
    }

    /// How many entries and rows went through so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.entries, self.rows)
    }

    /// Everything found, including what the log implies but no row holds.
    pub fn finish(mut self) -> Vec<Difference> {
        let mut missing: Vec<Difference> = Vec::new();
        for id in self.requests.keys() {
            missing.push(Difference::new(
                "requests",
                id,
                "missing: the log records it",
            ));
        }
        for id in self.tokens.keys() {
            missing.push(Difference::new("tokens", id, "missing: the log records it"));
        }
        for id in self.users.keys() {
            missing.push(Difference::new("users", id, "missing: the log records it"));
        }
        for id in self.grants.keys() {
            missing.push(Difference::new("grants", id, "missing: the log records it"));
        }
        for name in self.rooms.keys() {
            missing.push(Difference::new(
                "rooms",
                name,
                "missing: the log records it",
            ));
        }
        for (room, member) in &self.members {
            missing.push(Difference::new(
                "members",
                format!("{room}/{member}"),
                "missing: the log says it joined",
            ));
        }
        for (seq, room) in &self.erased {
            if !self.purged.contains(room) {
                missing.push(Difference::new(
                    "payloads",
                    seq.to_string(),
                    format!("missing, but {room} was never purged"),
                ));
            }
        }
        missing.sort_by(|a, b| (a.table, &a.id).cmp(&(b.table, &b.id)));
        self.differences.extend(missing);
        self.differences
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, SealedEvent};
    use crate::testutil::*;
    use crate::{Role, Verdict};
    use serde_json::json;

    /// A request created, approved and acted on, as its rows and sealed entries.
    fn history() -> (ApprovalRequest, Vec<SealedEvent>) {
        let created = ApprovalRequest::create(
            "req_1".into(),
            new_request(),
            &agent(),
            t0(),
            &crate::Limits::default(),
        )
        .unwrap();
        let decided = decide(&created.request, Verdict::Approved, t0().plus_seconds(5));
        let acted = decided
            .request
            .record_action(
                "deploy".into(),
                BTreeMap::from([("host".to_string(), "a".to_string())]),
                &agent(),
                t0().plus_seconds(6),
                &crate::Limits::default(),
            )
            .unwrap();
        let events = [&created.event, &decided.event, &acted.event]
            .iter()
            .enumerate()
            .map(|(n, e)| e.seal([n as u8; 32]))
            .collect();
        (acted.request, events)
    }

    fn token() -> (TokenRecord, SealedEvent) {
        let record = TokenRecord {
            id: "tok_1".into(),
            name: "deploy-bot".into(),
            role: Role::Agent,
            hash: "ab".into(),
            created_at: t0(),
            revoked_at: None,
            expires_at: Some(t0().plus_seconds(3600)),
            scopes: None,
        };
        let event = Event::system(
            EventKind::TokenCreated,
            t0(),
            Some("local:root".into()),
            json!({"token_id": "tok_1", "name": "deploy-bot", "role": "agent",
                   "expires_at": record.expires_at, "scopes": null}),
        );
        (record, event.seal([9; 32]))
    }

    fn run(
        events: &[SealedEvent],
        request: &ApprovalRequest,
        tok: &TokenRecord,
    ) -> Vec<Difference> {
        let mut audit = Audit::new();
        for (n, e) in events.iter().enumerate() {
            audit.push(n as u64 + 1, &e.entry, e.payload.as_ref());
        }
        audit.request(request);
        audit.token(tok);
        audit.finish()
    }

    fn all() -> (ApprovalRequest, TokenRecord, Vec<SealedEvent>) {
        let (request, mut events) = history();
        let (tok, event) = token();
        events.push(event);
        (request, tok, events)
    }

    #[test]
    fn untouched_rows_agree_with_their_log() {
        let (request, tok, events) = all();
        assert_eq!(run(&events, &request, &tok), Vec::<Difference>::new());
    }

    #[test]
    fn a_rewritten_request_body_is_named_by_table_id_and_field() {
        let (mut request, tok, events) = all();
        request.action.description = "Transfer GBP 99,999 to Mallory".into();
        let found: Vec<String> = run(&events, &request, &tok)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "requests req_1: action.description is \"Transfer GBP 99,999 to Mallory\" in the row, the log says \"Transfer GBP 12,450 to Globex Corp\""
            ]
        );
        // A proof swapped for another one is not the logged decision's.
        let (mut request, tok, events) = all();
        let mut other = request.clone();
        other.action.description = "Something else".into();
        if let Some(decision) = &request.decision {
            request.proof = Some(crate::Envelope::sign_statement(
                &Statement::for_decision(&other, decision),
                &signer(),
            ));
        }
        let found = run(&events, &request, &tok);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("proof"), "{found:?}");

        let (mut request, tok, events) = all();
        request.status = Status::Rejected;
        let found = run(&events, &request, &tok);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .to_string()
                .starts_with("requests req_1: status is \"rejected\"")
        );
    }

    #[test]
    fn a_rewritten_payload_does_not_open_its_commitment() {
        let (request, tok, mut events) = all();
        if let Some(p) = events[1].payload.as_mut() {
            p.payload["comment"] = json!("forged");
        }
        let found = run(&events, &request, &tok);
        assert!(
            found.iter().any(|d| d.table == "payloads" && d.id == "2"),
            "{found:?}"
        );
        // The row still shows what was logged, so it now differs from the forged opening.
        assert!(found.iter().any(|d| d.table == "requests"), "{found:?}");
        // A missing opening is named too.
        let (request, tok, mut events) = all();
        events[0].payload = None;
        let found = run(&events, &request, &tok);
        assert!(
            found
                .iter()
                .any(|d| d.table == "payloads" && d.id == "1" && d.what.starts_with("missing")),
            "{found:?}"
        );
    }

    #[test]
    fn token_rows_are_held_to_their_creation_and_revocation() {
        let (request, mut tok, events) = all();
        tok.expires_at = None;
        tok.role = Role::Admin;
        let found = run(&events, &request, &tok);
        let what: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            what,
            [
                "tokens tok_1: role is \"admin\" in the row, the log says \"agent\"",
                "tokens tok_1: expires_at is null in the row, the log says \"2026-11-29T13:00:00.000Z\""
            ],
        );
        let (request, mut tok, events) = all();
        tok.revoked_at = Some(t0());
        let found = run(&events, &request, &tok);
        assert_eq!(found.len(), 1);
        assert!(found[0].what.starts_with("revoked_at"), "{found:?}");
    }

    #[test]
    fn rows_without_entries_and_entries_without_rows_are_named() {
        let (request, tok, events) = all();
        let mut audit = Audit::new();
        for (n, e) in events.iter().enumerate() {
            audit.push(n as u64 + 1, &e.entry, e.payload.as_ref());
        }
        let mut stranger = request.clone();
        stranger.id = "req_2".into();
        audit.request(&stranger);
        audit.user(
            "usr_1",
            &json!({"username": "eve", "role": "admin", "disabled": false}),
        );
        let found: Vec<String> = audit.finish().iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            [
                "requests req_2: the log has no request_created entry for it",
                "users usr_1: the log has no user_created entry for it",
                "requests req_1: missing: the log records it",
                "tokens tok_1: missing: the log records it",
            ]
        );
        let _ = tok;
    }

    #[test]
    fn a_gap_in_a_requests_versions_is_an_event_difference() {
        let (request, tok, mut events) = all();
        events.remove(1);
        let found = run(&events, &request, &tok);
        assert!(
            found
                .iter()
                .any(|d| d.table == "events" && d.what.contains("version 3")),
            "{found:?}"
        );
    }
}
