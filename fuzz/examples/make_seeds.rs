//! Writes the committed seed corpora, `fuzz/corpus/<target>/`, from the fixtures: valid
//! proofs, bundles, checkpoints, log entries and API bodies (deterministic: Ed25519 and
//! the fixtures are, so rerunning changes nothing).
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_seeds`

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_core::bundle::Mode;
use countersign_core::checkpoint::Checkpoint;
use countersign_core::evidence::{DecisionRecordInput, decision_record};
use countersign_core::merkle::leaf_hash;
use countersign_core::{Event, EventKind, Verdict};
use countersign_fuzz::fixtures::{
    ORIGIN, agent, decide, limits, pending, sample_bundle, signer, t0,
};
use serde_json::json;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut seeds: BTreeMap<&str, Vec<(String, Vec<u8>)>> = BTreeMap::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        seeds
            .entry(target)
            .or_default()
            .push((name.to_string(), bytes));
    };
    let prefixed = |prefix: &[u8], rest: &[u8]| [prefix, rest].concat();
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();

    let request = pending("req_1");
    let approved = decide(&request, Verdict::Approved).request;
    let rejected = decide(&request, Verdict::Rejected).request;
    let approval = approved.proof.clone().unwrap();
    let rejection = rejected.proof.clone().unwrap();
    let approval_json = serde_json::to_vec(&approval).unwrap();
    let statement = STANDARD.decode(&approval.payload).unwrap();

    // proof_verify: flags byte, then an envelope (bit 0 clear) or a statement to sign.
    add("proof_verify", "approval", prefixed(&[0x00], &approval_json));
    add("proof_verify", "approval-at-t0", prefixed(&[0x28], &approval_json));
    add("proof_verify", "rejection", prefixed(&[0x08], &serde_json::to_vec(&rejection).unwrap()));
    add("proof_verify", "statement", prefixed(&[0x01], &statement));
    add("proof_verify", "statement-no-keyid", prefixed(&[0x39], &statement));

    // bundle_verify: whole archives.
    let full = sample_bundle(Mode::Full);
    let redacted = sample_bundle(Mode::Redacted);
    add("bundle_verify", "full.zip", full.clone());
    add("bundle_verify", "redacted.zip", redacted.clone());
    add("bundle_verify", "not-a-zip", b"PK\x03\x04 not a zip".to_vec());

    // bundle_mutate: `arbitrary` bytes; the empty input is the untouched bundle.
    add("bundle_mutate", "untouched", Vec::new());
    // Deterministic pseudo-random bytes (xorshift), one stream for every target below.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut random = move |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    };
    for n in 0..6 {
        let bytes = random(16 + n * 24);
        add("bundle_mutate", &format!("random-{n}"), bytes.clone());
        add("merkle", &format!("random-{n}"), bytes.clone());
        add("checkpoint", &format!("signed-{n}"), prefixed(&[0x01], &bytes));
        add("action_digest", &format!("arbitrary-{n}"), prefixed(&[0x01], &bytes));
    }

    // policy_eval: `arbitrary` bytes, long enough for several policies and requests.
    for n in 0..8 {
        add("policy_eval", &format!("random-{n}"), random(200 + n * 100));
    }

    // checkpoint: a note countersign signs, and one with a cosignature.
    let checkpoint = Checkpoint {
        origin: ORIGIN.into(),
        size: 5,
        root: leaf_hash(b"root"),
    };
    let note = checkpoint.sign(&signer());
    add("checkpoint", "note", prefixed(&[0x00], note.as_bytes()));
    let cosigned = format!("{note}\u{2014} witness.example AAAAAAAAAAAAAAAAAAAA\n");
    add("checkpoint", "cosigned", prefixed(&[0x00], cosigned.as_bytes()));

    // log_entry: the entries countersign writes, and a payload opening.
    let created = Event::created(&request).seal([1; 32]);
    let decided = decide(&request, Verdict::Approved).event.seal([2; 32]);
    let token = Event::system(EventKind::TokenCreated, t0(), None, json!({"token_id": "t"}))
        .seal([3; 32]);
    let record = decision_record(
        "dec_1",
        DecisionRecordInput {
            decision: "refund 20 EUR".into(),
            rationale: Some("under the limit".into()),
            model: None,
            authority: BTreeMap::from([("policy".to_string(), "refunds".to_string())]),
            details: BTreeMap::new(),
            related_request: None,
        },
        &agent(),
        t0(),
        limits(),
    )
    .unwrap()
    .seal([4; 32]);
    add("log_entry", "created", created.bytes.clone());
    add("log_entry", "decided", decided.bytes.clone());
    add("log_entry", "token", token.bytes.clone());
    add("log_entry", "decision-record", record.bytes.clone());
    add("log_entry", "opening", serde_json::to_vec(&created.payload.clone().unwrap()).unwrap());

    // action_digest: the published known-answer vectors.
    let vectors: serde_json::Value = serde_json::from_str(include_str!(
        "../../testdata/action-digest.json"
    ))
    .unwrap();
    for (i, v) in vectors["vectors"].as_array().unwrap().iter().enumerate() {
        add("action_digest", &format!("vector-{i}"), prefixed(&[0x00], &json(v["action"].clone())));
    }
    add("action_digest", "digest", format!("\x00sha256:{}", "Ab".repeat(32)).into_bytes());

    // server_inputs: selector, then a body of that type.
    let request_body = json!({
        "action_description": "Deploy v2 to production",
        "action_details": {"service": "api", "version": "2.0.1"},
        "timeout_hours": 1.5,
        "valid_for_seconds": 300,
        "idempotency_key": "deploy-2",
        "recipient_email": "ops@example.com",
        "requested_fields": ["change_ticket"]
    });
    let decision_body = json!({"decision": "approved", "comment": "ok", "fields": {"po_number": "PO-9"}});
    let verify_body = json!({
        "proof": serde_json::to_value(&approval).unwrap(),
        "action_description": request.action.description,
        "action_details": request.action.details,
    });
    let record_body = json!({
        "decision": "refund 20 EUR",
        "rationale": "under the limit",
        "model": {"provider": "acme", "name": "m", "version": "1"},
        "authority": {"policy": "refunds"},
        "details": {"order": "7"}
    });
    add("server_inputs", "request", prefixed(&[0], &json(request_body.clone())));
    add("server_inputs", "decision", prefixed(&[1], &json(decision_body.clone())));
    add("server_inputs", "verify", prefixed(&[2], &json(verify_body.clone())));
    add("server_inputs", "record-decision", prefixed(&[3], &json(record_body.clone())));

    // server_rest: route, credential/target byte, body or query.
    let rest: Vec<(&str, u8, u8, Vec<u8>)> = vec![
        ("create", 0, 0, json(request_body.clone())),
        ("decide", 1, 0, json(decision_body.clone())),
        ("reject", 1, 0, json(json!({"decision": "reject", "comment": "no"}))),
        ("verify-proof", 2, 0, json(verify_body.clone())),
        ("verify-evidence", 3, 0, redacted.clone()),
        ("action", 4, 0, json(json!({"tool": "pay", "details": {"ref": "1"}}))),
        ("outcome", 5, 0, json(json!({"status": "succeeded", "summary": "paid"}))),
        ("review", 6, 0, json(json!({"verdict": "flagged", "notes": "late"}))),
        ("record-decision", 7, 0, json(record_body.clone())),
        ("token", 8, 0, json(json!({"name": "ci", "role": "agent"}))),
        ("cancel", 9, 0, Vec::new()),
        ("inclusion", 10, 0, b"index=0&tree_size=1".to_vec()),
        ("consistency", 11, 0, b"first=1&second=2".to_vec()),
        ("checkpoint", 12, 0, b"size=1".to_vec()),
        ("list", 13, 0, b"status=pending&limit=5".to_vec()),
        ("evidence", 14, 0, b"mode=full".to_vec()),
        ("entry", 15, 0, b"0".to_vec()),
    ];
    for (name, route, choice, body) in rest {
        add("server_rest", name, prefixed(&[route, choice], &body));
    }

    // server_mcp: credential/header byte, then JSON-RPC.
    let call = |name: &str, args: serde_json::Value| {
        json(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": name, "arguments": args}}))
    };
    let mcp: Vec<(&str, u8, Vec<u8>)> = vec![
        ("initialize", 0, json(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "fuzz", "version": "1"}}}))),
        ("list", 2, json(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))),
        ("ping", 0, json(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))),
        ("notification", 0, json(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))),
        ("request", 0, call("request_approval", request_body.clone())),
        ("check", 0, call("check_approval", json!({"request_id": "REQ_A"}))),
        ("wait", 0, call("wait_for_approval", json!({"request_id": "REQ_R", "timeout_seconds": 1}))),
        ("verify", 0, call("verify_proof", verify_body.clone())),
        ("action", 0, call("record_action", json!({"request_id": "REQ_A", "tool": "pay"}))),
        ("cancel", 0, call("cancel_approval", json!({"request_id": "REQ_P"}))),
        ("outcome", 0, call("record_outcome", json!({"request_id": "REQ_U", "status": "failed"}))),
        ("record", 0, call("record_decision", record_body.clone())),
        ("evidence", 0, call("get_evidence", json!({"id": "REQ_U", "mode": "full"}))),
        ("verify-evidence", 0, call("verify_evidence", json!({"bundle_base64": STANDARD.encode(&redacted)}))),
        ("review", 0, call("record_review", json!({"request_id": "REQ_R", "verdict": "accepted"}))),
        ("pending", 2, call("list_pending_approvals", json!({"limit": 3}))),
        ("approve", 2, call("approve", json!({"request_id": "REQ_P", "fields": {"po_number": "1"}}))),
        ("reject", 2, call("reject", json!({"request_id": "REQ_P", "comment": "no"}))),
        ("batch", 0, json(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))),
    ];
    for (name, choice, body) in mcp {
        add("server_mcp", name, prefixed(&[choice], &body));
    }

    for (target, files) in seeds {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        println!("{target}: seeds written to {}", dir.display());
    }
}
