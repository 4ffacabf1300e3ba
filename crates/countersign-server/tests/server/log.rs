//! The transparency log and evidence bundles, over REST and MCP.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_core::bundle;
use countersign_core::checkpoint::Checkpoint;
use countersign_core::merkle;
use countersign_core::{Jwks, Principal, Role};
use countersign_server::{HttpConfig, Settings};
use serde_json::{Value, json};

use crate::support::{TestServer, err, ok, start, start_full};

async fn checkpoint_note(server: &TestServer) -> String {
    server
        .http
        .get(server.url("/api/v1/log/checkpoint"))
        .bearer_auth(&server.agent)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn jwks(server: &TestServer) -> Jwks {
    server
        .http
        .get(server.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until a checkpoint covers every event written so far.
async fn settled(server: &TestServer) -> Checkpoint {
    let target = server.gate.store().last_event_seq().await.unwrap();
    let started = Instant::now();
    loop {
        let note = checkpoint_note(server).await;
        if let Ok((c, _)) = Checkpoint::parse(&note)
            && c.size >= target
        {
            return Checkpoint::verify(&note, &jwks(server).await, None).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no checkpoint of size {target}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_make_one_log_that_verifies_entry_by_entry() {
    let server = start().await;
    let early = {
        server.create_default().await;
        settled(&server).await
    };
    let mut tasks = Vec::new();
    for i in 0..40 {
        let http = server.http.clone();
        let base = server.base.clone();
        let (agent, approver) = (server.agent.clone(), server.approver.clone());
        tasks.push(tokio::spawn(async move {
            let created: Value = http
                .post(format!("{base}/api/v1/requests"))
                .bearer_auth(&agent)
                .json(&json!({"action_description": format!("job {i}")}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = created["request_id"].as_str().unwrap().to_string();
            let decision = if i % 2 == 0 { "approved" } else { "rejected" };
            let resp = http
                .post(format!("{base}/api/v1/requests/{id}/decision"))
                .bearer_auth(&approver)
                .json(&json!({"decision": decision}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let checkpoint = settled(&server).await;
    let keys = jwks(&server).await;
    assert_eq!(checkpoint.origin, "countersign/test");

    // Every entry, fetched one by one (by an approver, who reads them all), hashes into
    // the signed root, and each has an inclusion proof that verifies.
    let mut entries = Vec::new();
    for index in 0..checkpoint.size {
        let (status, body) = server
            .get(&format!("/api/v1/log/entries/{index}"), &server.approver)
            .await;
        assert_eq!(status, 200, "{body}");
        let bytes = STANDARD
            .decode(body["entry_base64"].as_str().unwrap())
            .unwrap();
        let (status, proof) = server
            .get(
                &format!(
                    "/api/v1/log/proof/inclusion?index={index}&tree_size={}",
                    checkpoint.size
                ),
                &server.agent,
            )
            .await;
        assert_eq!(status, 200, "{proof}");
        let proof: bundle::InclusionProof = serde_json::from_value(proof).unwrap();
        let (leaf, path) = proof.decode().unwrap();
        assert_eq!(leaf, merkle::leaf_hash(&bytes));
        merkle::verify_inclusion(index, checkpoint.size, &leaf, &path, &checkpoint.root).unwrap();
        entries.push(bytes);
    }
    let report = countersign_core::logcheck::verify_log(
        entries.iter().map(Vec::as_slice),
        &[checkpoint_note(&server).await],
        &keys,
        "countersign/test",
    );
    assert!(report.valid(), "{:?}", report.problems);
    let kinds: Vec<String> = entries
        .iter()
        .map(|b| {
            serde_json::from_slice::<Value>(b).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "request_created").count(), 41);
    assert_eq!(kinds.iter().filter(|k| *k == "request_decided").count(), 40);

    // Append-only: the early checkpoint is a prefix of the latest.
    let (status, body) = server
        .get(
            &format!(
                "/api/v1/log/proof/consistency?first={}&second={}",
                early.size, checkpoint.size
            ),
            &server.agent,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let path: Vec<merkle::Hash> = body["path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| bundle::decode_hash(h.as_str().unwrap()).unwrap())
        .collect();
    merkle::verify_consistency(
        early.size,
        checkpoint.size,
        &early.root,
        &checkpoint.root,
        &path,
    )
    .unwrap();

    // Bad proof requests are refused with a reason.
    let (status, _) = server
        .get(
            &format!("/api/v1/log/proof/inclusion?index={}", checkpoint.size + 5),
            &server.agent,
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .get(
            "/api/v1/log/proof/consistency?first=0&second=3",
            &server.agent,
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .get("/api/v1/log/entries/999999", &server.agent)
        .await;
    assert_eq!(status, 404);
    // Found by the server_rest fuzz target (fuzz/corpus/server_rest/
    // regression-log-index-not-a-number): an index that is not a number was answered
    // with axum's plain-text rejection, not countersign's error shape.
    for bad in ["mode=full", "-1", "18446744073709551616", "%FF"] {
        let (status, body) = server
            .get(&format!("/api/v1/log/entries/{bad}"), &server.agent)
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_input", "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{bad}: {body}"
        );
    }
    let (status, body) = server.get("/api/v1/requests/%FF/wait", &server.agent).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_input", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_bundles_verify_offline_and_export_the_same_bytes() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let created = ok(&agent.call("request_approval", json!({"action_description": "Pay invoice INV-9", "action_details": {"amount": "900.00"}})).await);
    let id = created["request_id"].as_str().unwrap().to_string();
    server.decide(&server.approver, &id, "approved").await;
    ok(&agent.call("record_action", json!({"request_id": id, "tool": "bank.transfer", "details": {"tool": "not the canonical tool"}})).await);
    let done = ok(&agent.call("record_outcome", json!({"request_id": id, "status": "succeeded", "summary": "paid", "details": {"tx": "T-1"}})).await);
    assert_eq!(done["outcome"]["status"], "succeeded");
    let again = err(&agent
        .call(
            "record_outcome",
            json!({"request_id": id, "status": "failed"}),
        )
        .await);
    assert!(again.contains("once"), "{again}");

    let first = ok(&agent.call("get_evidence", json!({"id": id})).await);
    let second = ok(&agent.call("get_evidence", json!({"id": id})).await);
    assert_eq!(first["sha256"], second["sha256"], "deterministic export");
    let zip = STANDARD
        .decode(first["bundle_base64"].as_str().unwrap())
        .unwrap();
    let report = bundle::verify(&zip, Some(&jwks(&server).await));
    assert!(report.valid, "{:?}", report.reasons);
    assert_eq!(
        report.events,
        vec![
            "request_created",
            "request_decided",
            "action_recorded",
            "outcome_recorded"
        ]
    );
    assert_eq!(report.decisions, 1);
    assert!(
        !String::from_utf8_lossy(&zip).contains("INV-9\\\""),
        "redacted entries hide the action text"
    );

    // The canonical tool name stays canonical: free-form details cannot overwrite it.
    let files = unzip(&zip);
    let action_entry: Value = files
        .iter()
        .filter(|(p, _)| p.starts_with("entries/"))
        .map(|(_, b)| serde_json::from_slice::<Value>(b).unwrap())
        .find(|e| e["type"] == "action_recorded")
        .unwrap();
    assert_eq!(action_entry["data"]["tool"], "bank.transfer");

    let verdict = ok(&agent
        .call(
            "verify_evidence",
            json!({"bundle_base64": first["bundle_base64"]}),
        )
        .await);
    assert_eq!(verdict["valid"], true, "{verdict}");
    let mut tampered = zip.clone();
    let at = tampered.len() / 2;
    tampered[at] ^= 0x20;
    let verdict = ok(&agent
        .call(
            "verify_evidence",
            json!({"bundle_base64": STANDARD.encode(&tampered)}),
        )
        .await);
    assert_eq!(verdict["valid"], false);
    assert!(!verdict["reasons"].as_array().unwrap().is_empty());

    // Cut short: the last entry left out and the manifest rewritten to list what is left.
    // The manifest's signature no longer matches: not complete, not valid.
    let verdict = ok(&agent
        .call(
            "verify_evidence",
            json!({"bundle_base64": STANDARD.encode(without_last_entry(&zip))}),
        )
        .await);
    assert_eq!(
        (&verdict["valid"], &verdict["complete"]),
        (&json!(false), &json!(false)),
        "{verdict}"
    );
    assert!(
        verdict["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("manifest.sig")),
        "{verdict}"
    );

    // Raw payloads stay home unless the operator allows them.
    let refused = err(&agent
        .call("get_evidence", json!({"id": id, "mode": "full"}))
        .await);
    assert!(refused.contains("raw payload export is off"), "{refused}");
    // Another agent cannot export it.
    let other = server.mcp(&server.agent2).await;
    assert!(err(&other.call("get_evidence", json!({"id": id})).await).starts_with("not_found"));

    // The same bundle over REST.
    let resp = server
        .http
        .get(server.url(&format!("/api/v1/evidence/{id}")))
        .bearer_auth(&server.approver)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/zip");
    let rest_zip = resp.bytes().await.unwrap();
    assert!(bundle::verify(&rest_zip, None).valid);
    let resp = server
        .http
        .post(server.url("/api/v1/evidence/verify"))
        .bearer_auth(&server.agent)
        .body(rest_zip.to_vec())
        .send()
        .await
        .unwrap();
    let verdict: Value = resp.json().await.unwrap();
    assert_eq!(verdict["valid"], true);
}

/// The bundle without its last entry (and that entry's proof), the manifest rewritten to
/// list what is left.
fn without_last_entry(zip: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut files = unzip(zip);
    let mut manifest: Value = serde_json::from_slice(&files[0].1).unwrap();
    let last = manifest["entries"].as_array_mut().unwrap().pop().unwrap();
    let gone = [
        format!("entries/{last}.json"),
        format!("proofs/{last}.json"),
    ];
    files.retain(|(p, _)| !gone.contains(p));
    manifest["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| !gone.iter().any(|g| f["path"] == g.as_str()));
    files[0].1 = serde_json::to_vec(&manifest).unwrap();
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, bytes) in &files {
        out.start_file(path.as_str(), options).unwrap();
        out.write_all(bytes).unwrap();
    }
    out.finish().unwrap().into_inner()
}

fn unzip(zip: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut f = archive.by_index(i).unwrap();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            (f.name().unwrap().to_string(), bytes)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_bundles_open_every_commitment_when_allowed() {
    let settings = Settings {
        raw_payload_export: true,
        ..Settings::default()
    };
    let server = start_full(HttpConfig::default(), settings).await;
    let id = server
        .create(
            &server.agent,
            json!({"action_description": "Email customers", "action_details": {"list": "all"}}),
        )
        .await;
    server.decide(&server.approver, &id, "rejected").await;
    let resp = server
        .http
        .get(server.url(&format!("/api/v1/evidence/{id}?mode=full")))
        .bearer_auth(&server.agent)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let zip = resp.bytes().await.unwrap();
    let report = bundle::verify(&zip, None);
    assert!(report.valid, "{:?}", report.reasons);
    assert_eq!(report.mode, Some(bundle::Mode::Full));
    let files = unzip(&zip);
    let payload: Value = files
        .iter()
        .find(|(p, _)| p == "payloads/1.json" || p.starts_with("payloads/"))
        .map(|(_, b)| serde_json::from_slice(b).unwrap())
        .unwrap();
    assert_eq!(
        payload["payload"]["action"]["description"],
        "Email customers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_decisions_get_their_own_evidence() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let recorded = ok(&agent
        .call(
            "record_decision",
            json!({
                "decision": "Refunded order 77 automatically",
                "rationale": "under the 50 EUR threshold",
                "model": {"provider": "acme", "name": "planner", "version": "3"},
                "authority": {"policy": "refunds-under-50"},
                "details": {"order": "77", "amount": "12.00"}
            }),
        )
        .await);
    let id = recorded["record_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("dec_"));
    let evidence = ok(&agent.call("get_evidence", json!({"id": id})).await);
    let zip = STANDARD
        .decode(evidence["bundle_base64"].as_str().unwrap())
        .unwrap();
    let report = bundle::verify(&zip, None);
    assert!(report.valid, "{:?}", report.reasons);
    assert_eq!(report.events, vec!["decision_recorded"]);
    let (status, _) = server
        .get(&format!("/api/v1/evidence/{id}"), &server.agent2)
        .await;
    assert_eq!(
        status, 404,
        "another agent's record is not theirs to export"
    );
    let bad = err(&agent
        .call("record_decision", json!({"decision": "  "}))
        .await);
    assert!(bad.starts_with("invalid_input"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_signed_before_a_key_rotation_still_verify() {
    let server = start().await;
    let id = server.create_default().await;
    server.decide(&server.approver, &id, "approved").await;
    let resp = server
        .http
        .get(server.url(&format!("/api/v1/evidence/{id}")))
        .bearer_auth(&server.agent)
        .send()
        .await
        .unwrap();
    let before = resp.bytes().await.unwrap();
    let old_kid = server.gate.keys().signer().kid().to_string();
    let (old, new) = server
        .gate
        .rotate_key(&Principal::local_user("ops", Role::Admin))
        .await
        .unwrap();
    assert_eq!(old, old_kid);
    let keys = jwks(&server).await;
    assert!(keys.find(&old).is_some() && keys.find(&new).is_some());
    assert!(
        bundle::verify(&before, Some(&keys)).valid,
        "an old bundle verifies against the new JWKS"
    );
    // New checkpoints are signed with the new key.
    server.create_default().await;
    let checkpoint = settled(&server).await;
    let note = checkpoint_note(&server).await;
    let only_new = Jwks {
        keys: vec![keys.find(&new).unwrap().clone()],
    };
    assert!(
        Checkpoint::verify(&note, &only_new, None).is_ok(),
        "checkpoint {} not signed by the new key",
        checkpoint.size
    );
    let kinds = server.event_kinds().await;
    assert!(kinds.contains(&"key_rotated".to_string()));
}
