//! The REST API, through the real router (see `server`): arbitrary bodies to the POST
//! routes that take input, arbitrary query strings to the GET routes that parse one.
//!
//! Input: a route byte, a byte choosing the credential (bits 0-2: the route's own, or
//! agent, approver, admin, none) and the request aimed at (bits 3-5: the route's own
//! kind, or pending, approved, used, rejected, unknown), then the body (or the query
//! string / path segment for GET routes).
//!
//! Invariants: no panic and no 5xx other than 503; every 4xx is countersign's error
//! shape `{"error": {"code", "message"}}`; every 2xx JSON route answers JSON; a created
//! request carries the digest of exactly the action sent; a decision's proof verifies
//! offline; `/proofs/verify` never calls valid what offline verification refuses; and
//! `/evidence/verify` says what `bundle::verify` says with the server's keys.

use axum::body::Body;
use countersign_core::{Action, Verdict, VerifyOptions, bundle, proof};
use countersign_server::views::{DecisionBody, RequestApprovalInput, VerifyProofInput};
use http::StatusCode;
use serde_json::Value;

use crate::fixtures::{jwks, signer_jwks};
use crate::server::{Kind, check_status, request, server};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Agent,
    Approver,
    Admin,
}

struct Route {
    method: &'static str,
    /// `{id}` is replaced by a request id, `{q}` by the input.
    path: &'static str,
    who: Who,
    kind: Kind,
}

