//! Standing grants: "allow this agent this tool, within these bounds, for this long or
//! this many uses", given by a person (while approving a request, or on its own).
//!
//! A grant is signed (a DSSE envelope of its statement, `countersign.grant/v1`) and
//! logged (`grant_created`, each use `grant_used`, `grant_revoked`). A request inside a
//! live grant is approved with `authorization_type: "grant"`, its proof naming the grant
//! and its maker. A grant is never wider than what its maker may approve alone: it does
//! not apply to a request that needs a quorum or approvers from a group, and nobody
//! grants to an agent of their own account.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::audit::field;
use crate::event::LogEntry;

use crate::Verdict;
use crate::decision::Decision;
use crate::error::CoreError;
use crate::event::{Event, EventKind};
use crate::keys::Signer;
use crate::principal::Approver;
use crate::proof::{AuthorizationType, Envelope};
use crate::request::{ApprovalRequest, Status, Transition};
use crate::time::Timestamp;

pub const GRANT_PAYLOAD_TYPE: &str = "application/vnd.countersign.grant+json";
pub const GRANT_STATEMENT_TYPE: &str = "countersign.grant/v1";
/// The longest a grant may last: 30 days.
pub const MAX_GRANT_SECONDS: u64 = 30 * 24 * 3600;
/// The most uses a grant may allow.
pub const MAX_GRANT_USES: u32 = 10_000;
/// The most bounds (exact details and ceilings together) a grant may carry.
const MAX_BOUNDS: usize = 32;
/// Ceilings compare numbers with this many decimal places; a value with more is not a
/// number a ceiling covers.
const SCALE_DIGITS: usize = 9;

/// The grant behind a decision: its id and who made it (as they authenticated then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRef {
    pub id: String,
    pub granted_by: Approver,
}

/// What a person asks for when granting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewGrant {
    /// The agent's principal id (`token:deploy-bot`).
    pub agent: String,
    /// The tool (the request's `tool` detail) the grant allows.
    pub tool: String,
    /// Details a covered request must have, with exactly these values.
    pub exact: BTreeMap<String, String>,
    /// Details a covered request must have as numbers at most these.
    pub max: BTreeMap<String, String>,
    /// How long it lasts from now.
    pub for_seconds: u64,
    /// How many requests it may approve; `None`: any number until it expires.
    pub max_uses: Option<u32>,
    /// The request it was given while approving, if any.
    pub from_request: Option<String>,
}

/// A grant as stored: what was granted, by whom, and how far it has been used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub agent: String,
    pub tool: String,
    #[serde(default)]
    pub exact: BTreeMap<String, String>,
    #[serde(default)]
    pub max: BTreeMap<String, String>,
    pub granted_by: Approver,
    pub granted_at: Timestamp,
    pub expires_at: Timestamp,
    pub max_uses: Option<u32>,
    pub from_request: Option<String>,
    /// Requests it has approved.
    #[serde(default)]
    pub uses: u32,
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
    /// The signed statement of what was granted (uses and revocation are in the log).
    pub proof: Envelope,
}

/// What a grant's signature covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantStatement {
    #[serde(rename = "type")]
    pub statement_type: String,
    pub id: String,
    pub agent: String,
    pub tool: String,
    pub exact: BTreeMap<String, String>,
    pub max: BTreeMap<String, String>,
    pub granted_by: Approver,
    pub granted_at: Timestamp,
    pub expires_at: Timestamp,
    pub max_uses: Option<u32>,
    pub from_request: Option<String>,
}

/// A decimal as an integer of `SCALE_DIGITS` places: `-?[0-9]+(\.[0-9]+)?` only.
pub fn scaled(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 20
        || !all_digits(whole)
        || !all_digits(frac)
        || frac.len() > SCALE_DIGITS
        || (digits.contains('.') && frac.is_empty())
    {
        return None;
    }
    let padded = format!("{whole}{frac:0<SCALE_DIGITS$}");
    let value: i128 = padded.parse().ok()?;
    Some(if negative { -value } else { value })
}

