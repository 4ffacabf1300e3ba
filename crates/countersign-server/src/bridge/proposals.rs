//! The seed's operator view of bridged proposals: `list_pending_approvals` numbers every
//! proposal awaiting a decision (#0, #1, ...), and `approve(index)` / `reject(index)`
//! decide one by its number. The approval-gate profile (`mcp/approval_gate.rs`) serves
//! it; the rules live here.
//!
//! A number means what the caller's last listing showed under it, and nothing else: each
//! listing is saved for its caller (in the store for HTTP, so that any instance behind a
//! load balancer resolves it alike; in memory for a stdio process, which is its own
//! session), and a decision by number resolves to the request saved under that number.
//! When that request is no longer awaiting a decision (someone decided it elsewhere, it
//! timed out, the caller already decided it), the number is refused and nothing is
//! decided: the caller lists again. A number never silently moves to another proposal,
//! so the seed's "approve 0, reject 1" decides the two proposals that were shown, even
//! though the first decision shortens the list.
//!
//! Decisions go through [`Gate::decide`] like every other surface's: signed proof, log,
//! and the bridge then delivers to `approved.json` as usual.

use std::collections::HashMap;
use std::fmt::Write as _;

use countersign_core::{Channel, Decider, DecisionInput, Principal, Status, Verdict};
use countersign_store::{Docs, RequestQuery, Step, collection, kinds};
use schemars::JsonSchema;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{BRIDGE_DETAIL, PROPOSAL_DETAIL};
use crate::error::GateError;
use crate::gate::Gate;
use crate::views::ApprovalView;

/// The most pending requests one listing looks through for bridged proposals.
const SCAN_LIMIT: usize = 5000;

/// One field of a proposal, as the process wrote it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProposalField {
    pub name: String,
    /// The value as shown: a string's text, any other value's JSON as written (a
    /// `6.00` stays `6.00`).
    pub value: String,
}

/// A bridged proposal awaiting a decision, as `list_pending_approvals` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListedProposal {
    /// Its number in this listing: what `approve(index)` and `reject(index)` take.
    pub index: usize,
    /// The bridge (`[[bridge]] name`) whose process proposed it.
    pub bridge: String,
    /// The countersign request it is.
    pub request_id: String,
    /// Its `label` (else its `action`, else the request's description).
    pub label: String,
    /// Every field, in the order the process wrote them.
    pub fields: Vec<ProposalField>,
    /// The proposal as a JSON object.
    pub proposal: Value,
    pub requested_at: String,
    /// When it stops waiting (and counts as not approved).
    pub expires_at: String,
    /// Approvals still needed when it needs several (a quorum); absent for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals_needed: Option<u32>,
}

/// Everything `list_pending_approvals` answers.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PendingProposals {
    pub count: usize,
    pub proposals: Vec<ListedProposal>,
}

impl PendingProposals {
    /// The seed's text layout (its example session), with the bridge and the request
    /// under each proposal.
    pub fn to_text(&self) -> String {
        if self.proposals.is_empty() {
            return "No proposals awaiting approval.".to_string();
        }
        let mut out = format!("{} proposal(s) awaiting approval\n", self.count);
        for p in &self.proposals {
            let _ = write!(
                out,
                "\n--- Proposal #{} ------------------------------\n",
                p.index
            );
            for field in &p.fields {
                let _ = writeln!(out, "    {:<14}{}", format!("{}:", field.name), field.value);
            }
            let _ = write!(
                out,
                "    (bridge {}, request {}, waits until {}",
                p.bridge, p.request_id, p.expires_at
            );
            if let Some(needed) = p.approvals_needed {
                let _ = write!(out, ", {needed} more approval(s) needed");
            }
            out.push_str(")\n");
        }
        out.push_str("\nUse approve(index) or reject(index) to decide.");
        out
    }
}

/// What a decision by number did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DecidedProposal {
    pub index: usize,
    pub bridge: String,
    pub label: String,
    /// The request now: `approved` (queued for the process), `rejected`, or still
    /// `pending` when its quorum needs more approvals.
    pub request: ApprovalView,
    /// The seed's answer, e.g. "Approved and queued for execution: reindex shard 7".
    pub message: String,
}

/// One number of a saved listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntry {
    pub request_id: String,
    pub bridge: String,
    pub label: String,
}

/// A caller's last listing: what its numbers mean.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub listed_at: String,
    pub entries: Vec<ListedEntry>,
}

collection!(
    /// Each caller's last listing, by principal id.
    pub(crate) ListingDocs: kinds::BRIDGE_LISTING => Listing
);

/// Where listings are kept between a listing and a decision.
pub enum Listings {
    /// In this process: a stdio session, whose caller is fixed and whose listing dies
    /// with it.
    Memory(std::sync::Mutex<HashMap<String, Listing>>),
    /// In the store, by principal id: Streamable HTTP, where every call may reach
    /// another instance.
    Stored,
}

impl Listings {
    pub fn memory() -> Self {
        Listings::Memory(std::sync::Mutex::new(HashMap::new()))
    }

