//! Quorum and separation of duties: a request that needs *n* approvals from distinct
//! accounts, optionally all members of one group.
//!
//! ```text
//! pending (k of n) ──approve, k + 1 < n──▶ pending (k + 1 of n)   request_approval_recorded
//!        │         ──approve, k + 1 = n──▶ approved               request_decided (all n named)
//!        └───────────reject─────────────▶ rejected               request_decided (the rejecter)
//! ```
//!
//! Quorum counts accounts, never identities: one person may hold a token, a dashboard
//! account, a Slack user and an email address, and the server maps each to one account
//! before it asks core ([`DecisionAccounts`]). The requester never counts; an account
//! counts once; a request may require its deciders to come from a group, which the server
//! resolves (core learns only whether the decider is in it). Every step is one
//! transition of the request's version, so the store's compare-and-swap keeps exactly
//! one of two deciders racing from the same state ([`Transition::applies_to`]).
//!
//! A request without a quorum (one approver, from anyone) carries none of this: its
//! request, events and statement are what they were before quorum existed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::audit::field;
use crate::decision::Verdict;
use crate::error::{CoreError, NotCounted};
use crate::event::{Event, EventKind};
use crate::groups::{Groups, Identities};
use crate::keys::Signer;
use crate::principal::{Approver, Principal};
use crate::request::{ApprovalRequest, Limits, Status, Transition};
use crate::time::Timestamp;

/// The most approvals a request may need: a bound, so that no request can be made that
/// nobody could ever approve in practice.
pub const MAX_APPROVALS: u32 = 10;

/// How many distinct accounts must approve a request, and from which group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quorum {
    /// Distinct accounts that must approve (1 to [`MAX_APPROVALS`]).
    pub required: u32,
    /// The group (`[groups]`) every decider must belong to; `None`: anyone who may decide.
    pub group: Option<String>,
}

impl Quorum {
    /// A checked quorum: `required` in 1..=[`MAX_APPROVALS`], `group` a group name.
    pub fn new(required: u32, group: Option<&str>) -> Result<Self, CoreError> {
        if !(1..=MAX_APPROVALS).contains(&required) {
            return Err(CoreError::invalid(
                "quorum.required",
                format!("{required} approvals: a request needs 1 to {MAX_APPROVALS}"),
            ));
        }
        let group = group.map(str::trim).map(str::to_string);
        if let Some(name) = &group {
            crate::groups::check_group_name(name).map_err(|e| match e {
                CoreError::Invalid { message, .. } => CoreError::invalid("quorum.group", message),
                other => other,
            })?;
        }
        Ok(Self { required, group })
    }

    /// One approver from anyone: what a request without a quorum needs.
    pub fn is_plain(&self) -> bool {
        self.required == 1 && self.group.is_none()
    }

    /// The stricter of two quorums: the larger count, from the group either names. Two
    /// different groups are refused: "members of both" is not a rule this version has.
    pub fn strictest(self, other: &Self) -> Result<Self, CoreError> {
        let group = match (self.group, &other.group) {
            (Some(a), Some(b)) if a != *b => {
                return Err(CoreError::invalid(
                    "quorum.group",
                    format!(
                        "the request would need its approvers from both {a:?} and {b:?}; one group only"
                    ),
                ));
            }
            (a, b) => a.or_else(|| b.clone()),
        };
        Ok(Self {
            required: self.required.max(other.required),
            group,
        })
    }
}

/// The accounts behind a decision, the decider's and the requester's: what quorum
/// counts. The server maps the authenticated identities (a token, a dashboard session,
/// a Slack user, an email, an OS user) to accounts; an identity that maps to none is its
/// own account (its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionAccounts {
    /// The decider's account.
    pub decider: String,
    /// The requester's account: a decider of the same account is the requester.
    pub requester: String,
    /// Whether the decider's account is in the group the request's quorum names
    /// ([`Quorum::group`]); not read when it names none.
    pub eligible: bool,
}

impl DecisionAccounts {
    /// Identities taken as their own accounts, the decider in no group: what a caller
    /// that maps nothing gets, and fails closed on a request that requires a group.
    pub fn unmapped(request: &ApprovalRequest, by: &Principal) -> Self {
        Self {
            decider: by.id.clone(),
            requester: request.requested_by.id.clone(),
            eligible: false,
        }
    }

    /// The accounts `identities` maps the decider and the requester to; the decider is
    /// eligible when its account (or, for an identity mapped to none, itself) is in the
    /// group the request's quorum names.
    pub fn mapped(
        request: &ApprovalRequest,
        by: &Principal,
        identities: &Identities,
        groups: &Groups,
    ) -> Self {
        let decider = identities.account_of(&by.id).to_string();
        let eligible = request
            .quorum
            .as_ref()
            .and_then(|q| q.group.as_deref())
            .is_some_and(|group| groups.contains(group, &decider));
        Self {
            requester: identities.account_of(&request.requested_by.id).to_string(),
            decider,
            eligible,
        }
    }
}