impl NewGrant {
    /// Whether `by` (its `account` set) may grant this to an agent of `agent_account`:
    /// refused when a bound does not read, the time or the uses are out of range, or the
    /// agent is `by`'s own. What [`NewGrant::make`] checks first, for a caller that must
    /// know before it decides anything.
    pub fn check(&self, by: &Approver, agent_account: &str) -> Result<(), CoreError> {
        let invalid = |field: &str, message: String| CoreError::invalid(field, message);
        if self.tool.trim().is_empty() {
            return Err(invalid(
                "grant.tool",
                "a grant names the tool it allows (the request's tool detail)".into(),
            ));
        }
        if by.account.as_deref() == Some(agent_account) || by.id == self.agent {
            return Err(CoreError::SelfApproval {
                request_id: self
                    .from_request
                    .clone()
                    .unwrap_or_else(|| "a grant".into()),
                principal: format!(
                    "{} (account {agent_account}) may not grant to its own agent {}",
                    by.id, self.agent
                ),
            });
        }
        if !(1..=MAX_GRANT_SECONDS).contains(&self.for_seconds) {
            return Err(invalid(
                "grant.for_seconds",
                format!(
                    "{} seconds: a grant lasts 1 second to {} days",
                    self.for_seconds,
                    MAX_GRANT_SECONDS / 86_400
                ),
            ));
        }
        if let Some(uses) = self.max_uses
            && !(1..=MAX_GRANT_USES).contains(&uses)
        {
            return Err(invalid(
                "grant.max_uses",
                format!("{uses}: a grant allows 1 to {MAX_GRANT_USES} uses"),
            ));
        }
        if self.exact.len() + self.max.len() > MAX_BOUNDS {
            return Err(invalid(
                "grant",
                format!("at most {MAX_BOUNDS} bounds (exact and max together)"),
            ));
        }
        for (key, ceiling) in &self.max {
            if scaled(ceiling).is_none() {
                return Err(invalid(
                    "grant.max",
                    format!(
                        "{key}: {ceiling:?} is not a number (digits, an optional sign and up to {SCALE_DIGITS} decimals)"
                    ),
                ));
            }
        }
        for key in self.exact.keys().chain(self.max.keys()) {
            if key.trim().is_empty() || key == "tool" {
                return Err(invalid(
                    "grant",
                    format!("{key:?} cannot be a bound (the tool is the grant's own)"),
                ));
            }
        }
        Ok(())
    }

    /// The grant `by` makes (its `account` set: the server mapped it), signed, and its
    /// `grant_created` event. Refused when a bound does not read, the time or the uses
    /// are out of range, or `agent_account` is `by`'s own account.
    pub fn make(
        self,
        id: String,
        by: Approver,
        agent_account: &str,
        now: Timestamp,
        signer: &Signer,
    ) -> Result<(Grant, Event), CoreError> {
        self.check(&by, agent_account)?;
        let statement = GrantStatement {
            statement_type: GRANT_STATEMENT_TYPE.into(),
            id,
            agent: self.agent,
            tool: self.tool,
            exact: self.exact,
            max: self.max,
            granted_by: by,
            granted_at: now,
            expires_at: now.plus_seconds(self.for_seconds),
            max_uses: self.max_uses,
            from_request: self.from_request,
        };
        let body = serde_json::to_vec(&statement).unwrap_or_default();
        let proof = Envelope::sign(GRANT_PAYLOAD_TYPE, &body, signer);
        let grant = Grant {
            id: statement.id,
            agent: statement.agent,
            tool: statement.tool,
            exact: statement.exact,
            max: statement.max,
            granted_by: statement.granted_by,
            granted_at: statement.granted_at,
            expires_at: statement.expires_at,
            max_uses: statement.max_uses,
            from_request: statement.from_request,
            uses: 0,
            revoked_at: None,
            revoked_by: None,
            proof,
        };
        let event = grant.event(
            EventKind::GrantCreated,
            now,
            grant.granted_by.id.clone(),
            json!({
                "agent": grant.agent,
                "tool": grant.tool,
                "granted_by": grant.granted_by,
                "expires_at": grant.expires_at,
                "max_uses": grant.max_uses,
                "from_request": grant.from_request,
            }),
            // The bounds are details' values: committed to, like a request's details.
            Some(json!({"exact": grant.exact, "max": grant.max})),
        );
        Ok((grant, event))
    }
}

