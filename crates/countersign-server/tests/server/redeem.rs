//! Redemption, from outside: an executor redeems a proof for its exact action once; a
//! second redemption, another action, an expired, rejected, forged or unknown proof are
//! refused with the reason; `record_action` and redemption are one use whichever comes
//! first, also when both race; `verify_proof` says whether it checked the action.

use std::sync::Arc;

use countersign_core::proof::Statement;
use countersign_core::{Envelope, FixedClock, Timestamp};
use serde_json::{Value, json};

use crate::support::{TestServer, err, ok, start, start_clocked};

const ACTION: &str = "Pay invoice INV-7";

fn details() -> Value {
    json!({"amount": "120.00", "currency": "EUR"})
}

/// A request by the agent, approved by the approver; its id and proof.
async fn approved(server: &TestServer) -> (String, Value) {
    let id = server
        .create(
            &server.agent,
            json!({"action_description": ACTION, "action_details": details()}),
        )
        .await;
    let (status, body) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 200, "{body}");
    (id, body["proof"].clone())
}

async fn redeem(server: &TestServer, token: &str, proof: &Value, details: Value) -> (u16, Value) {
    server
        .post(
            "/api/v1/proofs/redeem",
            token,
            json!({"proof": proof, "action_description": ACTION, "action_details": details}),
        )
        .await
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_redeems_a_proof_once_for_exactly_its_action() {
    let server = start().await;
    let (id, proof) = approved(&server).await;

    // Another action (a changed amount) is refused, and consumes nothing.
    let (status, body) = redeem(
        &server,
        &server.executor,
        &proof,
        json!({"amount": "12000.00", "currency": "EUR"}),
    )
    .await;
    assert_eq!((status, code(&body)), (409, "action_mismatch"), "{body}");

    let (status, body) = redeem(&server, &server.executor, &proof, details()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["redeemed"], true);
    assert_eq!(body["request_id"], id.as_str());
    assert_eq!(body["redeemed_by"], "token:payments");
    assert_eq!(body["approvers"][0]["id"], "token:alice");

    // A second redemption, by the same executor or another way in, is refused.
    let (status, body) = redeem(&server, &server.executor, &proof, details()).await;
    assert_eq!((status, code(&body)), (409, "already_used"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("redeemed by token:payments"),
        "{body}"
    );
    let mcp = server.mcp(&server.executor).await;
    let again = err(&mcp
        .call(
            "redeem_proof",
            json!({"proof": proof, "action_description": ACTION, "action_details": details()}),
        )
        .await);
    assert!(again.starts_with("already_used:"), "{again}");

    // The requester can no longer act under it either, and the request says it is used.
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            &server.agent,
            json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "already_used"), "{body}");
    let (_, request) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(request["used"]["tool"], "redeemed by token:payments");
    // The requester still records what came of it.
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/outcome"),
            &server.agent,
            json!({"status": "succeeded"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Logged, as the executor, between the decision and the outcome.
    let kinds = server.event_kinds().await;
    let tail: Vec<&str> = kinds
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        ["request_decided", "proof_redeemed", "outcome_recorded"]
    );
    let events = server.gate.store().events_of_subject(&id).await.unwrap();
    let redeemed = events
        .iter()
        .find(|e| e.entry.kind.as_str() == "proof_redeemed")
        .unwrap();
    assert_eq!(redeemed.entry.actor.as_deref(), Some("token:payments"));
    assert_eq!(redeemed.entry.data["version"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_forged_unknown_and_unbound_proofs_are_refused_with_the_reason() {
    let server = start().await;
    let id = server.create_default().await;
    let (_, rejected) = server.decide(&server.approver, &id, "rejected").await;
    let (status, body) = redeem(&server, &server.executor, &rejected["proof"], details()).await;
    assert_eq!((status, code(&body)), (409, "not_approved"), "{body}");

    // A proof whose payload was changed no longer carries this server's signature.
    let (_, proof) = approved(&server).await;
    let mut forged = proof.clone();
    let envelope: Envelope = serde_json::from_value(proof.clone()).unwrap();
    let mut statement: Statement = envelope.unverified_statement().unwrap();
    statement
        .action
        .details
        .insert("amount".into(), "9.99".into());
    forged["payload"] = json!(base64_of(&serde_json::to_vec(&statement).unwrap()));
    let (status, body) = redeem(&server, &server.executor, &forged, details()).await;
    assert_eq!((status, code(&body)), (400, "invalid_proof"), "{body}");

    // Signed by this server's key, but for a request it does not have.
    let mut elsewhere: Statement = envelope.unverified_statement().unwrap();
    elsewhere.request_id = "req_0000000000000000000000000000dead".into();
    let unknown = Envelope::sign_statement(&elsewhere, &server.gate.keys().signer());
    let (status, body) = redeem(
        &server,
        &server.executor,
        &serde_json::to_value(&unknown).unwrap(),
        details(),
    )
    .await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    // Not a proof at all.
    let (status, body) = redeem(
        &server,
        &server.executor,
        &json!({"payloadType": "x", "payload": "", "signatures": []}),
        details(),
    )
    .await;
    assert_eq!((status, code(&body)), (400, "invalid_proof"), "{body}");

    // The action is required: a redemption cannot be unbound.
    let (status, body) = server
        .post(
            "/api/v1/proofs/redeem",
            &server.executor,
            json!({"proof": proof}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("action_description"), "{body}");

    // The genuine proof still redeems: refusals consume nothing.
    let (status, body) = redeem(&server, &server.executor, &proof, details()).await;
    assert_eq!(status, 200, "{body}");
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_is_not_redeemed() {
    let clock = Arc::new(FixedClock::new(
        Timestamp::parse("2026-11-29T09:00:00Z").unwrap(),
    ));
    let server = start_clocked(clock.clone()).await;
    let (_, proof) = approved(&server).await;
    // Valid for 15 minutes by default; one second past them it is gone.
    clock.advance_seconds(15 * 60);
    let (status, body) = redeem(&server, &server.executor, &proof, details()).await;
    assert_eq!((status, code(&body)), (409, "approval_expired"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redemption_after_record_action_is_refused() {
    let server = start().await;
    let (id, proof) = approved(&server).await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            &server.agent,
            json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = redeem(&server, &server.executor, &proof, details()).await;
    assert_eq!((status, code(&body)), (409, "already_used"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bank.transfer"),
        "{body}"
    );
}

/// `record_action` and a redemption sent at the same moment: exactly one wins, every
/// time, and the other is told the approval is already used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_action_and_redemption_racing_use_the_approval_once() {
    let server = Arc::new(start().await);
    let (mut recorded, mut redeemed) = (0, 0);
    for _ in 0..20 {
        let (id, proof) = approved(&server).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let act = {
            let (server, barrier, id) = (server.clone(), barrier.clone(), id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                server
                    .post(
                        &format!("/api/v1/requests/{id}/actions"),
                        &server.agent,
                        json!({"tool": "bank.transfer"}),
                    )
                    .await
            })
        };
        let use_proof = {
            let (server, barrier) = (server.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                redeem(&server, &server.executor, &proof, details()).await
            })
        };
        let (a, r) = (act.await.unwrap(), use_proof.await.unwrap());
        let won: Vec<bool> = [&a, &r].iter().map(|(status, _)| *status == 200).collect();
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "exactly one use: {a:?} {r:?}"
        );
        let (_, loser) = if won[0] { &r } else { &a };
        assert_eq!(code(loser), "already_used", "{loser}");
        if won[0] {
            recorded += 1;
        } else {
            redeemed += 1;
        }
        let events = server.gate.store().events_of_subject(&id).await.unwrap();
        let uses = events
            .iter()
            .filter(|e| matches!(e.entry.kind.as_str(), "action_recorded" | "proof_redeemed"))
            .count();
        assert_eq!(uses, 1, "one use logged");
    }
    eprintln!("races: record_action won {recorded}, redemption won {redeemed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_proof_says_whether_it_checked_the_action() {
    let server = start().await;
    let (_, proof) = approved(&server).await;
    let (status, unbound) = server
        .post(
            "/api/v1/proofs/verify",
            &server.executor,
            json!({"proof": proof}),
        )
        .await;
    assert_eq!(status, 200, "{unbound}");
    assert_eq!(unbound["valid"], true);
    assert_eq!(unbound["bound"], false);
    assert!(
        unbound["warning"]
            .as_str()
            .unwrap()
            .contains("the action was not checked"),
        "{unbound}"
    );
    let (_, bound) = server
        .post(
            "/api/v1/proofs/verify",
            &server.agent,
            json!({"proof": proof, "action_description": ACTION, "action_details": details()}),
        )
        .await;
    assert_eq!(
        (bound["valid"].clone(), bound["bound"].clone()),
        (json!(true), json!(true))
    );
    assert!(bound["warning"].is_null(), "{bound}");
    let (_, other) = server
        .post(
            "/api/v1/proofs/verify",
            &server.agent,
            json!({"proof": proof, "action_description": "Pay invoice INV-8"}),
        )
        .await;
    assert_eq!(other["valid"], false);
    assert_eq!(other["bound"], true);
    assert_eq!(other["reasons"][0]["code"], "action_mismatch");

    // Over MCP the same, and once redeemed, verification says it is used.
    let mcp = server.mcp(&server.executor).await;
    let report = ok(&mcp.call("verify_proof", json!({"proof": proof})).await);
    assert_eq!(report["bound"], false);
    assert!(report["warning"].is_string());
    let redeemed = ok(&mcp
        .call(
            "redeem_proof",
            json!({"proof": proof, "action_description": ACTION, "action_details": details()}),
        )
        .await);
    assert_eq!(redeemed["redeemed"], true);
    let report = ok(&mcp.call("verify_proof", json!({"proof": proof})).await);
    assert_eq!(report["valid"], false);
    assert_eq!(report["reasons"][0]["code"], "already_used");
}
