//! What a proposal becomes (the request: its description, its details, its key) and what
//! a record becomes (the request's outcome).

use std::collections::BTreeMap;

use countersign_core::NewRequest;
use countersign_core::evidence::OutcomeStatus;
use serde_json::{Map, Value};

use super::files::Proposal;
use super::{BRIDGE_DETAIL, BridgeConfig, PROPOSAL_DETAIL};

/// Whether `proposal` is the same as the proposal text `raw` (as JSON, however written).
pub(super) fn same_proposal(raw: &str, proposal: &Proposal) -> bool {
    serde_json::from_str::<Value>(raw).ok() == Some(Value::Object(proposal.fields.clone()))
}

/// The request a proposal becomes. The description is its `label`, else its `action`;
/// the details are every field (as the gateway binds arguments: one per leaf, keyed by
/// JSON Pointer), the bridge's name, the `action` as the `tool` policies match on, and
/// the proposal's exact text, which is what an approval delivers.
pub fn new_request(config: &BridgeConfig, proposal: &Proposal) -> NewRequest {
    let text = |field: &str| match proposal.fields.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        _ => None,
    };
    let description = text("label")
        .or_else(|| text("action"))
        .or_else(|| proposal.id().map(|id| format!("proposal {id}")))
        .unwrap_or_else(|| format!("a proposal of {}", config.name));
    let mut details = countersign_core::arguments::flatten(&proposal.fields);
    details.insert(BRIDGE_DETAIL.into(), config.name.clone());
    details.insert(PROPOSAL_DETAIL.into(), proposal.raw.clone());
    if let Some(action) = text("action") {
        details.insert(countersign_core::arguments::TOOL_DETAIL.into(), action);
    }
    NewRequest {
        description: truncate(description, 1000),
        details,
        timeout_seconds: config.timeout.map(|t| t.as_secs().max(1)),
        idempotency_key: Some(format!("bridge:{}:{}", config.name, proposal.key)),
        ..NewRequest::default()
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// A record as an outcome: `failed`, `partial` or `unknown` when its `outcome` says so
/// (`failed`, `failure`, `error`, `partial`, `unknown`), else `succeeded` (the process
/// acted and resolved it; `outcome` itself, e.g. `win` or `loss`, is in the details).
pub(super) fn outcome_of(
    record: &Map<String, Value>,
    max_details: usize,
) -> (OutcomeStatus, String, BTreeMap<String, String>) {
    let word = match record.get("outcome") {
        Some(Value::String(s)) => Some(s.to_ascii_lowercase()),
        _ => None,
    };
    let status = match word.as_deref() {
        Some("failed" | "failure" | "fail" | "error") => OutcomeStatus::Failed,
        Some("partial") => OutcomeStatus::Partial,
        Some("unknown") => OutcomeStatus::Unknown,
        _ => OutcomeStatus::Succeeded,
    };
    let shown = |key: &str| match record.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    let summary = match (shown("record_type"), shown("outcome")) {
        (Some(t), Some(o)) => format!("record {t}: {o}"),
        (None, Some(o)) => format!("record: {o}"),
        (Some(t), None) => format!("record {t}"),
        (None, None) => "recorded by the process".to_string(),
    };
    let mut details = BTreeMap::new();
    for (key, value) in record.iter().take(max_details) {
        let value = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if key.len() <= 200 && value.len() <= 4096 {
            details.insert(key.clone(), value);
        }
    }
    (status, truncate(summary, 1000), details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::files::Paths;

    fn config() -> BridgeConfig {
        BridgeConfig {
            name: "reindexer".into(),
            paths: Paths::in_dir(std::path::Path::new("/srv/p")),
            timeout: None,
        }
    }

    #[test]
    fn a_proposal_becomes_a_request_bound_to_its_exact_text() {
        let raw =
            r#"{"id": "job-1042", "label": "reindex shard 7", "action": "reindex", "cost": 6.00}"#;
        let proposal = Proposal::parse(raw).unwrap();
        let new = new_request(&config(), &proposal);
        assert_eq!(new.description, "reindex shard 7");
        assert_eq!(
            new.idempotency_key.as_deref(),
            Some("bridge:reindexer:id:job-1042")
        );
        assert_eq!(new.details["proposal"], raw);
        assert_eq!(new.details["bridge"], "reindexer");
        assert_eq!(new.details["tool"], "reindex");
        assert_eq!(new.details["/id"], "\"job-1042\"");
        assert_eq!(new.details["/cost"], "6");

        let bare = Proposal::parse(r#"{"n": 1}"#).unwrap();
        let new = new_request(&config(), &bare);
        assert_eq!(new.description, "a proposal of reindexer");
        assert!(!new.details.contains_key("tool"));
        assert!(
            new.idempotency_key
                .unwrap()
                .starts_with("bridge:reindexer:sha256:")
        );
    }

    #[test]
    fn records_read_as_outcomes() {
        let record = |v: Value| v.as_object().unwrap().clone();
        let (status, summary, details) = outcome_of(
            &record(
                serde_json::json!({"id": "job-1", "record_type": "reindex", "resolved": true, "outcome": "win", "cost": 4.25}),
            ),
            50,
        );
        assert_eq!(status, OutcomeStatus::Succeeded);
        assert_eq!(summary, "record reindex: win");
        assert_eq!(details["cost"], "4.25");
        assert_eq!(details["resolved"], "true");
        let (status, _, _) = outcome_of(&record(serde_json::json!({"outcome": "Failed"})), 50);
        assert_eq!(status, OutcomeStatus::Failed);
        let (_, summary, details) = outcome_of(&record(serde_json::json!({"a": 1, "b": 2})), 1);
        assert_eq!(summary, "recorded by the process");
        assert_eq!(details.len(), 1);
    }
}
