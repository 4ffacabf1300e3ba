//! The real `countersign` binary, driven as its users drive it: a person at the CLI, an
//! agent over stdio MCP, HTTP clients of `serve`, and several of these at once on one
//! data directory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The first known answer of testdata/action-digest.json (computed with Python's rfc8785).
fn globex_action() -> Value {
    json!({
        "action_description": "Transfer GBP 12,450 to Globex Corp for invoice INV-2341",
        "action_details": {
            "vendor": "Globex Corp",
            "amount": "12450",
            "currency": "GBP",
            "invoice_ref": "INV-2341"
        }
    })
}
const GLOBEX_DIGEST: &str =
    "sha256:ca0f009325bf217cff42baad628505a58a30544630274413f083a7743b810954";

fn pay(n: usize) -> Value {
    json!({
        "action_description": format!("Pay invoice INV-{n}"),
        "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
    })
}

// 1. serve on a fresh directory ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_creates_a_private_data_dir_and_publishes_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("fresh");
    let server = Server::start(&data);

    assert_eq!(mode(&data), 0o700, "data directory mode");
    assert!(data.join("countersign.db").is_file(), "no database");
    assert_eq!(
        mode(&data.join("keys/signing-key.json")),
        0o600,
        "key file mode"
    );
    assert_eq!(server.addr.ip().to_string(), "127.0.0.1");
    assert_ne!(server.addr.port(), 0);

    let (status, health) = server.get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["status"], "ok");

    let (status, jwks) = server.get("/.well-known/jwks.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let exported: Value = serde_json::from_str(&run_ok(&data, &["keys", "export"]).await).unwrap();
    assert_eq!(jwks, exported, "served JWKS differs from `keys export`");
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["kty"], "OKP");
    assert_eq!(keys[0]["crv"], "Ed25519");
    assert_eq!(keys[0]["kid"], health["kid"]);
    assert!(
        keys[0].get("d").is_none(),
        "the JWKS publishes the private key"
    );

    // The same through the environment instead of flags.
    let data2 = tmp.path().join("from-env");
    let mut cmd = serve_command();
    cmd.env("COUNTERSIGN_LISTEN", "127.0.0.1:0")
        .env("COUNTERSIGN_DATA_DIR", &data2);
    let server2 = Server::spawn(cmd);
    assert_ne!(server2.addr.port(), server.addr.port());
    assert_eq!(mode(&data2), 0o700);
    assert!(data2.join("countersign.db").is_file());
    assert_eq!(mode(&data2.join("keys/signing-key.json")), 0o600);
    assert!(
        server2.stderr().contains(path_str(&data2)),
        "serve does not name its data directory:\n{}",
        server2.stderr()
    );
    let (status, health2) = server2.get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(health2["kid"], health["kid"], "two data dirs share a key");
    let (_, jwks2) = server2.get("/.well-known/jwks.json", None).await;
    let mut export = bare_command();
    export
        .env("COUNTERSIGN_DATA_DIR", &data2)
        .args(["keys", "export"]);
    let out = output(export).await;
    assert!(out.ok(), "{out}");
    assert_eq!(jwks2, serde_json::from_str::<Value>(&out.stdout).unwrap());
}

