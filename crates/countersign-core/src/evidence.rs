//! Evidence beyond the approval itself (LoopGrid's model): what ran, what came of it, a
//! reviewer's verdict, and decisions an agent or system made on its own. Each is a log
//! event; free-form details live in the event's committed payload and can never
//! overwrite the canonical fields, which are separate members of the entry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::CoreError;
use crate::event::{Event, EventKind};
use crate::principal::Principal;
use crate::request::{ApprovalRequest, Limits, Status, Transition, validate_map};
use crate::time::Timestamp;

/// How the action turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    Succeeded,
    Failed,
    Partial,
    /// Whether it ran cannot be known: the gateway that forwarded it stopped before the
    /// upstream answered (or the upstream's connection was lost mid-call). Never sent
    /// again.
    Unknown,
}

impl std::str::FromStr for OutcomeStatus {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "succeeded" => Ok(Self::Succeeded),
            "failed" => Ok(Self::Failed),
            "partial" => Ok(Self::Partial),
            "unknown" => Ok(Self::Unknown),
            other => Err(CoreError::invalid(
                "status",
                format!("{other:?} is not succeeded, failed, partial or unknown"),
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    pub status: OutcomeStatus,
    pub summary: Option<String>,
    pub details: BTreeMap<String, String>,
    pub recorded_by: String,
    pub recorded_at: Timestamp,
}

/// A reviewer's verdict on how a request was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewVerdict {
    Accepted,
    Flagged,
}

impl std::str::FromStr for ReviewVerdict {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "accepted" => Ok(Self::Accepted),
            "flagged" => Ok(Self::Flagged),
            other => Err(CoreError::invalid(
                "verdict",
                format!("{other:?} is not accepted or flagged"),
            )),
        }
    }
}

/// The reviewer, as configured by the operator (never as claimed by a model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reviewer {
    pub id: String,
    pub display_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRecord {
    pub reviewer: Reviewer,
    pub verdict: ReviewVerdict,
    pub notes: Option<String>,
    pub recorded_by: String,
    pub recorded_at: Timestamp,
}

fn optional_text(
    field: &str,
    text: Option<String>,
    limits: &Limits,
) -> Result<Option<String>, CoreError> {
    match text.map(|t| t.trim().to_string()) {
        Some(t) if t.len() > limits.max_description_bytes => Err(CoreError::invalid(
            field,
            format!("longer than {} bytes", limits.max_description_bytes),
        )),
        Some(t) if t.is_empty() => Ok(None),
        other => Ok(other),
    }
}

impl ApprovalRequest {
    /// Records what came of the approved action. Only after the approval was used (the
    /// action recorded or the proof redeemed), only by its requester, and only once.
    pub fn record_outcome(
        &self,
        status: OutcomeStatus,
        summary: Option<String>,
        details: BTreeMap<String, String>,
        by: &Principal,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        validate_map("details", &details, limits.max_details, limits)?;
        let summary = optional_text("summary", summary, limits)?;
        if by.id != self.requested_by.id {
            return Err(CoreError::Forbidden(format!(
                "request {} was made by {}; only the requester records its outcome",
                self.id, self.requested_by.id
            )));
        }
        if self.used().is_none() {
            return Err(CoreError::invalid(
                "request_id",
                format!(
                    "request {} has no recorded action; call record_action when the action runs (or have the executor redeem the proof), then record its outcome",
                    self.id
                ),
            ));
        }
        if let Some(existing) = &self.outcome {
            return Err(CoreError::invalid(
                "request_id",
                format!(
                    "the outcome of {} was already recorded at {}; an outcome is recorded once",
                    self.id, existing.recorded_at
                ),
            ));
        }
        let request = Self {
            version: self.version + 1,
            outcome: Some(OutcomeRecord {
                status,
                summary: summary.clone(),
                details: details.clone(),
                recorded_by: by.id.clone(),
                recorded_at: now,
            }),
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::OutcomeRecorded,
                &request,
                now,
                Some(by.id.clone()),
                json!({"status": status}),
                Some(json!({"summary": summary, "details": details})),
            ),
            request,
        })
    }

    /// Records a review by the operator-configured `reviewer`, on a request that is no
    /// longer pending, once per reviewer. `by` is the authenticated caller that submitted
    /// it (the gate checks it is the configured reviewer).
    pub fn record_review(
        &self,
        reviewer: &Reviewer,
        verdict: ReviewVerdict,
        notes: Option<String>,
        by: &Principal,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        let notes = optional_text("notes", notes, limits)?;
        if self.effective_status(now) == Status::Pending {
            return Err(CoreError::invalid(
                "request_id",
                format!(
                    "request {} is still pending; review it once it is decided",
                    self.id
                ),
            ));
        }
        if let Some(earlier) = self.reviews.iter().find(|r| r.recorded_by == by.id) {
            return Err(CoreError::Refused(format!(
                "{} already reviewed request {} at {} ({}); a reviewer reviews a request once",
                by.id,
                self.id,
                earlier.recorded_at,
                match earlier.verdict {
                    ReviewVerdict::Accepted => "accepted",
                    ReviewVerdict::Flagged => "flagged",
                }
            )));
        }
        let mut reviews = self.reviews.clone();
        reviews.push(ReviewRecord {
            reviewer: reviewer.clone(),
            verdict,
            notes: notes.clone(),
            recorded_by: by.id.clone(),
            recorded_at: now,
        });
        let request = Self {
            version: self.version + 1,
            reviews,
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::ReviewRecorded,
                &request,
                now,
                Some(by.id.clone()),
                json!({"reviewer": reviewer, "verdict": verdict}),
                Some(json!({"notes": notes})),
            ),
            request,
        })
    }
}

/// The model behind an autonomous decision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub provider: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
}