impl Grant {
    fn event(
        &self,
        kind: EventKind,
        at: Timestamp,
        actor: String,
        data: serde_json::Value,
        payload: Option<serde_json::Value>,
    ) -> Event {
        let mut data = match data {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        data.insert("grant_id".into(), json!(self.id));
        Event {
            kind,
            at,
            actor: Some(actor),
            subject: Some(self.id.clone()),
            data,
            payload,
        }
    }

    /// `active`, `expired`, `used_up` or `revoked` at `now`.
    pub fn status(&self, now: Timestamp) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if now >= self.expires_at {
            "expired"
        } else if self.max_uses.is_some_and(|m| self.uses >= m) {
            "used_up"
        } else {
            "active"
        }
    }

    /// Why this grant does not cover `request` (made with `tool`) at `now`, if it does not.
    pub fn why_not(
        &self,
        request: &ApprovalRequest,
        tool: Option<&str>,
        now: Timestamp,
    ) -> Option<String> {
        let status = self.status(now);
        if status != "active" {
            return Some(format!("grant {} is {status}", self.id));
        }
        if request.requested_by.id != self.agent {
            return Some(format!("grant {} is for {}", self.id, self.agent));
        }
        if tool != Some(self.tool.as_str()) {
            return Some(format!("grant {} is for tool {}", self.id, self.tool));
        }
        if request.quorum.is_some() {
            return Some(format!(
                "request {} needs a quorum (or approvers from a group), which a grant cannot stand in for",
                request.id
            ));
        }
        if !request.requested_fields.is_empty() {
            return Some(format!(
                "request {} asks for reply fields, which only a person can give",
                request.id
            ));
        }
        let details = &request.action.details;
        for (key, value) in &self.exact {
            if details.get(key) != Some(value) {
                return Some(format!("{key} is not {value:?}"));
            }
        }
        for (key, ceiling) in &self.max {
            let within = details
                .get(key)
                .and_then(|v| scaled(v))
                .zip(scaled(ceiling))
                .is_some_and(|(value, max)| value <= max);
            if !within {
                return Some(format!("{key} is not a number at most {ceiling}"));
            }
        }
        None
    }

    /// The grant with one more use, and its `grant_used` event; refused when it no
    /// longer covers `request`.
    pub fn use_for(
        &self,
        request: &ApprovalRequest,
        tool: Option<&str>,
        now: Timestamp,
    ) -> Result<(Grant, Event), CoreError> {
        if let Some(why) = self.why_not(request, tool, now) {
            return Err(CoreError::Refused(why));
        }
        let mut used = self.clone();
        used.uses += 1;
        let event = used.event(
            EventKind::GrantUsed,
            now,
            request.requested_by.id.clone(),
            json!({"request_id": request.id, "uses": used.uses}),
            None,
        );
        Ok((used, event))
    }

    /// The grant revoked by `by` at `now`, and its `grant_revoked` event.
    pub fn revoke(&self, by: &str, now: Timestamp) -> Result<(Grant, Event), CoreError> {
        if let Some(at) = self.revoked_at {
            return Err(CoreError::Refused(format!(
                "grant {} was revoked at {at}{}",
                self.id,
                self.revoked_by
                    .as_deref()
                    .map(|b| format!(" by {b}"))
                    .unwrap_or_default()
            )));
        }
        let mut revoked = self.clone();
        revoked.revoked_at = Some(now);
        revoked.revoked_by = Some(by.to_string());
        let event = revoked.event(
            EventKind::GrantRevoked,
            now,
            by.to_string(),
            json!({}),
            None,
        );
        Ok((revoked, event))
    }