// 2. tokens ---------------------------------------------------------------------------

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_print_once_are_stored_hashed_and_revoke() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");

    let out = run(
        &data,
        &["token", "create", "--role", "agent", "--name", "bot"],
    )
    .await;
    assert!(out.ok(), "{out}");
    let secret = out.stdout.trim_end_matches('\n').to_string();
    assert_eq!(
        out.stdout,
        format!("{secret}\n"),
        "stdout must be the token alone"
    );
    assert!(secret.starts_with("cs_"), "{secret}");
    assert_eq!(secret.len(), 3 + 43, "{secret}");
    assert!(
        secret[3..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{secret}"
    );
    assert!(out.stderr.contains("bot"), "{out}");
    assert!(!out.stderr.contains(&secret), "the secret leaked to stderr");

    let list = run(&data, &["token", "list"]).await;
    assert!(list.ok(), "{list}");
    assert!(
        list.stdout.contains("bot") && list.stdout.contains("agent"),
        "{list}"
    );
    assert!(!list.stdout.contains(&secret[3..]) && !list.stderr.contains(&secret[3..]));

    let json_list: Value =
        serde_json::from_str(&run_ok(&data, &["token", "list", "--json"]).await).unwrap();
    let rows = json_list.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "bot");
    assert_eq!(rows[0]["role"], "agent");
    assert!(rows[0]["revoked_at"].is_null());
    assert!(!json_list.to_string().contains(&secret[3..]));
    let token_id = rows[0]["id"].as_str().unwrap().to_string();

    // Tokens are stored hashed: no file of the data directory (database, WAL) holds one.
    let second = create_token(&data, "approver", "alice").await;
    for path in files_under(&data) {
        let bytes = std::fs::read(&path).unwrap();
        for s in [&secret, &second] {
            assert!(
                !contains(&bytes, &s.as_bytes()[3..]),
                "{} holds a token in clear",
                path.display()
            );
        }
    }

    let server = Server::start(&data);
    let (status, body) = server
        .post("/api/v1/requests", Some(&secret), &pay(1))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = server.post("/api/v1/requests", None, &pay(2)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Revoked from another process while the server runs.
    let out = run(&data, &["token", "revoke", &token_id]).await;
    assert!(out.ok(), "{out}");
    let (status, body) = server
        .post("/api/v1/requests", Some(&secret), &pay(3))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated", "{body}");
    let (status, _) = server.get("/api/v1/requests", Some(&second)).await;
    assert_eq!(status, StatusCode::OK, "revoking bot affected alice");

    // By name, too.
    let out = run(&data, &["token", "revoke", "alice"]).await;
    assert!(out.ok(), "{out}");
    let (status, _) = server.get("/api/v1/requests", Some(&second)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let rows: Value =
        serde_json::from_str(&run_ok(&data, &["token", "list", "--json"]).await).unwrap();
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["revoked_at"].is_string()),
        "{rows}"
    );
}

// 3. stdio MCP ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_mcp_offers_the_agent_tools_only() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let client = mcp(&data, None).await;

    let tools = client.list_all_tools().await.unwrap();
    let names: BTreeSet<String> = tools.iter().map(|t| t.name.to_string()).collect();
    let expected: BTreeSet<String> = [
        "request_approval",
        "check_approval",
        "wait_for_approval",
        "verify_proof",
        "record_action",
        "cancel_approval",
        "record_decision",
        "record_outcome",
        "get_evidence",
        "verify_evidence",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);

    let out = call(client.peer(), "request_approval", globex_action())
        .await
        .unwrap();
    let id = out["request_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("req_"), "{out}");
    assert_eq!(out["status"], "pending");
    assert_eq!(out["action_digest"], GLOBEX_DIGEST);
    assert_eq!(out["existing"], false);
    let expires = out["expires_at"].as_str().unwrap();
    assert!(expires.ends_with('Z') && expires.contains('T'), "{out}");
    let message = out["message"].as_str().unwrap();
    assert!(
        message.contains("wait_for_approval") && message.contains(&id),
        "{message}"
    );

    let view = call(client.peer(), "check_approval", json!({"request_id": id}))
        .await
        .unwrap();
    assert_eq!(view["status"], "pending");
    assert_eq!(view["requested_by"], format!("stdio:{}", os_user()));
    assert!(expires > view["requested_at"].as_str().unwrap());
    assert!(view["proof"].is_null());

    // The operator tools are not reachable from a stdio agent, even by name.
    let attempt = client
        .peer()
        .call_tool(
            rmcp::model::CallToolRequestParams::new("approve")
                .with_arguments(json!({"request_id": id}).as_object().unwrap().clone()),
        )
        .await;
    assert!(
        attempt.is_err() || attempt.as_ref().unwrap().is_error == Some(true),
        "approve over stdio: {attempt:?}"
    );
    let view = call(client.peer(), "check_approval", json!({"request_id": id}))
        .await
        .unwrap();
    assert_eq!(view["status"], "pending");

    // An unapproved request cannot be used.
    let err = call(
        client.peer(),
        "record_action",
        json!({"request_id": id, "tool": "bank.transfer"}),
    )
    .await
    .unwrap_err();
    assert!(err.contains("not_approved"), "{err}");

    // A wait outlasting the request's expiry returns timed_out at the expiry, not later.
    let mut short = pay(2);
    short["timeout_seconds"] = json!(1);
    let out = call(client.peer(), "request_approval", short)
        .await
        .unwrap();
    let started = Instant::now();
    let view = call(
        client.peer(),
        "wait_for_approval",
        json!({"request_id": out["request_id"], "timeout_seconds": 30}),
    )
    .await
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(view["status"], "timed_out", "{view}");
    assert!(view["proof"].is_null(), "{view}");
    assert!(
        waited < Duration::from_secs(3),
        "returned {waited:?} after a 1 s expiry"
    );

    client.cancel().await.unwrap();
}