    async fn save(&self, gate: &Gate, who: &Principal, listing: Listing) -> Result<(), GateError> {
        match self {
            Listings::Memory(map) => {
                map.lock()
                    .map_err(|_| GateError::Internal("the listings lock is poisoned".into()))?
                    .insert(who.id.clone(), listing);
                Ok(())
            }
            Listings::Stored => {
                Docs::<ListingDocs>::new(gate.store().as_ref())
                    .modify(&who.id, gate.now(), |current| {
                        Ok::<_, GateError>(match current {
                            Some(stored) if stored.body.entries == listing.entries => {
                                Step::Done(())
                            }
                            _ => Step::Write {
                                body: listing.clone(),
                                event: None,
                                then: (),
                            },
                        })
                    })
                    .await
            }
        }
    }

    async fn load(&self, gate: &Gate, who: &Principal) -> Result<Option<Listing>, GateError> {
        match self {
            Listings::Memory(map) => Ok(map
                .lock()
                .map_err(|_| GateError::Internal("the listings lock is poisoned".into()))?
                .get(&who.id)
                .cloned()),
            Listings::Stored => Ok(Docs::<ListingDocs>::new(gate.store().as_ref())
                .get(&who.id)
                .await?
                .map(|stored| stored.body)),
        }
    }
}

/// The bridge a request came from and the proposal it carries, when it is a bridged
/// proposal: asked by `bridge:<name>` with that name in its details. Another agent's
/// request that only carries such details is not one.
pub fn bridged(view: &ApprovalView) -> Option<(&str, &str)> {
    let bridge = view.action_details.get(BRIDGE_DETAIL)?;
    let proposal = view.action_details.get(PROPOSAL_DETAIL)?;
    let asker = view.requested_by.strip_prefix("bridge:")?;
    (asker == bridge).then_some((bridge.as_str(), proposal.as_str()))
}

/// Every bridged proposal awaiting a decision (of `only` that bridge, when given), oldest
/// first, numbered from 0, and saved as `who`'s listing.
pub async fn list(
    gate: &Gate,
    listings: &Listings,
    decider: &Decider,
    only: Option<&str>,
) -> Result<PendingProposals, GateError> {
    let query = RequestQuery {
        status: Some(Status::Pending),
        requested_by: None,
        limit: SCAN_LIMIT,
    };
    let mut views: Vec<ApprovalView> = gate
        .list(decider, &query)
        .await?
        .iter()
        .map(ApprovalView::new)
        .filter(|v| bridged(v).is_some_and(|(b, _)| only.is_none_or(|o| o == b)))
        .collect();
    views.sort_by(|a, b| {
        (a.requested_at.as_str(), a.request_id.as_str())
            .cmp(&(b.requested_at.as_str(), b.request_id.as_str()))
    });
    let mut proposals = Vec::with_capacity(views.len());
    for (index, view) in views.iter().enumerate() {
        let Some((bridge, raw)) = bridged(view) else {
            continue;
        };
        let fields = ordered_fields(raw);
        let proposal = serde_json::from_str(raw).unwrap_or(Value::Null);
        proposals.push(ListedProposal {
            index,
            bridge: bridge.to_string(),
            request_id: view.request_id.clone(),
            label: label_of(&proposal, view),
            fields,
            proposal,
            requested_at: view.requested_at.clone(),
            expires_at: view.expires_at.clone(),
            approvals_needed: view.quorum.as_ref().map(|q| q.still_needed),
        });
    }
    let listing = Listing {
        listed_at: gate.now().to_string(),
        entries: proposals
            .iter()
            .map(|p| ListedEntry {
                request_id: p.request_id.clone(),
                bridge: p.bridge.clone(),
                label: p.label.clone(),
            })
            .collect(),
    };
    listings.save(gate, decider.principal(), listing).await?;
    Ok(PendingProposals {
        count: proposals.len(),
        proposals,
    })
}

