//! Fixtures shared by the unit tests.

use std::collections::BTreeMap;

use crate::{
    ApprovalRequest, Channel, DecisionInput, Limits, NewRequest, Principal, Role, Signer,
    Timestamp, Transition, Verdict,
};

pub fn t0() -> Timestamp {
    Timestamp::parse("2026-11-29T12:00:00Z").unwrap()
}

pub fn agent() -> Principal {
    Principal::from_token("deploy-bot", Role::Agent)
}

pub fn approver() -> Principal {
    Principal::from_token("alice", Role::Approver)
}

pub fn signer() -> Signer {
    Signer::from_seed([42; 32])
}

pub fn new_request() -> NewRequest {
    NewRequest {
        description: "Transfer GBP 12,450 to Globex Corp".into(),
        details: BTreeMap::from([
            ("amount".to_string(), "12450".to_string()),
            ("currency".to_string(), "GBP".to_string()),
        ]),
        timeout_seconds: Some(3600),
        valid_for_seconds: Some(600),
        ..NewRequest::default()
    }
}

pub fn pending() -> ApprovalRequest {
    ApprovalRequest::create(
        "req_1".into(),
        new_request(),
        &agent(),
        t0(),
        &Limits::default(),
    )
    .unwrap()
    .request
}

pub fn decide(request: &ApprovalRequest, verdict: Verdict, at: Timestamp) -> Transition {
    request
        .decide(
            verdict,
            DecisionInput {
                comment: Some("ok".into()),
                fields: BTreeMap::from([("po_number".to_string(), "PO-7".to_string())]),
            },
            &approver(),
            Channel::Api,
            at,
            "bm9uY2U".into(),
            &signer(),
            &Limits::default(),
        )
        .unwrap()
}