// 4. cross-process wake-up -------------------------------------------------------------

/// How long after the decision a waiter woke: measured from the decision call returning
/// (monotonic clock), and from the commit itself (the recorded `decided_at`, wall clock,
/// millisecond precision).
#[derive(Debug)]
struct WakeUp {
    after_call: Duration,
    after_commit_ms: i64,
}

impl WakeUp {
    fn new(
        view: &Value,
        decided: Instant,
        woke: Instant,
        woke_wall: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        let decided_at = view["decision"]["decided_at"].as_str().expect("decided_at");
        let decided_at = chrono::DateTime::parse_from_rfc3339(decided_at).expect("RFC 3339");
        Self {
            after_call: woke.saturating_duration_since(decided),
            after_commit_ms: (woke_wall - decided_at.with_timezone(&chrono::Utc))
                .num_milliseconds(),
        }
    }

    fn check(&self, what: &str) {
        println!(
            "wake-up, {what}: {:?} after the decision call returned, {} ms after the commit",
            self.after_call, self.after_commit_ms
        );
        assert!(self.after_call < Duration::from_secs(2), "{what}: {self:?}");
        assert!(self.after_commit_ms < 2000, "{what}: {self:?}");
    }
}

async fn mcp_wait_woken_by(
    peer: rmcp::service::Peer<rmcp::RoleClient>,
    id: String,
    decide: impl std::future::Future<Output = ()>,
) -> (Value, WakeUp) {
    let waiter = tokio::spawn(async move {
        let result = call(
            &peer,
            "wait_for_approval",
            json!({"request_id": id, "timeout_seconds": 60}),
        )
        .await;
        (result, Instant::now(), chrono::Utc::now())
    });
    // Let the waiter settle into its wait before anyone decides.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !waiter.is_finished(),
        "wait_for_approval returned before the decision"
    );
    decide.await;
    let decided = Instant::now();
    let (result, woke, woke_wall) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap();
    let view = result.unwrap();
    let wake = WakeUp::new(&view, decided, woke, woke_wall);
    (view, wake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_agent_wakes_when_another_process_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    allow_unattended_cli(&data);
    let approver = create_token(&data, "approver", "alice").await;
    let agent = create_token(&data, "agent", "http-bot").await;
    let server = Server::start(&data);
    let client = mcp(&data, Some("waiter")).await;

    // (a) stdio waiter, CLI decision.
    let id = call(client.peer(), "request_approval", pay(1))
        .await
        .unwrap()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let data_a = data.clone();
    let id_a = id.clone();
    let (view, latency) = mcp_wait_woken_by(client.peer().clone(), id.clone(), async move {
        let out = run(&data_a, &["approve", &id_a]).await;
        assert!(out.ok(), "{out}");
    })
    .await;
    assert_eq!(view["status"], "approved", "{view}");
    assert_eq!(view["decision"]["approvers"][0]["channel"], "cli");
    latency.check("stdio MCP waiter <- `countersign approve`");

    // (b) stdio waiter, REST decision on a `serve` process.
    let id = call(client.peer(), "request_approval", pay(2))
        .await
        .unwrap()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (view, latency) = mcp_wait_woken_by(client.peer().clone(), id.clone(), async {
        let (status, body) = server.decide(&id, &approver, "rejected").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    })
    .await;
    assert_eq!(view["status"], "rejected", "{view}");
    assert_eq!(view["decision"]["approvers"][0]["id"], "token:alice");
    latency.check("stdio MCP waiter <- POST /decision on serve");

    // (c) REST long-poll waiter on `serve`, CLI decision.
    let id = server.create_request(&agent, &pay(3)).await;
    let http = server.http().clone();
    let url = server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=60"));
    let agent_token = agent.clone();
    let waiter = tokio::spawn(async move {
        let result = send(http.get(url).bearer_auth(agent_token)).await;
        (result, Instant::now(), chrono::Utc::now())
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !waiter.is_finished(),
        "the long poll returned before the decision"
    );
    let out = run(&data, &["approve", &id]).await;
    assert!(out.ok(), "{out}");
    let decided = Instant::now();
    let ((status, view), woke, woke_wall) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the long poll was not woken")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "approved", "{view}");
    WakeUp::new(&view, decided, woke, woke_wall)
        .check("REST long poll on serve <- `countersign approve`");

    client.cancel().await.unwrap();
}

// 5. CLI decisions ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_decisions_need_a_terminal_or_consent_and_land_in_the_proof() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let server = Server::start(&data);
    let first = server.create_request(&agent, &pay(7)).await;
    let second = server.create_request(&agent, &pay(8)).await;

    let pending = run_ok(&data, &["pending"]).await;
    assert!(
        pending.contains(&first) && pending.contains(&second),
        "{pending}"
    );
    assert!(pending.contains("Pay invoice INV-7"), "{pending}");
    let listed: Value = serde_json::from_str(&run_ok(&data, &["pending", "--json"]).await).unwrap();
    let ids: BTreeSet<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from([first.as_str(), second.as_str()]));

    // No terminal, no consent in the config: refused, nothing decided.
    for verb in ["approve", "reject"] {
        let out = run(&data, &[verb, &first, "--yes"]).await;
        assert!(!out.ok(), "{verb} without a terminal succeeded:\n{out}");
        assert!(
            out.stderr.contains("without a terminal")
                && out.stderr.contains("unattended_decisions"),
            "unclear refusal:\n{out}"
        );
    }
    let (_, view) = server
        .get(&format!("/api/v1/requests/{first}"), Some(&agent))
        .await;
    assert_eq!(view["status"], "pending");

    allow_unattended_cli(&data);
    let user = os_user();
    let out = run(&data, &["approve", "req_doesnotexist"]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains("req_doesnotexist") && out.stderr.contains("not found"),
        "{out}"
    );

    let out = run(
        &data,
        &[
            "approve",
            &first,
            "--field",
            "po_number=PO-7",
            "--comment",
            "budget line 4",
        ],
    )
    .await;
    assert!(out.ok(), "{out}");
    assert!(
        out.stdout.contains(&first) && out.stdout.contains("approved"),
        "{out}"
    );

    let (_, view) = server
        .get(&format!("/api/v1/requests/{first}"), Some(&agent))
        .await;
    assert_eq!(view["status"], "approved", "{view}");
    let approver = &view["decision"]["approvers"][0];
    assert_eq!(approver["channel"], "cli");
    assert_eq!(approver["id"], format!("local:{user}"));
    assert_eq!(approver["auth_method"], "local_os_user");
    let st = statement(&view["proof"]);
    assert_eq!(
        view["proof"]["payloadType"],
        "application/vnd.countersign.decision+json"
    );
    assert_eq!(st["type"], "countersign.decision/v1");
    assert_eq!(st["request_id"], first.as_str());
    assert_eq!(st["decision"], "approved");
    assert_eq!(st["authorization_type"], "human");
    assert_eq!(st["fields"], json!({"po_number": "PO-7"}));
    assert_eq!(st["comment"], "budget line 4");
    assert_eq!(st["approvers"].as_array().unwrap().len(), 1);
    assert_eq!(st["approvers"][0]["id"], format!("local:{user}"));
    assert_eq!(st["approvers"][0]["channel"], "cli");
    assert_eq!(st["approvers"][0]["auth_method"], "local_os_user");
    assert_eq!(st["action"]["details"]["amount"], "107");

    // A second decision, either way, says who decided first and fails.
    for verb in ["approve", "reject"] {
        let out = run(&data, &[verb, &first]).await;
        assert_ne!(out.code, 0, "second {verb} succeeded:\n{out}");
        assert!(
            out.stderr.contains("already approved")
                && out.stderr.contains(&format!("by {user} via cli")),
            "second {verb} does not say who decided:\n{out}"
        );
    }

    let out = run(&data, &["reject", &second, "--comment", "not this month"]).await;
    assert!(out.ok(), "{out}");
    let (_, view) = server
        .get(&format!("/api/v1/requests/{second}"), Some(&agent))
        .await;
    assert_eq!(view["status"], "rejected");
    assert_eq!(statement(&view["proof"])["decision"], "rejected");
    let out = run(&data, &["approve", &second]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("already rejected"), "{out}");

    let out = run(&data, &["pending"]).await;
    assert!(out.ok(), "{out}");
    assert!(
        !out.stdout.contains(&first) && !out.stdout.contains(&second),
        "{out}"
    );
}