/// A decision an agent or system made on its own (no human in the loop), recorded as
/// evidence under its own subject id (`dec_...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRecordInput {
    /// What was decided, in words.
    pub decision: String,
    pub rationale: Option<String>,
    pub model: Option<ModelInfo>,
    /// The authority it acted under (e.g. a policy id, a delegated scope).
    pub authority: BTreeMap<String, String>,
    pub details: BTreeMap<String, String>,
    /// An approval request this decision relates to, if any.
    pub related_request: Option<String>,
}

/// The event recording an autonomous decision under the subject `id`.
pub fn decision_record(
    id: &str,
    input: DecisionRecordInput,
    by: &Principal,
    now: Timestamp,
    limits: &Limits,
) -> Result<Event, CoreError> {
    if input.decision.trim().is_empty() {
        return Err(CoreError::invalid("decision", "must say what was decided"));
    }
    if input.decision.len() > limits.max_description_bytes {
        return Err(CoreError::invalid(
            "decision",
            format!("longer than {} bytes", limits.max_description_bytes),
        ));
    }
    let rationale = optional_text("rationale", input.rationale, limits)?;
    validate_map("authority", &input.authority, limits.max_details, limits)?;
    validate_map("details", &input.details, limits.max_details, limits)?;
    Ok(Event {
        kind: EventKind::DecisionRecorded,
        at: now,
        actor: Some(by.id.clone()),
        subject: Some(id.to_string()),
        data: match json!({
            "version": 1,
            "model": input.model,
            "authority": input.authority,
            "related_request": input.related_request,
        }) {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        },
        payload: Some(json!({
            "decision": input.decision,
            "rationale": rationale,
            "details": input.details,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use crate::{Role, Verdict};

    #[test]
    fn outcome_after_action_once_by_the_requester() {
        let limits = Limits::default();
        let approved = decide(&pending(), Verdict::Approved, t0()).request;
        let early = approved.record_outcome(
            OutcomeStatus::Succeeded,
            None,
            BTreeMap::new(),
            &agent(),
            t0(),
            &limits,
        );
        assert!(early.unwrap_err().to_string().contains("record_action"));
        let used = approved
            .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), &limits)
            .unwrap()
            .request;
        let other = Principal::from_token("x", Role::Agent);
        assert!(matches!(
            used.record_outcome(
                OutcomeStatus::Failed,
                None,
                BTreeMap::new(),
                &other,
                t0(),
                &limits
            ),
            Err(CoreError::Forbidden(_))
        ));
        let details = BTreeMap::from([(
            "tool".to_string(),
            "free-form may not overwrite".to_string(),
        )]);
        let t = used
            .record_outcome(
                OutcomeStatus::Succeeded,
                Some("paid".into()),
                details,
                &agent(),
                t0(),
                &limits,
            )
            .unwrap();
        assert_eq!(t.event.data["status"], "succeeded");
        assert_eq!(t.event.data["version"], json!(t.request.version));
        assert_eq!(
            t.event.payload.as_ref().unwrap()["details"]["tool"],
            "free-form may not overwrite"
        );
        assert!(
            t.request
                .record_outcome(
                    OutcomeStatus::Succeeded,
                    None,
                    BTreeMap::new(),
                    &agent(),
                    t0(),
                    &limits
                )
                .is_err()
        );
    }

    #[test]
    fn reviews_need_a_decided_request_and_carry_the_configured_reviewer() {
        let limits = Limits::default();
        let reviewer = Reviewer {
            id: "config:audit".into(),
            display_name: "Audit team".into(),
        };
        assert!(
            pending()
                .record_review(
                    &reviewer,
                    ReviewVerdict::Accepted,
                    None,
                    &agent(),
                    t0(),
                    &limits
                )
                .is_err()
        );
        let decided = decide(&pending(), Verdict::Rejected, t0()).request;
        let t = decided
            .record_review(
                &reviewer,
                ReviewVerdict::Flagged,
                Some("check".into()),
                &agent(),
                t0(),
                &limits,
            )
            .unwrap();
        assert_eq!(t.event.data["reviewer"]["id"], "config:audit");
        assert_eq!(t.request.reviews.len(), 1);
        let again = t
            .request
            .record_review(
                &reviewer,
                ReviewVerdict::Accepted,
                None,
                &agent(),
                t0(),
                &limits,
            )
            .unwrap_err();
        assert!(
            again.to_string().contains("reviews a request once"),
            "{again}"
        );
        let other = Principal::from_token("second-reviewer", Role::Approver);
        assert!(
            t.request
                .record_review(
                    &reviewer,
                    ReviewVerdict::Accepted,
                    None,
                    &other,
                    t0(),
                    &limits
                )
                .is_ok(),
            "another reviewer (after a change of config) reviews once too"
        );
    }

    #[test]
    fn decision_records_validate() {
        let limits = Limits::default();
        let input = DecisionRecordInput {
            decision: "Refund under 50 EUR automatically".into(),
            rationale: Some("policy R-3".into()),
            model: Some(ModelInfo {
                provider: Some("acme".into()),
                name: Some("m".into()),
                version: None,
            }),
            authority: BTreeMap::from([("policy".to_string(), "R-3".to_string())]),
            details: BTreeMap::new(),
            related_request: None,
        };
        let event = decision_record("dec_1", input.clone(), &agent(), t0(), &limits).unwrap();
        assert_eq!(event.subject.as_deref(), Some("dec_1"));
        assert_eq!(event.data["version"], 1);
        assert_eq!(event.data["authority"]["policy"], "R-3");
        let empty = DecisionRecordInput {
            decision: " ".into(),
            ..input
        };
        assert!(decision_record("dec_2", empty, &agent(), t0(), &limits).is_err());
    }
}