    pub fn reference(&self) -> GrantRef {
        GrantRef {
            id: self.id.clone(),
            granted_by: self.granted_by.clone(),
        }
    }
}

/// Replays a grant entry (`grant_created`, `grant_used`, `grant_revoked`) onto the
/// grants the log implies so far, each as its stored JSON without the proof (the audit,
/// which compares them with the rows). Refuses an entry the grant's history cannot have.
pub(crate) fn replay(
    grants: &mut HashMap<String, Map<String, Value>>,
    entry: &LogEntry,
    payload: &Map<String, Value>,
) -> Result<(), String> {
    let data = &entry.data;
    let id: String = field(data, "grant_id")?;
    let actor = entry.actor.clone().unwrap_or_default();
    if entry.kind == EventKind::GrantCreated {
        let mut grant = Map::new();
        for key in [
            "agent",
            "tool",
            "granted_by",
            "expires_at",
            "max_uses",
            "from_request",
        ] {
            grant.insert(key.into(), data.get(key).cloned().unwrap_or(Value::Null));
        }
        grant.insert("id".into(), json!(id));
        grant.insert("granted_at".into(), json!(entry.at));
        for key in ["exact", "max"] {
            let bounds = payload
                .get(key)
                .cloned()
                .unwrap_or(Value::Object(Map::new()));
            grant.insert(key.into(), bounds);
        }
        grant.insert("uses".into(), json!(0));
        grant.insert("revoked_at".into(), Value::Null);
        grant.insert("revoked_by".into(), Value::Null);
        if grants.insert(id.clone(), grant).is_some() {
            return Err(format!("grant {id} is created a second time"));
        }
        return Ok(());
    }
    let Some(grant) = grants.get_mut(&id) else {
        return Err(format!("grant {id} was never created"));
    };
    if grant.get("revoked_at").is_some_and(|v| !v.is_null()) {
        return Err(format!(
            "grant {id} is {} after it was revoked",
            entry.kind.as_str()
        ));
    }
    if entry.kind == EventKind::GrantRevoked {
        grant.insert("revoked_at".into(), json!(entry.at));
        grant.insert("revoked_by".into(), json!(actor));
        return Ok(());
    }
    let uses = grant.get("uses").and_then(Value::as_u64).unwrap_or(0) + 1;
    let said: u64 = field(data, "uses")?;
    if said != uses {
        return Err(format!(
            "it says use {said} of grant {id}, the log has {uses}"
        ));
    }
    if let Some(max) = grant.get("max_uses").and_then(Value::as_u64)
        && uses > max
    {
        return Err(format!("grant {id} is used more than its {max} uses"));
    }
    grant.insert("uses".into(), json!(uses));
    Ok(())
}