// 6. offline verification --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_signature_action_key_and_decision() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let files = tmp.path();
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);

    let id = server.create_request(&agent, &globex_action()).await;
    let (status, _) = server.decide(&id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK);
    let (_, request) = server
        .get(&format!("/api/v1/requests/{id}"), Some(&agent))
        .await;
    let request_file = write_json(files, "request.json", &request);
    let envelope_file = write_json(files, "envelope.json", &request["proof"]);
    let verify = |args: Vec<String>| {
        let data = data.clone();
        async move {
            let mut all = vec!["verify".to_string()];
            all.extend(args);
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            run(&data, &refs).await
        }
    };
    let p = |path: &Path| path_str(path).to_string();

    for file in [&request_file, &envelope_file] {
        let out = verify(vec![p(file)]).await;
        assert_eq!(out.code, 0, "{out}");
        assert!(
            out.stdout.starts_with("valid") && out.stdout.contains(&id),
            "{out}"
        );
    }
    let out = verify(vec![p(&request_file), "--json".into()]).await;
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["reasons"], json!([]));

    // Bound to the action.
    let same = write_json(
        files,
        "same.json",
        &json!({"description": globex_action()["action_description"], "details": globex_action()["action_details"]}),
    );
    let out = verify(vec![p(&request_file), "--action".into(), p(&same)]).await;
    assert_eq!(out.code, 0, "{out}");
    let mut other_details = globex_action()["action_details"].clone();
    other_details["amount"] = json!("99999");
    let other = write_json(
        files,
        "other.json",
        &json!({"description": globex_action()["action_description"], "details": other_details}),
    );
    let out = verify(vec![p(&request_file), "--action".into(), p(&other)]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stdout.contains("action_mismatch"), "{out}");

    // A changed payload no longer matches its signature.
    let mut statement_bytes = STANDARD
        .decode(request["proof"]["payload"].as_str().unwrap())
        .unwrap();
    let at = contains_at(&statement_bytes, b"Globex").unwrap();
    statement_bytes[at] = b'H';
    let mut forged = request["proof"].clone();
    forged["payload"] = json!(STANDARD.encode(&statement_bytes));
    let forged_file = write_json(files, "forged.json", &forged);
    let out = verify(vec![p(&forged_file)]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stdout.contains("bad_signature"), "{out}");

    // Another key set does not know the signer.
    let other_dir = tmp.path().join("other");
    run_ok(&other_dir, &["token", "list"]).await;
    let other_jwks = run_ok(&other_dir, &["keys", "export"]).await;
    let jwks_file = files.join("other-jwks.json");
    std::fs::write(&jwks_file, other_jwks).unwrap();
    let out = verify(vec![p(&request_file), "--jwks".into(), p(&jwks_file)]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stdout.contains("unknown_key"), "{out}");

    // Keys fetched from the server (from a directory with no keys of its own).
    let empty = tmp.path().join("no-keys");
    let out = run(
        &empty,
        &["verify", path_str(&request_file), "--server", &server.base],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.starts_with("valid"), "{out}");

    // Judged after its validity.
    let out = verify(vec![
        p(&request_file),
        "--at".into(),
        "2999-01-01T00:00:00Z".into(),
    ])
    .await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stdout.contains("expired"), "{out}");

    // A rejection's proof is a valid signature, but not an approval.
    let rejected = server.create_request(&agent, &pay(6)).await;
    let (status, _) = server.decide(&rejected, &approver, "rejected").await;
    assert_eq!(status, StatusCode::OK);
    let (_, request) = server
        .get(&format!("/api/v1/requests/{rejected}"), Some(&agent))
        .await;
    let rejected_file = write_json(files, "rejected.json", &request);
    let out = verify(vec![p(&rejected_file)]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stdout.contains("not_approved"), "{out}");
}