const ROUTES: &[Route] = &[
    Route { method: "POST", path: "/api/v1/requests", who: Who::Agent, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/requests/{id}/decision", who: Who::Approver, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/proofs/verify", who: Who::Agent, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/evidence/verify", who: Who::Agent, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/requests/{id}/actions", who: Who::Agent, kind: Kind::Approved },
    Route { method: "POST", path: "/api/v1/requests/{id}/outcome", who: Who::Agent, kind: Kind::Used },
    Route { method: "POST", path: "/api/v1/requests/{id}/review", who: Who::Agent, kind: Kind::Rejected },
    Route { method: "POST", path: "/api/v1/decisions", who: Who::Agent, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/tokens", who: Who::Admin, kind: Kind::Pending },
    Route { method: "POST", path: "/api/v1/requests/{id}/cancel", who: Who::Agent, kind: Kind::Pending },
    Route { method: "GET", path: "/api/v1/log/proof/inclusion?{q}", who: Who::Agent, kind: Kind::Pending },
    Route { method: "GET", path: "/api/v1/log/proof/consistency?{q}", who: Who::Agent, kind: Kind::Pending },
    Route { method: "GET", path: "/api/v1/log/checkpoint?{q}", who: Who::Agent, kind: Kind::Pending },
    Route { method: "GET", path: "/api/v1/requests?{q}", who: Who::Approver, kind: Kind::Pending },
    Route { method: "GET", path: "/api/v1/evidence/{id}?{q}", who: Who::Agent, kind: Kind::Used },
    Route { method: "GET", path: "/api/v1/log/entries/{q}", who: Who::Agent, kind: Kind::Pending },
];

pub fn run(data: &[u8]) {
    let [route, choice, body @ ..] = data else {
        return;
    };
    let route = &ROUTES[usize::from(*route) % ROUTES.len()];
    let s = server();
    let who = match choice & 7 {
        4 => Some(Who::Agent),
        5 => Some(Who::Approver),
        6 => Some(Who::Admin),
        7 => None,
        _ => Some(route.who),
    };
    let token = who.map(|w| match w {
        Who::Agent => s.agent.as_str(),
        Who::Approver => s.approver.as_str(),
        Who::Admin => s.admin.as_str(),
    });
    let id = match (choice >> 3) & 7 {
        1 => s.id(Kind::Pending),
        2 => s.id(Kind::Approved),
        3 => s.id(Kind::Used),
        4 => s.id(Kind::Rejected),
        5 => "req_0000missing".to_string(),
        _ => s.id(route.kind),
    };
    let mut path = route.path.replace("{id}", &id);
    let get = route.method == "GET";
    if get {
        let Ok(q) = std::str::from_utf8(body) else {
            return;
        };
        path = path.replace("{q}", q);
    }
    let mut builder = request(route.method, &path, token);
    if !get && choice & 0x40 == 0 {
        let content_type = if route.path.ends_with("evidence/verify") {
            "application/zip"
        } else {
            "application/json"
        };
        builder = builder.header(http::header::CONTENT_TYPE, content_type);
    }
    let payload = if get { Body::empty() } else { Body::from(body.to_vec()) };
    // An arbitrary query string or path is often not a valid URI: nothing to send.
    let Ok(req) = builder.body(payload) else {
        return;
    };
    let what = format!("{} {}", route.method, route.path);
    let (status, content_type, response) = s.send(req);
    check_status(&what, status, &response);

    if status.is_client_error() {
        let error: Value = serde_json::from_slice(&response).unwrap_or_else(|e| {
            panic!(
                "{what}: {status} with a body that is not JSON ({e}): {}",
                String::from_utf8_lossy(&response)
            )
        });
        assert!(
            error["error"]["code"].is_string() && error["error"]["message"].is_string(),
            "{what}: {status} is not countersign's error shape: {error}"
        );
    }
    if status.is_success() && content_type.starts_with("application/json") {
        let answer: Value = serde_json::from_slice(&response)
            .unwrap_or_else(|e| panic!("{what}: {status} answered invalid JSON: {e}"));
        check_answer(&what, status, body, &answer);
    }
    if status.is_success() && route.path.ends_with("evidence/verify") {
        let answer: Value = serde_json::from_slice(&response).unwrap();
        let limits = bundle::ReadLimits::upload(body.len());
        let local = bundle::verify_within(body, Some(&signer_jwks()), &limits);
        assert_eq!(
            answer["valid"].as_bool(),
            Some(local.valid),
            "the server and bundle::verify disagree: {answer} vs {local:?}"
        );
        assert_eq!(answer["reasons"], serde_json::json!(local.reasons));
    }
    if status.is_success() {
        s.refresh();
    }
}

fn check_answer(what: &str, status: StatusCode, body: &[u8], answer: &Value) {
    if what.ends_with("/api/v1/requests") && status == StatusCode::CREATED {
        let input: RequestApprovalInput = serde_json::from_slice(body).unwrap();
        let action = Action::new(input.action_description, input.action_details);
        assert_eq!(
            answer["action_digest"].as_str(),
            Some(action.digest().as_str()),
            "the request was created for another action: {answer}"
        );
        assert_eq!(answer["status"], "pending");
    }
    if what.ends_with("/decision") {
        let input: DecisionBody = serde_json::from_slice(body).unwrap();
        let verdict: Verdict = input.decision.parse().unwrap();
        assert_eq!(answer["status"], verdict.as_str(), "{answer}");
        let envelope = serde_json::from_value(answer["proof"].clone()).unwrap();
        let report = proof::verify(&envelope, jwks(), &VerifyOptions::default());
        match verdict {
            Verdict::Approved => assert!(report.valid, "{:?}", report.reasons),
            Verdict::Rejected => assert_eq!(report.reasons.len(), 1, "{:?}", report.reasons),
        }
    }
    if what.ends_with("/proofs/verify") && answer["valid"] == true {
        let input: VerifyProofInput = serde_json::from_slice(body).unwrap();
        let action = input.action().unwrap();
        let envelope = input.proof.into();
        let report = proof::verify(
            &envelope,
            jwks(),
            &VerifyOptions {
                now: None,
                expected_action: action.as_ref(),
                used: None,
            },
        );
        assert!(
            report.valid,
            "the server accepted a proof offline verification refuses: {:?}",
            report.reasons
        );
    }
}