/// An approval recorded while the request waited for more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedApproval {
    /// Who approved, how they authenticated, and the account they counted as.
    pub approver: Approver,
    pub approved_at: Timestamp,
    pub comment: Option<String>,
    /// The reply fields this approval gave; the final decision carries all of them.
    pub fields: BTreeMap<String, String>,
}

/// A person's decision on a request with a quorum, checked for everything but the quorum.
pub(crate) struct Vote {
    pub verdict: Verdict,
    pub comment: Option<String>,
    pub fields: BTreeMap<String, String>,
    /// With its account set.
    pub approver: Approver,
    pub eligible: bool,
    pub at: Timestamp,
}

impl Transition {
    /// Requires `quorum` of the request this creation makes (a policy's `@approvals` and
    /// `@approvers`, or a request option an admin allows), with the creation event
    /// rebuilt to say so. With a quorum already required, the stricter applies; a plain
    /// quorum (one approver, anyone) changes nothing.
    pub fn require_quorum(&mut self, quorum: Quorum) -> Result<(), CoreError> {
        let request = &mut self.request;
        if self.event.kind != EventKind::RequestCreated || request.version != 1 {
            return Err(CoreError::Refused(format!(
                "a quorum is required when request {} is made, not later",
                request.id
            )));
        }
        let combined = match request.quorum.take() {
            Some(current) => current.strictest(&quorum)?,
            None => quorum,
        };
        request.quorum = (!combined.is_plain()).then_some(combined);
        self.event = Event::created(request);
        Ok(())
    }
}

impl ApprovalRequest {
    /// Why `by` (as `accounts`) cannot decide this pending request now, if it cannot:
    /// its account asked for it, the quorum needs a group the account is not in, or the
    /// account has approved it already (it may still reject). What a dashboard shows
    /// before anyone clicks; the decision itself checks again.
    pub fn why_not_decider(&self, by: &Principal, accounts: &DecisionAccounts) -> Option<String> {
        if by.id == self.requested_by.id || accounts.decider == accounts.requester {
            return Some(if by.id == self.requested_by.id {
                "You asked for this request, so another approver must decide it.".to_string()
            } else {
                format!(
                    "Your account ({}) asked for this request, so another approver must decide it.",
                    accounts.decider
                )
            });
        }
        let quorum = self.quorum.as_ref()?;
        if let Some(group) = &quorum.group
            && !accounts.eligible
        {
            return Some(format!(
                "This request needs its approvers from group {group}, which your account ({}) is not in.",
                accounts.decider
            ));
        }
        let earlier = self
            .approvals
            .iter()
            .find(|a| a.approver.account.as_deref() == Some(accounts.decider.as_str()))?;
        Some(format!(
            "Your account approved this at {} ({} of {} approvals); another approver must give the next one.",
            earlier.approved_at,
            self.approvals.len(),
            quorum.required
        ))
    }

    /// How far the request is toward its quorum: (approvals so far, approvals needed).
    pub fn quorum_progress(&self) -> Option<(u32, u32)> {
        let quorum = self.quorum.as_ref()?;
        let so_far = u32::try_from(self.approvals.len()).unwrap_or(u32::MAX);
        Some((so_far, quorum.required))
    }

    /// A decision on a request with `quorum`: an approval short of it is recorded, the
    /// last approval and any rejection are final and signed.
    pub(crate) fn vote(
        &self,
        quorum: &Quorum,
        vote: Vote,
        nonce: String,
        signer: &Signer,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        let account = vote.approver.account.clone().unwrap_or_default();
        if let Some(group) = &quorum.group
            && !vote.eligible
        {
            return Err(CoreError::NotCounted(NotCounted::NotEligible {
                request_id: self.id.clone(),
                account,
                group: group.clone(),
            }));
        }
        if vote.verdict == Verdict::Rejected {
            // Any rejection rejects; the approvals so far stay on the request.
            let decision = self.by_people(
                Verdict::Rejected,
                vec![vote.approver],
                vote.comment,
                vote.fields,
                vote.at,
                nonce,
            );
            return Ok(self.signed(decision, signer));
        }
        if let Some(earlier) = self
            .approvals
            .iter()
            .find(|a| a.approver.account.as_deref() == Some(account.as_str()))
        {
            return Err(CoreError::NotCounted(NotCounted::AlreadyApproved {
                request_id: self.id.clone(),
                account,
                approved_by: format!(
                    "{} via {}",
                    earlier.approver.display_name,
                    earlier.approver.channel.as_str()
                ),
                approved_at: earlier.approved_at,
            }));
        }
        let fields = self.merged_fields(&vote.fields, limits)?;
        if self.approvals.len() + 1 < quorum.required as usize {
            return Ok(self.record(vote, quorum));
        }
        self.check_fields(&fields)?;
        let mut approvers: Vec<Approver> =
            self.approvals.iter().map(|a| a.approver.clone()).collect();
        approvers.push(vote.approver);
        let decision = self.by_people(
            Verdict::Approved,
            approvers,
            vote.comment,
            fields,
            vote.at,
            nonce,
        );
        Ok(self.signed(decision, signer))
    }