fn contains_at(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

// 7. first decision wins across processes -----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decision_wins_across_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    allow_unattended_cli(&data);
    let agent = create_token(&data, "agent", "bot").await;
    let mut approvers = Vec::new();
    for name in ["alice", "bob", "carol"] {
        approvers.push(create_token(&data, "approver", name).await);
    }
    // Two servers on one data directory: the race is between processes, not tasks.
    let servers = [Server::start(&data), Server::start(&data)];
    let server = &servers[0];

    for round in 0..3 {
        let id = server.create_request(&agent, &pay(round)).await;
        let mut http_calls = Vec::new();
        for i in 0..10 {
            let target = &servers[i % 2];
            let http = target.http().clone();
            let url = target.url(&format!("/api/v1/requests/{id}/decision"));
            let token = approvers[(i / 2) % approvers.len()].clone();
            let decision = if i % 2 == 0 { "approved" } else { "rejected" };
            http_calls.push(tokio::spawn(async move {
                let (status, body) = send(
                    http.post(url)
                        .bearer_auth(token)
                        .json(&json!({"decision": decision})),
                )
                .await;
                (decision, status, body)
            }));
        }
        let mut cli_calls = Vec::new();
        for _ in 0..2 {
            cli_calls.push(tokio::spawn(output(command(&data, &["approve", &id]))));
        }

        let mut winners = Vec::new();
        for call in http_calls {
            let (decision, status, body) = call.await.unwrap();
            if status == StatusCode::OK {
                winners.push(decision.to_string());
            } else {
                assert_eq!(status, StatusCode::CONFLICT, "{body}");
                assert_eq!(body["error"]["code"], "already_decided", "{body}");
            }
        }
        for call in cli_calls {
            let out = call.await.unwrap();
            if out.ok() {
                winners.push("approved".to_string());
            } else {
                assert!(out.stderr.contains("already"), "CLI loser:\n{out}");
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");

        let (_, view) = servers[1]
            .get(&format!("/api/v1/requests/{id}"), Some(&agent))
            .await;
        assert_eq!(view["status"], winners[0].as_str(), "{view}");
        assert_eq!(view["decision"]["approvers"].as_array().unwrap().len(), 1);
        let st = statement(&view["proof"]);
        assert_eq!(st["decision"], winners[0].as_str());
        assert_eq!(st["approvers"].as_array().unwrap().len(), 1);
    }
}

// 8. restart survival and expiry --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_requests_survive_a_crash_and_time_out_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let mut server = Server::start(&data);

    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(server.create_request(&agent, &pay(n)).await);
    }
    let mut short = pay(99);
    short["timeout_seconds"] = json!(2);
    let short_created = Instant::now();
    let short_id = server.create_request(&agent, &short).await;

    server.kill();
    drop(server);
    let server = Server::start(&data);

    for id in &ids {
        let (status, view) = server
            .get(&format!("/api/v1/requests/{id}"), Some(&agent))
            .await;
        assert_eq!(status, StatusCode::OK, "{id} lost in the crash: {view}");
        assert_eq!(view["request_id"], id.as_str());
        assert_eq!(view["status"], "pending");
    }
    let (_, list) = server
        .get("/api/v1/requests?status=pending", Some(&approver))
        .await;
    let listed: BTreeSet<&str> = list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    for id in &ids {
        assert!(listed.contains(id.as_str()), "{id} not listed: {list}");
    }

    // The restarted server's sweeper times out the short request without anyone asking.
    let mut swept = None;
    while short_created.elapsed() < Duration::from_secs(5) {
        let (_, list) = server
            .get("/api/v1/requests?status=timed_out", Some(&approver))
            .await;
        if list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["request_id"] == short_id.as_str())
        {
            swept = Some(short_created.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let swept = swept.expect("the short request was not timed out within 5 s");
    assert!(
        swept >= Duration::from_secs(2),
        "timed out early: {swept:?}"
    );
    println!("2 s request recorded as timed_out {swept:?} after creation");

    let (_, view) = server
        .get(&format!("/api/v1/requests/{short_id}"), Some(&agent))
        .await;
    assert_eq!(view["status"], "timed_out", "{view}");
    assert!(
        view["proof"].is_null() && view["decision"].is_null(),
        "{view}"
    );
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{short_id}/actions"),
            Some(&agent),
            &json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_approved", "{body}");
    let (status, body) = server.decide(&short_id, &approver, "approved").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "approved after timing out: {body}"
    );

    // The survivors are still decidable and usable.
    let (status, body) = server.decide(&ids[0], &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{}/actions", ids[0]),
            Some(&agent),
            &json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Expiry while no countersign process runs: fail closed all the same.
    let mut short = pay(98);
    short["timeout_seconds"] = json!(1);
    let stranded = server.create_request(&agent, &short).await;
    drop(server);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let pending = run_ok(&data, &["pending"]).await;
    assert!(
        !pending.contains(&stranded),
        "expired request listed as pending:\n{pending}"
    );
    allow_unattended_cli(&data);
    let out = run(&data, &["approve", &stranded]).await;
    assert_ne!(out.code, 0, "approved after its expiry:\n{out}");
    assert!(
        out.stderr.contains(&stranded)
            && (out.stderr.contains("timed_out") || out.stderr.contains("expired")),
        "{out}"
    );
    let server = Server::start(&data);
    let (_, view) = server
        .get(&format!("/api/v1/requests/{stranded}"), Some(&agent))
        .await;
    assert_eq!(view["status"], "timed_out", "{view}");
    assert!(view["proof"].is_null(), "{view}");
}

// 9. doctor and config errors -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_in_words() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    create_token(&data, "agent", "bot").await;

    let out = run(&data, &["doctor", "--listen", "127.0.0.1:0"]).await;
    assert_eq!(out.code, 0, "{out}");
    let lines: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() >= 4, "{out}");
    assert!(lines.iter().all(|l| l.starts_with("ok ")), "{out}");
    assert!(out.stdout.contains("signing key"), "{out}");

    let missing = tmp.path().join("missing");
    let out = run(&missing, &["doctor", "--listen", "127.0.0.1:0"]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains(path_str(&missing))),
        "{out}"
    );
    assert!(!missing.exists(), "doctor created the directory it checks");

    // The address taken by a countersign server is reported as such, not as a conflict.
    let server = Server::start(&data);
    let addr = server.addr.to_string();
    let out = run(&data, &["doctor", "--listen", &addr]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("already serving"), "{out}");
    drop(server);

    let key = data.join("keys/signing-key.json");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&data, &["doctor", "--listen", "127.0.0.1:0"]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stdout.lines().any(|l| l.starts_with("FAIL")
            && l.contains("signing-key.json")
            && l.contains("644")
            && l.contains("chmod 600")),
        "{out}"
    );
    // And nothing signs with a key others can read.
    let out = run(&data, &["token", "list"]).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("chmod 600"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_mistakes_stop_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    let proof = write_json(tmp.path(), "p.json", &json!({}));
    let commands: Vec<Vec<&str>> = vec![
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["mcp"],
        vec!["token", "create", "--role", "agent", "--name", "x"],
        vec!["token", "list"],
        vec!["pending"],
        vec!["approve", "req_x"],
        vec!["verify", path_str(&proof)],
        vec!["keys", "export"],
        vec!["doctor", "--listen", "127.0.0.1:0"],
    ];

    for (file, key) in [
        ("listne = \"127.0.0.1:1\"\n", "listne"),
        ("[cli]\nunattended = true\n", "unattended"),
    ] {
        std::fs::write(data.join("countersign.toml"), file).unwrap();
        for args in &commands {
            let out = run(&data, args).await;
            assert_ne!(out.code, 0, "{args:?} ignored a bad config:\n{out}");
            assert!(
                out.stderr.contains(key),
                "{args:?} does not name {key}:\n{out}"
            );
        }
    }
    assert!(
        !data.join("countersign.db").exists(),
        "a command opened the database despite a bad config"
    );

    std::fs::remove_file(data.join("countersign.toml")).unwrap();
    let mut cmd = command(&data, &["token", "list"]);
    cmd.env("COUNTERSIGN_LISTN", "127.0.0.1:1");
    let out = output(cmd).await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("COUNTERSIGN_LISTN"), "{out}");
}

