//! First decision wins, at scale: 10,000 distinct pending requests, each approved by one
//! approver and rejected by another at the same moment. Every request must end with
//! exactly one decision (the one whose caller was told it won), exactly one
//! `request_decided` entry in the log, a loser told `already_decided` naming the winner,
//! and a log that recomputes to every signed checkpoint.
//!
//! Most pairs race through `Gate::decide` (what every way in calls): half as two tasks
//! spawned side by side, so the two run on different worker threads, and half as two
//! futures joined in one task, so both reads land before either write and the pair meets
//! in the store's compare-and-swap, usually inside one group-commit batch. A sample races
//! over REST on loopback, two HTTP requests at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use countersign_core::logcheck::verify_log;
use countersign_core::{
    Channel, CoreError, DecisionInput, EventKind, NewRequest, Principal, Role, Status, Verdict,
};
use countersign_server::{Decider, Gate, GateError};
use countersign_store::RequestQuery;
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::json;

use crate::support::{TestServer, start};

const REQUESTS: usize = 10_000;
/// How many of them race over REST instead of through the gate directly.
const OVER_REST: usize = 1_000;
/// Pairs in flight at once.
const IN_FLIGHT: usize = 256;

/// What one side of a race was told.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Told {
    /// Won: the request as decided.
    Won {
        status: String,
        approver: String,
    },
    /// Lost: `already_decided`, with the status and decider the error named.
    Lost {
        status: String,
        decided_by: String,
    },
    Other(String),
}

fn alice() -> Principal {
    Principal::from_token("alice", Role::Approver)
}

fn bob() -> Principal {
    Principal::from_token("bob", Role::Approver)
}

async fn decide_via_gate(gate: Arc<Gate>, who: Principal, id: String, verdict: Verdict) -> Told {
    let decider = Decider::new(who).unwrap();
    match gate
        .decide(
            &decider,
            &id,
            verdict,
            DecisionInput::default(),
            Channel::Api,
        )
        .await
    {
        Ok(request) => Told::Won {
            status: request.status.to_string(),
            approver: request.decision.unwrap().approvers[0].id.clone(),
        },
        Err(GateError::Core(CoreError::AlreadyDecided {
            status, decided_by, ..
        })) => Told::Lost {
            status: status.to_string(),
            decided_by: decided_by.unwrap_or_default(),
        },
        Err(other) => Told::Other(format!("{}: {other}", other.code())),
    }
}