    /// The reply fields of every approval so far and of `fields`: an approval may add a
    /// field, never change one an earlier approver gave.
    fn merged_fields(
        &self,
        fields: &BTreeMap<String, String>,
        limits: &Limits,
    ) -> Result<BTreeMap<String, String>, CoreError> {
        let mut merged = BTreeMap::new();
        for approval in &self.approvals {
            merged.extend(approval.fields.clone());
        }
        for (key, value) in fields {
            if let Some(earlier) = merged.get(key)
                && earlier != value
            {
                let by = self
                    .approvals
                    .iter()
                    .find(|a| a.fields.get(key) == Some(earlier))
                    .map_or("an earlier approver", |a| a.approver.display_name.as_str());
                return Err(CoreError::invalid(
                    "fields",
                    format!(
                        "{key} is {earlier:?} as {by} gave it; an approval may add reply fields, not change them"
                    ),
                ));
            }
            merged.insert(key.clone(), value.clone());
        }
        crate::request::validate_map("fields", &merged, limits.max_fields, limits)?;
        Ok(merged)
    }

    /// The request, still pending, with one more approval on record.
    fn record(&self, vote: Vote, quorum: &Quorum) -> Transition {
        let approval = RecordedApproval {
            approver: vote.approver,
            approved_at: vote.at,
            comment: vote.comment,
            fields: vote.fields,
        };
        let mut request = self.clone();
        request.version += 1;
        request.approvals.push(approval.clone());
        let approvers: Vec<&Approver> = request.approvals.iter().map(|a| &a.approver).collect();
        let event = Event::about(
            EventKind::RequestApprovalRecorded,
            &request,
            approval.approved_at,
            Some(approval.approver.id.clone()),
            json!({
                "action_digest": request.action_digest,
                "approvals": approvers,
                "required": quorum.required,
            }),
            Some(json!({"comment": approval.comment, "fields": approval.fields})),
        );
        Transition { request, event }
    }
}

