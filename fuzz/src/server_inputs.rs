//! The server's input types (`RequestApprovalInput`, `DecisionBody`, `VerifyProofInput`,
//! `RecordDecisionInput`) parsed from arbitrary JSON and driven through the core
//! exactly as the gate does, in process and without a database: fast, so the fuzzer
//! explores what the inputs can make countersign write.
//!
//! Input: a selector byte, then the JSON body.
//!
//! Invariants, for anything the core accepts: every event it emits seals to a log
//! entry in canonical form that round-trips (`log_entry::check_entry`), whose payload
//! opening opens its commitment; the request survives a JSON round trip (the stores
//! keep it as JSON); an approval's proof verifies for its action until `valid_until`
//! and not after; a rejection's proof says not approved and nothing else; the action
//! digest checks hold (`action_digest::check_action`).

use std::collections::BTreeMap;

use countersign_core::evidence::decision_record;
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, ProblemCode, Transition, Verdict,
    VerifyOptions, proof,
};
use countersign_server::views::{
    DecisionBody, RecordDecisionInput, RequestApprovalInput, VerifyProofInput,
};

use crate::fixtures::{agent, approver, jwks, limits, pending, signer, t0};

pub fn run(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => {
            if let Ok(input) = serde_json::from_slice::<RequestApprovalInput>(body) {
                request_approval(input);
            }
        }
        1 => {
            if let Ok(input) = serde_json::from_slice::<DecisionBody>(body) {
                decision(input);
            }
        }
        2 => {
            if let Ok(input) = serde_json::from_slice::<VerifyProofInput>(body) {
                verify_proof(input);
            }
        }
        _ => {
            if let Ok(input) = serde_json::from_slice::<RecordDecisionInput>(body) {
                if let Ok(event) =
                    decision_record("dec_1", input.into(), &agent(), t0(), limits())
                {
                    check_event(&event);
                }
            }
        }
    }
}

fn check_event(event: &Event) {
    let sealed = event.seal([5; 32]);
    crate::log_entry::check_entry(&sealed.entry);
    let parsed: countersign_core::LogEntry = serde_json::from_slice(&sealed.bytes).unwrap();
    assert_eq!(parsed, sealed.entry, "a sealed entry does not parse to itself");
    assert_eq!(parsed.to_bytes(), sealed.bytes);
    if let Some(opening) = &sealed.payload {
        assert_eq!(opening.commitment(), sealed.entry.payload);
    }
}

fn check_transition(t: &Transition) {
    check_event(&t.event);
    let json = serde_json::to_vec(&t.request).unwrap();
    let back: ApprovalRequest = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("a stored request does not read back: {e}"));
    assert_eq!(back, t.request, "a request does not survive its JSON");
}

fn request_approval(input: RequestApprovalInput) {
    let Ok(created) =
        ApprovalRequest::create("req_f".into(), input.into(), &agent(), t0(), limits())
    else {
        return;
    };
    check_transition(&created);
    let request = created.request;
    crate::action_digest::check_action(&request.action);
    assert!(request.expires_at > t0());

    // Approve it with every requested field filled in; the proof must verify.
    let fields: BTreeMap<String, String> = request
        .requested_fields
        .iter()
        .map(|f| (f.clone(), "x".to_string()))
        .collect();
    let decided = request
        .decide(
            Verdict::Approved,
            DecisionInput {
                comment: None,
                fields,
            },
            &approver(),
            Channel::Api,
            t0(),
            "bm9uY2U".into(),
            &signer(),
            limits(),
        )
        .unwrap_or_else(|e| panic!("an accepted request could not be approved: {e}"));
    check_transition(&decided);
    check_proof(&decided.request, Verdict::Approved);
    let used = decided
        .request
        .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), limits())
        .unwrap_or_else(|e| panic!("a fresh approval could not be used: {e}"));
    check_transition(&used);
}

fn decision(body: DecisionBody) {
    let Ok(verdict) = body.decision.parse::<Verdict>() else {
        return;
    };
    let Ok(decided) = pending("req_1").decide(
        verdict,
        DecisionInput {
            comment: body.comment,
            fields: body.fields,
        },
        &approver(),
        Channel::Api,
        t0(),
        "bm9uY2U".into(),
        &signer(),
        limits(),
    ) else {
        return;
    };
    check_transition(&decided);
    check_proof(&decided.request, verdict);
}

fn check_proof(request: &ApprovalRequest, verdict: Verdict) {
    let envelope = request.proof.as_ref().expect("a decision without a proof");
    let decision = request.decision.as_ref().unwrap();
    let at = |now| VerifyOptions {
        now: Some(now),
        expected_action: Some(&request.action),
        used: None,
    };
    let report = proof::verify(envelope, jwks(), &at(decision.decided_at));
    let codes: Vec<ProblemCode> = report.reasons.iter().map(|r| r.code).collect();
    match verdict {
        Verdict::Approved => assert!(report.valid, "a fresh approval does not verify: {codes:?}"),
        Verdict::Rejected => assert_eq!(codes, vec![ProblemCode::NotApproved]),
    }
    let statement = report.statement.expect("no statement");
    assert_eq!(statement.request_id, request.id);
    assert_eq!(&statement.fields, &decision.fields);
    assert_eq!(statement.comment, decision.comment);
    let late = proof::verify(envelope, jwks(), &at(decision.valid_until));
    assert!(late.reasons.iter().any(|r| r.code == ProblemCode::Expired));
}

fn verify_proof(input: VerifyProofInput) {
    let action = input.action();
    assert_eq!(
        action.is_err(),
        input.action_description.is_none() && input.action_details.is_some()
    );
    let envelope = input.proof.into();
    let report = proof::verify(
        &envelope,
        jwks(),
        &VerifyOptions {
            now: Some(t0()),
            expected_action: action.ok().flatten().as_ref(),
            used: None,
        },
    );
    assert_eq!(report.valid, report.reasons.is_empty());
}