impl ApprovalRequest {
    /// The approval `grant` gives this new request, signed: `authorization_type:
    /// "grant"`, no approver of its own, the grant and its maker named.
    pub fn decide_by_grant(
        &self,
        grant: &Grant,
        tool: Option<&str>,
        now: Timestamp,
        nonce: String,
        signer: &Signer,
    ) -> Result<Transition, CoreError> {
        if self.status != Status::Pending {
            return Err(self
                .closed_error(now)
                .unwrap_or_else(|| CoreError::invalid("status", "request is not pending")));
        }
        if let Some(why) = grant.why_not(self, tool, now) {
            return Err(CoreError::Refused(why));
        }
        let decision = Decision {
            grant: Some(grant.reference()),
            ..self.by_no_person(Verdict::Approved, AuthorizationType::Grant, now, nonce)
        };
        Ok(self.signed(decision, signer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Jwks;
    use crate::principal::{Channel, Principal, Role};
    use crate::proof::{Statement, VerifyOptions, verify};
    use crate::request::Limits;
    use crate::testutil::*;

    fn maker() -> Approver {
        Approver {
            account: Some("user:alice".into()),
            ..Principal::user("alice", "Alice", Role::Approver).as_approver(Channel::Dashboard)
        }
    }

    fn new_grant() -> NewGrant {
        NewGrant {
            agent: agent().id,
            tool: "refund".into(),
            exact: BTreeMap::from([("currency".into(), "EUR".into())]),
            max: BTreeMap::from([("amount".into(), "100".into())]),
            for_seconds: 3600,
            max_uses: Some(2),
            from_request: None,
        }
    }

    fn request(details: &[(&str, &str)]) -> ApprovalRequest {
        let mut new = new_request();
        new.details = details
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ApprovalRequest::create("req_g".into(), new, &agent(), t0(), &Limits::default())
            .unwrap()
            .request
    }

    #[test]
    fn decimals_scale_and_refuse_what_is_not_one() {
        assert_eq!(scaled("12.50"), Some(12_500_000_000));
        assert_eq!(scaled("-1"), Some(-1_000_000_000));
        assert!(scaled("12.50").unwrap() < scaled("100").unwrap());
        for bad in ["", "1e3", "12.", ".5", "1.0000000001", "ten", "+1", "1,000"] {
            assert_eq!(scaled(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_grant_covers_its_agent_tool_and_bounds_until_used_up_expired_or_revoked() {
        let (grant, event) = new_grant()
            .make("grt_1".into(), maker(), "user:dave", t0(), &signer())
            .unwrap();
        assert_eq!(event.kind, EventKind::GrantCreated);
        assert_eq!(event.data["grant_id"], "grt_1");
        assert_eq!(grant.status(t0()), "active");
        // Its statement is signed by the server's key.
        assert_eq!(grant.proof.payload_type, GRANT_PAYLOAD_TYPE);

        let inside = request(&[("tool", "refund"), ("currency", "EUR"), ("amount", "99.99")]);
        let now = t0().plus_seconds(10);
        assert_eq!(grant.why_not(&inside, Some("refund"), now), None);
        for (details, says) in [
            (
                vec![("tool", "refund"), ("currency", "USD"), ("amount", "5")],
                "currency",
            ),
            (
                vec![
                    ("tool", "refund"),
                    ("currency", "EUR"),
                    ("amount", "100.01"),
                ],
                "amount",
            ),
            (
                vec![("tool", "refund"), ("currency", "EUR"), ("amount", "lots")],
                "amount",
            ),
            (vec![("tool", "refund"), ("currency", "EUR")], "amount"),
        ] {
            let r = request(&details);
            let why = grant.why_not(&r, Some("refund"), now).unwrap_or_default();
            assert!(why.contains(says), "{details:?}: {why}");
        }
        assert!(grant.why_not(&inside, Some("delete"), now).is_some());
        let mut other = inside.clone();
        other.requested_by = Principal::from_token("other-bot", Role::Agent).as_requester();
        assert!(grant.why_not(&other, Some("refund"), now).is_some());
        let mut needs_two = inside.clone();
        needs_two.quorum = Some(crate::Quorum::new(2, None).unwrap());
        assert!(
            grant
                .why_not(&needs_two, Some("refund"), now)
                .unwrap_or_default()
                .contains("quorum")
        );

        // Approved by the grant: signed, naming the grant and its maker.
        let t = inside
            .decide_by_grant(
                &grant,
                Some("refund"),
                now,
                "nonce-0123456789abcdef".into(),
                &signer(),
            )
            .unwrap();
        assert_eq!(t.request.status, Status::Approved);
        let proof = t.request.proof.clone().unwrap();
        let jwks = Jwks {
            keys: vec![signer().jwk()],
        };
        let report = verify(&proof, &jwks, &VerifyOptions::default());
        assert!(report.valid, "{:?}", report.reasons);
        let statement: Statement = report.statement.unwrap();
        assert_eq!(statement.authorization_type, AuthorizationType::Grant);
        assert_eq!(
            statement.grant.as_ref().map(|g| g.id.as_str()),
            Some("grt_1")
        );
        assert_eq!(
            statement.grant.as_ref().map(|g| g.granted_by.id.as_str()),
            Some("user:alice")
        );
        assert!(statement.approvers.is_empty());
        assert_eq!(t.event.data["grant"]["id"], "grt_1");

        // Two uses, then used up.
        let (once, used) = grant.use_for(&inside, Some("refund"), now).unwrap();
        assert_eq!(used.kind, EventKind::GrantUsed);
        let (twice, _) = once.use_for(&inside, Some("refund"), now).unwrap();
        assert_eq!(twice.status(now), "used_up");
        assert!(twice.use_for(&inside, Some("refund"), now).is_err());
        // Expired.
        assert_eq!(grant.status(t0().plus_seconds(3600)), "expired");
        // Revoked, once.
        let (revoked, event) = grant.revoke("user:alice", now).unwrap();
        assert_eq!(event.kind, EventKind::GrantRevoked);
        assert_eq!(revoked.status(now), "revoked");
        assert!(revoked.why_not(&inside, Some("refund"), now).is_some());
        assert!(revoked.revoke("user:alice", now).is_err());
    }

    #[test]
    fn a_grant_is_refused_to_its_makers_own_agent_and_out_of_bounds() {
        let err = new_grant()
            .make("grt_2".into(), maker(), "user:alice", t0(), &signer())
            .err();
        assert!(
            matches!(err, Some(CoreError::SelfApproval { .. })),
            "{err:?}"
        );
        for (change, says) in [
            (
                NewGrant {
                    for_seconds: 0,
                    ..new_grant()
                },
                "for_seconds",
            ),
            (
                NewGrant {
                    for_seconds: MAX_GRANT_SECONDS + 1,
                    ..new_grant()
                },
                "for_seconds",
            ),
            (
                NewGrant {
                    max_uses: Some(0),
                    ..new_grant()
                },
                "max_uses",
            ),
            (
                NewGrant {
                    max: BTreeMap::from([("amount".into(), "a lot".into())]),
                    ..new_grant()
                },
                "not a number",
            ),
            (
                NewGrant {
                    tool: " ".into(),
                    ..new_grant()
                },
                "tool",
            ),
        ] {
            let err = change
                .make("grt_3".into(), maker(), "user:dave", t0(), &signer())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    fn audited(events: &[&Event], row: &Grant) -> Vec<String> {
        let mut audit = crate::audit::Audit::new();
        for (n, e) in events.iter().enumerate() {
            let sealed = e.seal([n as u8 + 1; 32]);
            audit.push(n as u64 + 1, &sealed.entry, sealed.payload.as_ref());
        }
        audit.grant(&row.id, &serde_json::to_value(row).unwrap());
        audit.finish().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_audit_holds_a_grant_row_to_its_log() {
        let (grant, created) = new_grant()
            .make("grt_a".into(), maker(), "user:dave", t0(), &signer())
            .unwrap();
        let inside = request(&[("tool", "refund"), ("currency", "EUR"), ("amount", "1")]);
        let now = t0().plus_seconds(5);
        let (used, use_event) = grant.use_for(&inside, Some("refund"), now).unwrap();
        let (revoked, revoke_event) = used.revoke("user:alice", now).unwrap();
        let events = [&created, &use_event, &revoke_event];
        assert_eq!(audited(&events, &revoked), Vec::<String>::new());

        // A row with a use the log does not have, or a wider bound, is named.
        let mut more = revoked.clone();
        more.uses = 0;
        let found = audited(&events, &more);
        assert!(
            found
                .iter()
                .any(|d| d.contains("grants grt_a") && d.contains("uses")),
            "{found:?}"
        );
        let mut wider = revoked.clone();
        wider.max.insert("amount".into(), "1000000".into());
        let found = audited(&events, &wider);
        assert!(found.iter().any(|d| d.contains("max.amount")), "{found:?}");
        // A use after the revocation, and a row the log never created.
        let late = used.use_for(&inside, Some("refund"), now).unwrap().1;
        let found = audited(&[&created, &use_event, &revoke_event, &late], &revoked);
        assert!(
            found.iter().any(|d| d.contains("after it was revoked")),
            "{found:?}"
        );
        let found = audited(&[], &revoked);
        assert!(
            found.iter().any(|d| d.contains("no grant_created entry")),
            "{found:?}"
        );
    }
}