/// Replays a `request_approval_recorded` entry onto the request the log implies (the
/// audit, which has already checked and bumped the version): the entry must add exactly
/// one approval, by an account not yet counted, short of the quorum.
pub(crate) fn replay_approval(
    request: &mut ApprovalRequest,
    data: &Map<String, Value>,
    payload: &Map<String, Value>,
    at: Timestamp,
) -> Result<(), String> {
    let Some(quorum) = &request.quorum else {
        return Err(format!("{} needs no quorum", request.id));
    };
    if request.status != Status::Pending {
        return Err(format!("{} is {}, not pending", request.id, request.status));
    }
    let required: u32 = field(data, "required")?;
    if required != quorum.required {
        return Err(format!(
            "it says {} approvals are required, the request needs {}",
            required, quorum.required
        ));
    }
    let mut approvers: Vec<Approver> = field(data, "approvals")?;
    let Some(latest) = approvers.pop() else {
        return Err("it lists no approval".into());
    };
    let earlier: Vec<&Approver> = request.approvals.iter().map(|a| &a.approver).collect();
    if approvers.iter().collect::<Vec<_>>() != earlier {
        return Err("its earlier approvals are not the ones the log recorded".into());
    }
    let Some(account) = &latest.account else {
        return Err("its approval names no account".into());
    };
    if earlier.iter().any(|a| a.account.as_ref() == Some(account)) {
        return Err(format!("account {account} is counted twice"));
    }
    if request.approvals.len() + 1 >= quorum.required as usize {
        return Err("it reaches the quorum, which only a request_decided entry may".into());
    }
    request.approvals.push(RecordedApproval {
        approver: latest,
        approved_at: at,
        comment: field(payload, "comment")?,
        fields: field::<Option<BTreeMap<String, String>>>(payload, "fields")?.unwrap_or_default(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Audit;
    use crate::event::SealedEvent;
    use crate::principal::{Channel, Role};
    use crate::proof::{Statement, VerifyOptions, verify};
    use crate::testutil::*;
    use crate::{DecisionInput, Jwks};

    fn alice() -> Principal {
        Principal::from_token("alice", Role::Approver)
    }
    fn bob() -> Principal {
        Principal::user("bob", "Bob", Role::Approver)
    }
    fn carol() -> Principal {
        Principal::user("carol", "Carol", Role::Approver)
    }

    /// A request made with `quorum` required, as its creation.
    fn made(required: u32, group: Option<&str>) -> Transition {
        let mut t = ApprovalRequest::create(
            "req_q".into(),
            new_request(),
            &agent(),
            t0(),
            &Limits::default(),
        )
        .unwrap();
        t.require_quorum(Quorum::new(required, group).unwrap())
            .unwrap();
        t
    }

    fn needing(required: u32, group: Option<&str>) -> ApprovalRequest {
        made(required, group).request
    }

    /// `by` decides `request` as `account` (eligible for any group), `secs` after t0.
    fn vote_as(
        request: &ApprovalRequest,
        verdict: Verdict,
        by: &Principal,
        account: &str,
        eligible: bool,
        fields: &[(&str, &str)],
        secs: u64,
    ) -> Result<Transition, CoreError> {
        let accounts = DecisionAccounts {
            decider: account.into(),
            requester: "bot-owner".into(),
            eligible,
        };
        request.decide_as(
            verdict,
            DecisionInput {
                comment: Some(format!("{} by {account}", verdict.as_str())),
                fields: fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            by,
            &accounts,
            Channel::Dashboard,
            t0().plus_seconds(secs),
            format!("nonce-of-{account}-0123456789"),
            &signer(),
            &Limits::default(),
        )
    }

    fn approve(request: &ApprovalRequest, by: &Principal, account: &str, secs: u64) -> Transition {
        vote_as(request, Verdict::Approved, by, account, true, &[], secs).unwrap()
    }

    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    #[test]
    fn approvals_short_of_the_quorum_are_recorded_and_the_last_one_decides() {
        let request = needing(3, None);
        let first = approve(&request, &alice(), "alice", 1);
        assert_eq!(first.request.status, Status::Pending);
        assert_eq!(first.request.version, 2);
        assert!(first.request.decision.is_none() && first.request.proof.is_none());
        assert_eq!(first.request.quorum_progress(), Some((1, 3)));
        assert_eq!(first.event.kind(), "request_approval_recorded");
        assert_eq!(first.event.actor.as_deref(), Some("token:alice"));
        assert_eq!(first.event.data["required"], json!(3));
        assert_eq!(first.event.data["version"], json!(2));
        assert_eq!(
            first.event.data["approvals"],
            json!([{"id": "token:alice", "display_name": "alice", "channel": "dashboard",
                    "auth_method": "bearer_token", "account": "alice"}])
        );
        assert_eq!(
            first.event.payload,
            Some(json!({"comment": "approved by alice", "fields": {}}))
        );

        let second = approve(&first.request, &bob(), "bob", 2);
        assert_eq!(second.event.kind(), "request_approval_recorded");
        assert_eq!(second.request.quorum_progress(), Some((2, 3)));
        let listed: Vec<&str> = second.event.data["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["account"].as_str().unwrap())
            .collect();
        assert_eq!(listed, ["alice", "bob"]);

        let last = approve(&second.request, &carol(), "carol", 3);
        assert_eq!(last.request.status, Status::Approved);
        assert_eq!(last.request.version, 4);
        assert_eq!(last.event.kind(), "request_decided");
        assert_eq!(
            last.event.actor.as_deref(),
            Some("user:carol"),
            "who made it final"
        );
        let decision = last.request.decision.as_ref().unwrap();
        let named: Vec<(&str, Channel, Option<&str>)> = decision
            .approvers
            .iter()
            .map(|a| (a.id.as_str(), a.channel, a.account.as_deref()))
            .collect();
        assert_eq!(
            named,
            [
                ("token:alice", Channel::Dashboard, Some("alice")),
                ("user:bob", Channel::Dashboard, Some("bob")),
                ("user:carol", Channel::Dashboard, Some("carol")),
            ]
        );
        assert_eq!(decision.comment.as_deref(), Some("approved by carol"));
        assert_eq!(decision.decided_at, t0().plus_seconds(3));
        // The approvals before the last stay on record, each with its time.
        let at: Vec<Timestamp> = last
            .request
            .approvals
            .iter()
            .map(|a| a.approved_at)
            .collect();
        assert_eq!(at, [t0().plus_seconds(1), t0().plus_seconds(2)]);

        // The signed statement names all three and the quorum, and verifies.
        let proof = last.request.proof.as_ref().unwrap();
        let report = verify(
            proof,
            &Jwks {
                keys: vec![signer().jwk()],
            },
            &VerifyOptions::default(),
        );
        assert!(report.valid, "{:?}", report.reasons);
        let statement = report.statement.unwrap();
        assert_eq!(statement.approvers, decision.approvers);
        assert_eq!(
            statement.quorum,
            Some(Quorum {
                required: 3,
                group: None
            })
        );
        let body: Value = serde_json::from_slice(
            &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &proof.payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(body["quorum"], json!({"required": 3, "group": null}));
        assert_eq!(body["approvers"][2]["account"], json!("carol"));
    }

    #[test]
    fn a_request_without_a_quorum_is_decided_exactly_as_before() {
        let plain = pending();
        // A plain quorum required at creation changes neither the request nor its event.
        let created = ApprovalRequest::create(
            "req_1".into(),
            new_request(),
            &agent(),
            t0(),
            &Limits::default(),
        )
        .unwrap();
        let mut same = created.clone();
        same.require_quorum(Quorum::new(1, None).unwrap()).unwrap();
        assert_eq!(same, created);

        let before = decide(&plain, Verdict::Approved, t0().plus_seconds(5));
        // The accounts a server maps do not show in a plain request's decision.
        let mapped = plain
            .decide_as(
                Verdict::Approved,
                DecisionInput {
                    comment: Some("ok".into()),
                    fields: BTreeMap::from([("po_number".to_string(), "PO-7".to_string())]),
                },
                &approver(),
                &DecisionAccounts {
                    decider: "alice-account".into(),
                    requester: "ops-account".into(),
                    eligible: true,
                },
                Channel::Api,
                t0().plus_seconds(5),
                "bm9uY2U".into(),
                &signer(),
                &Limits::default(),
            )
            .unwrap();
        assert_eq!(mapped, before);

        let row = serde_json::to_value(&before.request).unwrap();
        assert!(
            row.get("quorum").is_none() && row.get("approvals").is_none(),
            "{row}"
        );
        assert_eq!(
            keys(&row["decision"]["approvers"][0]),
            ["auth_method", "channel", "display_name", "id"]
        );
        assert_eq!(
            keys(&Value::Object(before.event.data.clone())),
            [
                "action_digest",
                "approvers",
                "authorization_type",
                "decision",
                "nonce",
                "valid_until",
                "version"
            ]
        );
        assert_eq!(
            keys(&Value::Object(created.event.data.clone())),
            [
                "action_digest",
                "expires_at",
                "requested_by",
                "requested_fields",
                "room",
                "valid_for_seconds",
                "version"
            ]
        );
        // The signed bytes: the statement of countersign.decision/v1 as it always was.
        let proof = before.request.proof.unwrap();
        let body =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &proof.payload)
                .unwrap();
        let expected = format!(
            concat!(
                r#"{{"type":"countersign.decision/v1","request_id":"req_1","decision":"approved","#,
                r#""authorization_type":"human","action":{{"description":"Transfer GBP 12,450 to Globex Corp","#,
                r#""details":{{"amount":"12450","currency":"GBP"}}}},"action_digest":"{}","#,
                r#""requested_by":{{"id":"token:deploy-bot","display_name":"deploy-bot","auth_method":"bearer_token"}},"#,
                r#""approvers":[{{"id":"token:alice","display_name":"alice","channel":"api","auth_method":"bearer_token"}}],"#,
                r#""comment":"ok","fields":{{"po_number":"PO-7"}},"requested_at":"2026-11-29T12:00:00.000Z","#,
                r#""decided_at":"2026-11-29T12:00:05.000Z","valid_until":"2026-11-29T12:10:05.000Z","nonce":"bm9uY2U"}}"#
            ),
            plain.action_digest
        );
        assert_eq!(String::from_utf8(body).unwrap(), expected);
    }

    #[test]
    fn any_rejection_rejects_at_once_and_keeps_the_approvals_on_record() {
        let one = approve(&needing(3, None), &alice(), "alice", 1).request;
        let no = vote_as(&one, Verdict::Rejected, &bob(), "bob", true, &[], 2).unwrap();
        assert_eq!(no.request.status, Status::Rejected);
        assert_eq!(no.event.kind(), "request_decided");
        let decision = no.request.decision.as_ref().unwrap();
        let named: Vec<&str> = decision.approvers.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(named, ["user:bob"], "the rejection names the rejecter");
        assert_eq!(decision.comment.as_deref(), Some("rejected by bob"));
        assert_eq!(no.request.approvals.len(), 1);
        assert_eq!(
            no.request.approvals[0].approver.account.as_deref(),
            Some("alice")
        );
        let statement = no
            .request
            .proof
            .as_ref()
            .unwrap()
            .unverified_statement()
            .unwrap();
        assert_eq!(statement.approvers, decision.approvers);
        // Closed: nobody decides it again.
        let late = vote_as(
            &no.request,
            Verdict::Approved,
            &carol(),
            "carol",
            true,
            &[],
            3,
        );
        assert!(
            matches!(late, Err(CoreError::AlreadyDecided { .. })),
            "{late:?}"
        );
        // An approver may still reject after approving: withdrawing consent fails closed.
        let changed = vote_as(&one, Verdict::Rejected, &alice(), "alice", true, &[], 2).unwrap();
        assert_eq!(changed.request.status, Status::Rejected);
    }

    #[test]
    fn one_account_counts_once_whatever_identity_it_uses() {
        let one = approve(&needing(2, None), &alice(), "alice", 1).request;
        // The same person from the dashboard, mapped to the same account.
        let again = Principal::user("alice", "Alice", Role::Approver);
        let err = vote_as(&one, Verdict::Approved, &again, "alice", true, &[], 2).unwrap_err();
        assert!(
            matches!(
                &err,
                CoreError::NotCounted(NotCounted::AlreadyApproved { account, .. }) if account == "alice"
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("account alice already approved request req_q"),
            "{text}"
        );
        assert!(
            text.contains("alice via dashboard at 2026-11-29T12:00:01.000Z"),
            "{text}"
        );
        // The same identity approving twice is refused the same way.
        let twice = vote_as(&one, Verdict::Approved, &alice(), "alice", true, &[], 2);
        assert!(matches!(twice, Err(CoreError::NotCounted(_))), "{twice:?}");
        // Two identities of one account never make a quorum: a second account does.
        let done = approve(&one, &bob(), "bob", 3);
        assert_eq!(done.request.status, Status::Approved);
    }

    #[test]
    fn the_requester_never_counts() {
        let request = needing(2, None);
        // The requesting identity itself.
        let itself = Principal::from_token("deploy-bot", Role::Approver);
        let err = vote_as(&request, Verdict::Approved, &itself, "bot", true, &[], 1);
        assert!(
            matches!(err, Err(CoreError::SelfApproval { .. })),
            "{err:?}"
        );
        // Another identity of the requester's account (its owner signed in elsewhere).
        let owner = Principal::user("dana", "Dana", Role::Approver);
        let err = vote_as(
            &request,
            Verdict::Approved,
            &owner,
            "bot-owner",
            true,
            &[],
            1,
        )
        .unwrap_err();
        assert!(matches!(err, CoreError::SelfApproval { .. }), "{err:?}");
        assert!(
            err.to_string().contains("user:dana (account bot-owner)"),
            "{err}"
        );
        // Nor on a request without a quorum.
        let err = vote_as(
            &pending(),
            Verdict::Approved,
            &owner,
            "bot-owner",
            true,
            &[],
            1,
        );
        assert!(
            matches!(err, Err(CoreError::SelfApproval { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn deciders_must_come_from_the_required_group() {
        let request = needing(2, Some("sre"));
        for verdict in [Verdict::Approved, Verdict::Rejected] {
            let err = vote_as(&request, verdict, &bob(), "bob", false, &[], 1).unwrap_err();
            assert!(
                matches!(&err, CoreError::NotCounted(NotCounted::NotEligible { group, .. }) if group == "sre"),
                "{err:?}"
            );
            assert!(
                err.to_string()
                    .contains("account bob is not in group \"sre\""),
                "{err}"
            );
        }
        // A caller that maps no accounts is in no group: it fails closed.
        let unmapped = request.decide(
            Verdict::Approved,
            DecisionInput::default(),
            &bob(),
            Channel::Api,
            t0(),
            "nonce-unmapped-0123456789".into(),
            &signer(),
            &Limits::default(),
        );
        assert!(
            matches!(unmapped, Err(CoreError::NotCounted(_))),
            "{unmapped:?}"
        );
        let one = approve(&request, &alice(), "alice", 1);
        assert_eq!(one.request.quorum_progress(), Some((1, 2)));
        // One approver from a group: the first eligible approval decides.
        let single = approve(&needing(1, Some("sre")), &alice(), "alice", 1);
        assert_eq!(single.request.status, Status::Approved);
        let statement = single
            .request
            .proof
            .unwrap()
            .unverified_statement()
            .unwrap();
        assert_eq!(statement.quorum.unwrap().group.as_deref(), Some("sre"));
    }

    #[test]
    fn reply_fields_add_up_and_are_required_by_the_last_approval() {
        let mut made = ApprovalRequest::create(
            "req_f".into(),
            crate::NewRequest {
                requested_fields: vec!["po_number".into()],
                ..new_request()
            },
            &agent(),
            t0(),
            &Limits::default(),
        )
        .unwrap();
        made.require_quorum(Quorum::new(2, None).unwrap()).unwrap();
        // An approval before the last need not fill the fields...
        let one = vote_as(
            &made.request,
            Verdict::Approved,
            &alice(),
            "alice",
            true,
            &[],
            1,
        )
        .unwrap()
        .request;
        // ...the last must, unless an earlier approval did.
        let err = vote_as(&one, Verdict::Approved, &bob(), "bob", true, &[], 2).unwrap_err();
        assert!(err.to_string().contains("fill in po_number"), "{err}");
        let done = vote_as(
            &one,
            Verdict::Approved,
            &bob(),
            "bob",
            true,
            &[("po_number", "PO-1")],
            2,
        )
        .unwrap();
        assert_eq!(done.request.decision.unwrap().fields["po_number"], "PO-1");

        let given = vote_as(
            &made.request,
            Verdict::Approved,
            &alice(),
            "alice",
            true,
            &[("po_number", "PO-1")],
            1,
        )
        .unwrap()
        .request;
        let kept = vote_as(
            &given,
            Verdict::Approved,
            &bob(),
            "bob",
            true,
            &[("note", "x")],
            2,
        )
        .unwrap();
        let fields = kept.request.decision.unwrap().fields;
        assert_eq!(fields.len(), 2);
        assert_eq!(fields["po_number"], "PO-1");
        let err = vote_as(
            &given,
            Verdict::Approved,
            &bob(),
            "bob",
            true,
            &[("po_number", "PO-2")],
            2,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("po_number is \"PO-1\" as alice gave it"),
            "{err}"
        );
    }

    #[test]
    fn a_quorum_is_checked_and_combined_when_the_request_is_made() {
        assert!(Quorum::new(0, None).is_err());
        assert!(Quorum::new(MAX_APPROVALS + 1, None).is_err());
        let err = Quorum::new(2, Some("Not A Group")).unwrap_err();
        assert!(
            matches!(&err, CoreError::Invalid { field, .. } if field == "quorum.group"),
            "{err:?}"
        );

        let mut t = made(2, Some("sre"));
        assert_eq!(
            t.event.data["quorum"],
            json!({"required": 2, "group": "sre"})
        );
        t.require_quorum(Quorum::new(3, None).unwrap()).unwrap();
        assert_eq!(
            t.request.quorum,
            Some(Quorum {
                required: 3,
                group: Some("sre".into())
            })
        );
        assert_eq!(
            t.event.data["quorum"],
            json!({"required": 3, "group": "sre"})
        );
        let err = t
            .require_quorum(Quorum::new(2, Some("finance")).unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("one group only"), "{err}");
        // Not after the request was made.
        let mut later = approve(&t.request, &alice(), "alice", 1);
        assert!(matches!(
            later.require_quorum(Quorum::new(5, None).unwrap()),
            Err(CoreError::Refused(_))
        ));
    }

    /// What the store does: write a transition only over the version it follows.
    fn apply(stored: &mut ApprovalRequest, t: &Transition) -> bool {
        let applies = t.applies_to(stored);
        if applies {
            *stored = t.request.clone();
        }
        applies
    }

    #[test]
    fn the_last_approval_and_a_rejection_at_once_give_exactly_one_outcome() {
        let one = approve(&needing(2, None), &alice(), "alice", 1).request;
        let last = approve(&one, &bob(), "bob", 2);
        let no = vote_as(&one, Verdict::Rejected, &carol(), "carol", true, &[], 2).unwrap();
        // Two transitions of the same next version: the store keeps exactly one.
        assert_eq!(last.request.version, one.version + 1);
        assert_eq!(no.request.version, one.version + 1);
        assert!(last.applies_to(&one) && no.applies_to(&one));
        for (first, second, outcome) in [
            (&last, &no, Status::Approved),
            (&no, &last, Status::Rejected),
        ] {
            let mut stored = one.clone();
            assert!(apply(&mut stored, first));
            assert!(!apply(&mut stored, second), "the loser is not written");
            assert_eq!(stored.status, outcome);
            // The loser, computed again from what won, learns who won.
            let again = vote_as(&stored, Verdict::Approved, &carol(), "carol", true, &[], 3);
            assert!(
                matches!(again, Err(CoreError::AlreadyDecided { .. })),
                "{again:?}"
            );
        }
    }

    #[test]
    fn an_approval_computed_from_a_stale_version_is_detected() {
        let fresh = needing(3, None);
        let by_alice = approve(&fresh, &alice(), "alice", 1);
        let by_bob = approve(&fresh, &bob(), "bob", 1);
        let mut stored = fresh.clone();
        assert!(apply(&mut stored, &by_alice));
        // Bob's was computed before Alice's was stored: it follows nothing stored now,
        // so it cannot overwrite hers (which would lose an approval).
        assert!(!by_bob.applies_to(&stored));
        assert!(!apply(&mut stored, &by_bob));
        // Computed again from the current state, it counts.
        let retried = approve(&stored, &bob(), "bob", 2);
        assert!(apply(&mut stored, &retried));
        assert_eq!(stored.quorum_progress(), Some((2, 3)));

        // One account through two identities at once: one wins, the retry is refused.
        let fresh = needing(2, None);
        let as_token = approve(&fresh, &alice(), "alice", 1);
        let as_user = approve(
            &fresh,
            &Principal::user("alice", "Alice", Role::Approver),
            "alice",
            1,
        );
        let mut stored = fresh.clone();
        assert!(apply(&mut stored, &as_token));
        assert!(!apply(&mut stored, &as_user));
        let retry = vote_as(
            &stored,
            Verdict::Approved,
            &Principal::user("alice", "Alice", Role::Approver),
            "alice",
            true,
            &[],
            2,
        );
        assert!(matches!(retry, Err(CoreError::NotCounted(_))), "{retry:?}");
        assert_eq!(stored.status, Status::Pending);
    }

    fn sealed(events: &[&Event]) -> Vec<SealedEvent> {
        events
            .iter()
            .enumerate()
            .map(|(n, e)| e.seal([n as u8 + 1; 32]))
            .collect()
    }

    fn audit(events: &[SealedEvent], row: &ApprovalRequest) -> Vec<String> {
        let mut audit = Audit::new();
        for (n, e) in events.iter().enumerate() {
            audit.push(n as u64 + 1, &e.entry, e.payload.as_ref());
        }
        audit.request(row);
        audit.finish().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_audit_replays_recorded_approvals() {
        let created = made(3, Some("sre"));
        let one = approve(&created.request, &alice(), "alice", 1);
        let two = vote_as(
            &one.request,
            Verdict::Approved,
            &bob(),
            "bob",
            true,
            &[("po", "7")],
            2,
        )
        .unwrap();
        let three = approve(&two.request, &carol(), "carol", 3);
        let acted = three
            .request
            .record_action(
                "pay".into(),
                BTreeMap::new(),
                &agent(),
                t0().plus_seconds(4),
                &Limits::default(),
            )
            .unwrap();
        let events = sealed(&[
            &created.event,
            &one.event,
            &two.event,
            &three.event,
            &acted.event,
        ]);
        assert_eq!(audit(&events, &acted.request), Vec::<String>::new());
        // The logged statement is the signed one, all three approvers in it.
        let logged =
            Statement::for_decision(&acted.request, acted.request.decision.as_ref().unwrap());
        assert_eq!(logged.approvers.len(), 3);

        // A row that lost an approval disagrees with its log.
        let mut row = acted.request.clone();
        row.approvals.remove(0);
        let found = audit(&events, &row);
        assert!(
            found
                .iter()
                .any(|d| d.starts_with("requests req_q: approvals")),
            "{found:?}"
        );

        // A log that counts one account twice is named, entry and all.
        let mut forged = two.event.clone();
        let mut approvals = one.event.data["approvals"].clone();
        let mut twin = approvals[0].clone();
        twin["id"] = json!("user:alice");
        approvals.as_array_mut().unwrap().push(twin);
        forged.data.insert("approvals".into(), approvals);
        let events = sealed(&[&created.event, &one.event, &forged]);
        let found = audit(&events, &two.request);
        assert!(
            found.iter().any(|d| d.contains("request_approval_recorded")
                && d.contains("account alice is counted twice")),
            "{found:?}"
        );
    }

    #[test]
    fn mapped_accounts_count_an_identity_as_its_account() {
        let identities = Identities::new([
            ("token:alice".to_string(), "alice".to_string()),
            ("token:bot".to_string(), "bob".to_string()),
            ("token:bob-laptop".to_string(), "bob".to_string()),
        ])
        .unwrap();
        let groups = Groups::new(std::collections::BTreeMap::from([(
            "sre".to_string(),
            vec!["user:alice".to_string(), "token:carol".to_string()],
        )]))
        .unwrap();
        let request = needing(2, Some("sre"));
        let bot = Principal::from_token("bot", Role::Agent);
        let mut asked = request.clone();
        asked.requested_by = bot.as_requester();
        // A token of alice's is alice, and alice is in sre.
        let by_token = DecisionAccounts::mapped(&asked, &alice(), &identities, &groups);
        assert_eq!(by_token.decider, "user:alice");
        assert_eq!(by_token.requester, "user:bob");
        assert!(by_token.eligible);
        // bob's account made the request (through its agent token): bob never counts,
        // through whichever identity of his.
        let laptop = Principal::from_token("bob-laptop", Role::Approver);
        let err = asked
            .decide_as(
                Verdict::Approved,
                DecisionInput::default(),
                &laptop,
                &DecisionAccounts::mapped(&asked, &laptop, &identities, &groups),
                Channel::Dashboard,
                t0().plus_seconds(1),
                "nonce-0123456789abcdef".into(),
                &signer(),
                &Limits::default(),
            )
            .err();
        assert!(
            matches!(err, Some(CoreError::SelfApproval { ref principal, .. }) if principal == "token:bob-laptop (account user:bob)"),
            "{err:?}"
        );
        // An unmapped token counts as itself, and is eligible by its own id.
        let carol = Principal::from_token("carol", Role::Approver);
        let own = DecisionAccounts::mapped(&asked, &carol, &identities, &groups);
        assert_eq!(own.decider, "token:carol");
        assert!(own.eligible);
        // Outside the group: not eligible; with no group named, eligibility is not read.
        let dave = Principal::user("dave", "Dave", Role::Approver);
        assert!(!DecisionAccounts::mapped(&asked, &dave, &identities, &groups).eligible);
    }
}