async fn decide_via_rest(server: &TestServer, token: String, id: String, decision: &str) -> Told {
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            &token,
            json!({"decision": decision}),
        )
        .await;
    match status {
        200 => Told::Won {
            status: body["status"].as_str().unwrap_or_default().to_string(),
            approver: body["decision"]["approvers"][0]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        },
        409 if body["error"]["code"] == "already_decided" => {
            // "request req_... is already approved (by alice via api at ...)"
            let message = body["error"]["message"].as_str().unwrap_or_default();
            let status = message
                .split(" is already ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_default()
                .to_string();
            let decided_by = message
                .split("(by ")
                .nth(1)
                .and_then(|rest| rest.split(" at ").next())
                .unwrap_or_default()
                .to_string();
            Told::Lost { status, decided_by }
        }
        other => Told::Other(format!("HTTP {other}: {body}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_concurrent_approve_reject_pairs_each_have_exactly_one_winner() {
    let server = Arc::new(start().await);
    let gate = server.gate.clone();
    let agent = Principal::from_token("deploy-bot", Role::Agent);

    let started = Instant::now();
    let ids: Vec<String> = stream::iter(0..REQUESTS)
        .map(|n| {
            let gate = gate.clone();
            let agent = agent.clone();
            async move {
                let new = NewRequest {
                    description: format!("Pay invoice INV-{n}"),
                    details: BTreeMap::from([("amount".to_string(), format!("{n}.00"))]),
                    ..NewRequest::default()
                };
                gate.request_approval(&agent, new).await.unwrap().request.id
            }
        })
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    let created_in = started.elapsed();

    let started = Instant::now();
    let outcomes: Vec<(Told, Told)> = stream::iter(ids.iter().cloned().enumerate())
        .map(|(n, id)| {
            let gate = gate.clone();
            let server = server.clone();
            async move {
                // Alternate who is asked first, so neither side wins by construction.
                let (approve_first, how) = (n % 2 == 0, n % 3);
                let approve =
                    |id: String| decide_via_gate(gate.clone(), alice(), id, Verdict::Approved);
                let reject =
                    |id: String| decide_via_gate(gate.clone(), bob(), id, Verdict::Rejected);
                if n < OVER_REST {
                    let a =
                        decide_via_rest(&server, server.approver.clone(), id.clone(), "approved");
                    let r = decide_via_rest(&server, server.approver2.clone(), id, "rejected");
                    if approve_first {
                        tokio::join!(a, r)
                    } else {
                        let (r, a) = tokio::join!(r, a);
                        (a, r)
                    }
                } else if how == 0 {
                    let (a, r) = tokio::join!(approve(id.clone()), reject(id));
                    (a, r)
                } else {
                    let (a, r) = if approve_first {
                        let a = tokio::spawn(approve(id.clone()));
                        (a, tokio::spawn(reject(id)))
                    } else {
                        let r = tokio::spawn(reject(id.clone()));
                        (tokio::spawn(approve(id)), r)
                    };
                    (a.await.unwrap(), r.await.unwrap())
                }
            }
        })
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    let decided_in = started.elapsed();

    // Every pair: exactly one winner, the other told `already_decided` naming it.
    let mut winners: HashMap<&str, (String, String)> = HashMap::new();
    let (mut approvals, mut rejections) = (0, 0);
    for (id, (a, r)) in ids.iter().zip(&outcomes) {
        let (won, lost) = match (a, r) {
            (Told::Won { .. }, Told::Lost { .. }) => (a, r),
            (Told::Lost { .. }, Told::Won { .. }) => (r, a),
            _ => panic!("{id}: not exactly one winner: approve got {a:?}, reject got {r:?}"),
        };
        let (
            Told::Won { status, approver },
            Told::Lost {
                status: lost_status,
                decided_by,
            },
        ) = (won, lost)
        else {
            unreachable!()
        };
        let (expected_status, name) = match approver.as_str() {
            "token:alice" => (Status::Approved, "alice"),
            "token:bob" => (Status::Rejected, "bob"),
            other => panic!("{id}: decided by {other}"),
        };
        if expected_status == Status::Approved {
            approvals += 1;
        } else {
            rejections += 1;
        }
        assert_eq!(status, &expected_status.to_string(), "{id}");
        assert_eq!(
            lost_status, status,
            "{id}: the loser is told the real outcome"
        );
        assert_eq!(
            decided_by,
            &format!("{name} via api"),
            "{id}: the loser is told who won"
        );
        winners.insert(id, (status.clone(), approver.clone()));
    }

    // The store holds exactly the winning decisions.
    let stored = gate
        .store()
        .list_requests(&RequestQuery {
            status: None,
            requested_by: None,
            limit: REQUESTS * 2,
        })
        .await
        .unwrap();
    assert_eq!(stored.len(), REQUESTS);
    for request in &stored {
        let (status, approver) = &winners[request.id.as_str()];
        assert_eq!(&request.status.to_string(), status, "{}", request.id);
        let decision = request.decision.as_ref().unwrap();
        assert_eq!(decision.approvers.len(), 1, "{}", request.id);
        assert_eq!(&decision.approvers[0].id, approver, "{}", request.id);
        assert!(request.proof.is_some(), "{}", request.id);
    }

    // Exactly one `request_decided` entry per request, naming the winner.
    let mut entries = Vec::new();
    let mut decided: HashMap<String, Vec<String>> = HashMap::new();
    let mut after = 0;
    loop {
        let page = gate.store().events_after(after, 10_000).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        for event in page {
            if event.entry.kind == EventKind::RequestDecided {
                decided
                    .entry(event.entry.subject.clone().unwrap())
                    .or_default()
                    .push(event.entry.actor.clone().unwrap_or_default());
            }
            entries.push(event.bytes);
        }
    }
    assert_eq!(decided.len(), REQUESTS);
    for (id, actors) in &decided {
        assert_eq!(
            actors.len(),
            1,
            "{id} has {} decisions: {actors:?}",
            actors.len()
        );
        assert_eq!(actors[0], winners[id.as_str()].1, "{id}");
    }

    // The log recomputes to the newest checkpoint (covering every entry) and to every
    // earlier one.
    let newest = gate.log().integrate().await.unwrap().unwrap();
    assert_eq!(newest.size, entries.len() as u64);
    let notes: Vec<String> = gate
        .store()
        .checkpoints()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.note)
        .collect();
    assert!(notes.contains(&newest.note));
    let report = verify_log(
        entries.iter().map(Vec::as_slice),
        &notes,
        &gate.jwks().await.unwrap(),
        gate.log().origin(),
    );
    assert!(report.valid(), "{:?}", report.problems);
    assert_eq!(
        report.roots.get(&newest.size),
        Some(&newest_root(&newest.note))
    );

    eprintln!(
        "races: {REQUESTS} requests created in {created_in:.2?}; {REQUESTS} approve/reject pairs \
         ({OVER_REST} over REST) decided in {decided_in:.2?}: {approvals} approvals won, \
         {rejections} rejections won, {} log entries, {} checkpoints verified",
        entries.len(),
        notes.len()
    );
}

/// The root a signed checkpoint note states.
fn newest_root(note: &str) -> countersign_core::merkle::Hash {
    countersign_core::checkpoint::Checkpoint::parse(note)
        .unwrap()
        .0
        .root
}