/// Decides the proposal that `decider`'s last listing numbered `index`, if it is still
/// awaiting a decision; otherwise refuses, deciding nothing.
pub async fn decide(
    gate: &Gate,
    listings: &Listings,
    decider: &Decider,
    index: usize,
    verdict: Verdict,
    comment: Option<String>,
) -> Result<DecidedProposal, GateError> {
    let who = decider.principal();
    let listing = listings.load(gate, who).await?.ok_or_else(|| {
        GateError::BadInput(
            "there is no listing to take a number from: call list_pending_approvals first (an index is a number from your last listing)".into(),
        )
    })?;
    let entry = listing.entries.get(index).ok_or_else(|| {
        GateError::BadInput(match listing.entries.len() {
            0 => format!(
                "there is no proposal #{index}: your last listing ({}) had none; call list_pending_approvals again",
                listing.listed_at
            ),
            n => format!(
                "there is no proposal #{index}: your last listing ({}) numbered #0 to #{}; call list_pending_approvals again",
                listing.listed_at,
                n - 1
            ),
        })
    })?;
    let stale = |why: String| {
        GateError::Changed(format!(
            "proposal #{index} of your last listing ({}, {} of bridge {}) {why}; nothing was decided: call list_pending_approvals for the current list",
            entry.label, entry.request_id, entry.bridge
        ))
    };
    let current = ApprovalView::new(&gate.get(who, &entry.request_id).await?);
    if bridged(&current).map(|(b, _)| b) != Some(entry.bridge.as_str()) {
        return Err(stale("is not the proposal it was".into()));
    }
    if current.status != "pending" {
        return Err(stale(closed_reason(&current)));
    }
    let decided = gate
        .decide(
            decider,
            &entry.request_id,
            verdict,
            DecisionInput {
                comment,
                fields: Default::default(),
            },
            Channel::Mcp,
        )
        .await
        .map_err(|err| match err.kind() {
            crate::error::ErrorKind::AlreadyDecided | crate::error::ErrorKind::Expired => {
                stale(format!("was closed meanwhile ({})", err.public_message()))
            }
            _ => err,
        })?;
    let request = ApprovalView::new(&decided);
    let message = match (verdict, request.status.as_str()) {
        (Verdict::Approved, "approved") => {
            format!("Approved and queued for execution: {}", entry.label)
        }
        (Verdict::Approved, _) => match &request.quorum {
            Some(q) => format!(
                "Approval recorded, {} more needed before it is queued: {}",
                q.still_needed, entry.label
            ),
            None => format!("Approval recorded: {}", entry.label),
        },
        (Verdict::Rejected, _) => format!("Rejected and removed: {}", entry.label),
    };
    Ok(DecidedProposal {
        index,
        bridge: entry.bridge.clone(),
        label: entry.label.clone(),
        request,
        message,
    })
}

/// Why a request no longer awaits a decision, in words.
fn closed_reason(view: &ApprovalView) -> String {
    match &view.decision {
        Some(d) => {
            let by: Vec<&str> = d
                .approvers
                .iter()
                .map(|a| a.display_name.as_str())
                .collect();
            if by.is_empty() {
                format!(
                    "was already {} ({}) at {}",
                    view.status, d.authorization_type, d.decided_at
                )
            } else {
                format!(
                    "was already {} by {} at {}",
                    view.status,
                    by.join(", "),
                    d.decided_at
                )
            }
        }
        None => format!("is {} now", view.status.replace('_', " ")),
    }
}

/// What a proposal is called: its `label`, else its `action`, else the request's
/// description.
fn label_of(proposal: &Value, view: &ApprovalView) -> String {
    ["label", "action"]
        .iter()
        .find_map(|k| match proposal.get(k) {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| view.action_description.clone())
}

/// A proposal's fields in the order they were written, each value as shown.
pub fn ordered_fields(raw: &str) -> Vec<ProposalField> {
    let Ok(Ordered(members)) = serde_json::from_str::<Ordered>(raw) else {
        return Vec::new();
    };
    members
        .into_iter()
        .map(|(name, value)| ProposalField {
            name,
            value: shown(&value),
        })
        .collect()
}

/// A string's text; a number, boolean or null as written; an object or array as compact
/// JSON.
fn shown(raw: &RawValue) -> String {
    let text = raw.get().trim();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text).unwrap_or_else(|_| text.to_string()),
        Some(b'{' | b'[') => serde_json::from_str::<Value>(text)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| text.to_string()),
        _ => text.to_string(),
    }
}

/// A JSON object's members in document order, each value's text as written
/// (serde_json's own map sorts them, and its numbers drop `6.00`'s zeros).
struct Ordered(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push((key, value));
                }
                Ok(Ordered(out))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_the_processs_order_and_text() {
        let fields = ordered_fields(
            r#"{"id": "job-1042", "label": "reindex shard 7", "cost": 6.00, "n": null, "tags": ["a", 1], "created_at": "2026-08-18T22:14:07Z"}"#,
        );
        let shown: Vec<(&str, &str)> = fields
            .iter()
            .map(|f| (f.name.as_str(), f.value.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("id", "job-1042"),
                ("label", "reindex shard 7"),
                ("cost", "6.00"),
                ("n", "null"),
                ("tags", r#"["a",1]"#),
                ("created_at", "2026-08-18T22:14:07Z"),
            ]
        );
        assert!(ordered_fields("[1, 2]").is_empty());
    }

    #[test]
    fn the_listing_reads_as_the_seeds() {
        let listed = PendingProposals {
            count: 1,
            proposals: vec![ListedProposal {
                index: 0,
                bridge: "reindexer".into(),
                request_id: "req_1".into(),
                label: "reindex shard 7".into(),
                fields: ordered_fields(r#"{"id": "job-1042", "cost": 6.00}"#),
                proposal: serde_json::json!({"id": "job-1042", "cost": 6.0}),
                requested_at: "2026-08-18T22:14:08Z".into(),
                expires_at: "2026-08-19T22:14:08Z".into(),
                approvals_needed: None,
            }],
        };
        assert_eq!(
            listed.to_text(),
            "1 proposal(s) awaiting approval\n\n\
             --- Proposal #0 ------------------------------\n\
             \x20   id:           job-1042\n\
             \x20   cost:         6.00\n\
             \x20   (bridge reindexer, request req_1, waits until 2026-08-19T22:14:08Z)\n\
             \nUse approve(index) or reject(index) to decide."
        );
    }
}