// 10. several stdio processes on one data directory ------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_stdio_processes_share_one_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    // Started together on a directory that does not exist yet: they race to create the
    // directory, the database and the signing key.
    let (a, b, c) = tokio::join!(
        mcp(&data, Some("agent-0")),
        mcp(&data, Some("agent-1")),
        mcp(&data, Some("agent-2"))
    );
    let clients = vec![a, b, c];
    let mut calls = Vec::new();
    for (n, client) in clients.iter().enumerate() {
        for i in 0..20 {
            let peer = client.peer().clone();
            calls.push(tokio::spawn(async move {
                let out = call(&peer, "request_approval", pay(n * 100 + i)).await;
                (n, out)
            }));
        }
    }
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    for call in calls {
        let (n, out) = call.await.unwrap();
        let out = out.unwrap_or_else(|e| panic!("agent-{n}: request_approval failed: {e}"));
        assert_eq!(out["status"], "pending");
        created.insert(out["request_id"].as_str().unwrap().to_string(), n);
    }
    assert_eq!(created.len(), 60, "duplicate request ids");

    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let (_, jwks) = server.get("/.well-known/jwks.json", None).await;
    assert_eq!(
        jwks["keys"].as_array().unwrap().len(),
        1,
        "the race made several keys: {jwks}"
    );
    let (status, list) = server
        .get("/api/v1/requests?limit=100", Some(&approver))
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let requests = list["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 60, "{list}");
    let mut per_agent: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        let id = r["request_id"].as_str().unwrap();
        let n = created
            .get(id)
            .unwrap_or_else(|| panic!("unknown request {id}"));
        assert_eq!(r["requested_by"], format!("stdio:agent-{n}"));
        assert_eq!(r["status"], "pending");
        *per_agent
            .entry(r["requested_by"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert!(per_agent.values().all(|&c| c == 20), "{per_agent:?}");

    for client in clients {
        client.cancel().await.unwrap();
    }
}

// Shutdown ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_long_polls_when_it_shuts_down() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let server = Server::start(&data);
    let id = server.create_request(&agent, &pay(1)).await;
    let request = server
        .http()
        .get(server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=60")))
        .bearer_auth(&agent);
    let waiter = tokio::spawn(async move { request.send().await.map(|r| r.status()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished());

    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    let answered = signalled.elapsed();
    // A long poll cut short by shutdown should get its current state (pending: call
    // again), promptly, not a dropped connection after the drain period.
    assert_eq!(answer.ok(), Some(StatusCode::OK), "after {answered:?}");
    assert!(
        answered < Duration::from_secs(2),
        "answered after {answered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_in_the_data_dir_knows_a_used_approval() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let id = server.create_request(&agent, &pay(1)).await;
    let (status, _) = server.decide(&id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            Some(&agent),
            &json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, request) = server
        .get(&format!("/api/v1/requests/{id}"), Some(&agent))
        .await;
    assert!(request["used"].is_object(), "{request}");

    // The server knows the approval is spent.
    let (_, report) = server
        .post(
            "/api/v1/proofs/verify",
            Some(&agent),
            &json!({"proof": request["proof"]}),
        )
        .await;
    assert_eq!(report["valid"], false, "{report}");
    assert_eq!(report["reasons"][0]["code"], "already_used", "{report}");

    // So should the CLI, which reads the same database (and the file even says `used`).
    let file = write_json(tmp.path(), "used.json", &request);
    let out = run(&data, &["verify", path_str(&file)]).await;
    assert_ne!(out.code, 0, "a spent approval verified as valid:\n{out}");
    assert!(out.stdout.contains("already_used"), "{out}");
}
