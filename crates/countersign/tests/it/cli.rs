//! The real `countersign` binary, driven as its users drive it: a person at the CLI, an
//! agent over stdio MCP, HTTP clients of `serve`, and several of these at once on one
//! data directory.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
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

/// `token create --expires` and `--scopes`, shown by `token list`; names unique forever;
/// an agent named like a person refused; doctor on the reviewer and the old label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_carry_scopes_and_keep_their_names() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let out = run(
        &data,
        &[
            "token",
            "create",
            "--role",
            "executor",
            "--name",
            "payments",
            "--scopes",
            "redeem",
            "--expires",
            "30d",
        ],
    )
    .await;
    assert!(out.ok(), "{out}");
    assert!(
        out.stderr.contains("scopes redeem") && out.stderr.contains("expires 20"),
        "{out}"
    );
    create_token(&data, "approver", "alice").await;

    for (args, says) in [
        (
            vec!["--role", "agent", "--name", "Payments"],
            "never reused",
        ),
        (
            vec!["--role", "agent", "--name", "ALICE"],
            "how a person here is known",
        ),
        (
            vec!["--role", "agent", "--name", "ops@example.com"],
            "email address",
        ),
        (
            vec!["--role", "agent", "--name", "x", "--expires", "0d"],
            "not in the future",
        ),
        (
            vec!["--role", "agent", "--name", "y", "--scopes", "decide"],
            "agent token may have the scopes",
        ),
        (
            vec!["--role", "agent", "--name", "z", "--scopes", "everything"],
            "unknown scope",
        ),
    ] {
        let mut argv = vec!["token", "create"];
        argv.extend(args);
        let out = run(&data, &argv).await;
        assert_ne!(out.code, 0, "{argv:?}: {out}");
        assert!(out.stdout.is_empty(), "no token printed: {out}");
        assert!(out.stderr.contains(says), "{argv:?}: {out}");
    }

    let list = run_ok(&data, &["token", "list"]).await;
    let row = list.lines().find(|l| l.contains("payments")).unwrap();
    assert!(
        row.contains("executor") && row.contains("redeem") && row.contains("active"),
        "{list}"
    );
    assert!(!row.contains("never"), "it expires: {list}");
    let alice = list.lines().find(|l| l.contains("alice")).unwrap();
    assert!(
        alice.contains("never") && alice.contains("all (request,"),
        "{list}"
    );
    let rows: Value =
        serde_json::from_str(&run_ok(&data, &["token", "list", "--json"]).await).unwrap();
    let payments = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "payments")
        .unwrap();
    assert_eq!(payments["scopes"], json!(["redeem"]));
    assert_eq!(payments["scoped"], true);
    assert!(payments["expires_at"].is_string(), "{payments}");
    assert_eq!(payments["status"], "active");

    // Revoked, the name stays taken.
    run_ok(&data, &["token", "revoke", "payments"]).await;
    let out = run(
        &data,
        &[
            "token", "create", "--role", "executor", "--name", "payments",
        ],
    )
    .await;
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("revoked at"), "{out}");

    // The old [review] label alone: a warning, and reviews are off.
    std::fs::write(
        data.join("countersign.toml"),
        "[review]\nenabled = true\nreviewer_id = \"audit-team\"\n",
    )
    .unwrap();
    let out = run(&data, &["doctor", "--listen", "127.0.0.1:0"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("warn") && l.contains("[review] reviewer =")),
        "{out}"
    );
    // A reviewer that no token is.
    std::fs::write(
        data.join("countersign.toml"),
        "[review]\nreviewer = \"token:auditor\"\n",
    )
    .unwrap();
    let out = run(&data, &["doctor", "--listen", "127.0.0.1:0"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("warn") && l.contains("no active token")),
        "{out}"
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
        "post_message",
        "read_messages",
        "wait_for_message",
        "join_room",
        "leave_room",
        "set_presence",
        "wait_for_feedback",
        "report_blocker",
        "wait_for_resolution",
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
            out.stderr.contains("without a terminal"),
            "unclear refusal:\n{out}"
        );
        // The refusal is no recipe for switching itself off (an agent reads it).
        assert!(
            !out.stderr.contains("unattended_decisions") && !out.stderr.contains("[cli]"),
            "the refusal says how to turn it off:\n{out}"
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
    let out = verify(vec![p(&request_file)]).await;
    assert!(out.stderr.contains("the action was not checked"), "{out}");
    let out = verify(vec![p(&request_file), "--json".into()]).await;
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["bound"], false, "{report}");
    assert_eq!(report["reasons"], json!([]));

    // Bound to the action.
    let same = write_json(
        files,
        "same.json",
        &json!({"description": globex_action()["action_description"], "details": globex_action()["action_details"]}),
    );
    let out = verify(vec![p(&request_file), "--action".into(), p(&same)]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(!out.stderr.contains("not checked"), "{out}");
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
    // The test runs as the data directory's owner, which doctor says is unsafe with
    // agents in the same user's shell (docs/deployment.md); everything else is ok.
    let (owner, rest): (Vec<&str>, Vec<&str>) = lines
        .iter()
        .partition(|l| l.contains("the user running this command"));
    assert_eq!(owner.len(), 1, "{out}");
    assert!(
        owner[0].starts_with("warn ") && owner[0].contains("its own OS user"),
        "{out}"
    );
    assert!(rest.iter().all(|l| l.starts_with("ok ")), "{out}");
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
    let mut server = Server::start(&data);
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
    // Then it exits cleanly once its connections are closed (the client's idle
    // keep-alive one included), well before the 5 s drain limit.
    let exit = server.exited_within(Duration::from_secs(4));
    assert!(
        exit.is_some_and(|status| status.success()),
        "serve did not exit cleanly after SIGTERM: {exit:?}; stderr:\n{}",
        server.stderr()
    );
    assert!(
        !server.stderr().contains("did not finish"),
        "{}",
        server.stderr()
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

// 11. the transparency log and evidence bundles -----------------------------------------

use countersign_core::checkpoint::Checkpoint;

/// The newest checkpoint `serve` publishes, once it covers at least `size` entries.
async fn served_checkpoint(server: &Server, token: &str, size: u64) -> (String, Checkpoint) {
    let started = Instant::now();
    loop {
        let (status, body) = server.get("/api/v1/log/checkpoint", Some(token)).await;
        if status == StatusCode::OK {
            let note = body.as_str().expect("a checkpoint note").to_string();
            let (checkpoint, _) = Checkpoint::parse(&note).unwrap();
            if checkpoint.size >= size {
                return (note, checkpoint);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no checkpoint of {size} entries within 10 s; last answer {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn exported_jwks(data: &Path) -> (String, countersign_core::Jwks) {
    let text = run_ok(data, &["keys", "export"]).await;
    let jwks = serde_json::from_str(&text).unwrap();
    (text, jwks)
}

/// The JWKS with only the key `kid`.
fn only_key(jwks: &countersign_core::Jwks, kid: &str) -> countersign_core::Jwks {
    countersign_core::Jwks {
        keys: jwks.keys.iter().filter(|k| k.kid == kid).cloned().collect(),
    }
}

fn event_count(data: &Path) -> u64 {
    let db = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    db.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
        .unwrap()
        .try_into()
        .unwrap()
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// Changes one hex digit after the first `sha256:` (the JSON stays canonical; only the
/// hash of the bytes changes).
fn change_a_digest_digit(bytes: &mut [u8]) {
    let at = find(bytes, b"sha256:") + 7;
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
}

/// The files of a ZIP, in order.
fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut file = archive.by_index(i).unwrap();
            let mut content = Vec::new();
            file.read_to_end(&mut content).unwrap();
            (file.name().unwrap().to_string(), content)
        })
        .collect()
}

/// A ZIP written the way countersign writes bundles (stored, 1980-01-01).
fn rezip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    use std::io::Write;
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default());
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, content) in files {
        zip.start_file(path.as_str(), options).unwrap();
        zip.write_all(content).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn zip_file(zip: &[u8], path: &str) -> Vec<u8> {
    unzip(zip)
        .into_iter()
        .find(|(p, _)| p == path)
        .unwrap_or_else(|| panic!("{path} is not in the bundle"))
        .1
}

/// The bundle with one byte of `path` changed; with `fix_manifest`, the manifest lists the
/// changed file's new SHA-256, so only the cryptography can tell.
fn with_a_changed_byte(zip: &[u8], path: &str, fix_manifest: bool) -> Vec<u8> {
    use sha2::Digest;
    let mut files = unzip(zip);
    let file = files.iter_mut().find(|(p, _)| p == path).unwrap();
    let before = hex::encode(sha2::Sha256::digest(&file.1));
    change_a_digest_digit(&mut file.1);
    let after = hex::encode(sha2::Sha256::digest(&file.1));
    if fix_manifest {
        let manifest = files
            .iter_mut()
            .find(|(p, _)| p == "manifest.json")
            .unwrap();
        let text = String::from_utf8(manifest.1.clone()).unwrap();
        assert!(
            text.contains(&before),
            "the manifest does not list {path}'s SHA-256"
        );
        manifest.1 = text.replace(&before, &after).into_bytes();
    }
    rezip(&files)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_bundles_verify_offline_and_show_tampering() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let id = server.create_request(&agent, &globex_action()).await;
    let (status, body) = server.decide(&id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            Some(&agent),
            &json!({"tool": "bank.transfer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let bundle = tmp.path().join("bundle.zip");
    let out = run(&data, &["evidence", &id, "-o", path_str(&bundle)]).await;
    assert!(out.ok(), "{out}");
    let out = run(&data, &["verify-bundle", path_str(&bundle)]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.starts_with(&format!(
            "valid: {id} (3 entries: request_created, request_decided, action_recorded; 1 decision proof(s))"
        )),
        "{out}"
    );
    let (jwks_text, _) = exported_jwks(&data).await;
    let pinned = tmp.path().join("pinned-jwks.json");
    std::fs::write(&pinned, &jwks_text).unwrap();
    let out = run(
        &data,
        &[
            "verify-bundle",
            path_str(&bundle),
            "--jwks",
            path_str(&pinned),
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");

    // One byte of an entry changed inside the ZIP, with the manifest left as it was and
    // with the manifest fixed to match.
    let zip = std::fs::read(&bundle).unwrap();
    let manifest: Value = serde_json::from_slice(&zip_file(&zip, "manifest.json")).unwrap();
    let first = manifest["entries"][0].as_u64().unwrap();
    let entry = format!("entries/{first}.json");
    for (fix_manifest, reason) in [(false, "SHA-256"), (true, "does not describe")] {
        let tampered = tmp.path().join(format!("tampered-{fix_manifest}.zip"));
        std::fs::write(&tampered, with_a_changed_byte(&zip, &entry, fix_manifest)).unwrap();
        let out = run(&data, &["verify-bundle", path_str(&tampered)]).await;
        assert_eq!(out.code, 1, "fix_manifest={fix_manifest}: {out}");
        assert!(
            out.stdout.contains("INVALID")
                && out.stdout.contains(&entry)
                && out.stdout.contains(reason),
            "fix_manifest={fix_manifest}: the reason is not given:\n{out}"
        );
    }

    // Pinned keys of another server: nothing in the bundle is signed by them.
    let other = tmp.path().join("other");
    create_token(&other, "agent", "x").await;
    let foreign = tmp.path().join("foreign-jwks.json");
    std::fs::write(&foreign, exported_jwks(&other).await.0).unwrap();
    let out = run(
        &data,
        &[
            "verify-bundle",
            path_str(&bundle),
            "--jwks",
            path_str(&foreign),
        ],
    )
    .await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stdout.contains("INVALID") && out.stdout.contains("checkpoint"),
        "{out}"
    );

    // Full mode (the payload openings) only with the operator's consent.
    let full = tmp.path().join("full.zip");
    let args = ["evidence", &id, "--mode", "full", "-o", path_str(&full)];
    let out = run(&data, &args).await;
    assert_ne!(out.code, 0, "a full export without consent:\n{out}");
    assert!(out.stderr.contains("raw_payload_export"), "{out}");
    assert!(!full.exists());
    std::fs::write(
        data.join("countersign.toml"),
        "[evidence]\nraw_payload_export = true\n",
    )
    .unwrap();
    let out = run(&data, &args).await;
    assert!(out.ok(), "{out}");
    let out = run(&data, &["verify-bundle", path_str(&full), "--json"]).await;
    assert_eq!(out.code, 0, "{out}");
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["mode"], "full", "{report}");
    let full_zip = std::fs::read(&full).unwrap();
    let opening: Value =
        serde_json::from_slice(&zip_file(&full_zip, &format!("payloads/{first}.json"))).unwrap();
    assert_eq!(
        opening["payload"]["action"]["details"]["invoice_ref"], "INV-2341",
        "{opening}"
    );
    assert!(
        unzip(&zip).iter().all(|(p, _)| !p.starts_with("payloads/")),
        "the redacted bundle holds payload openings"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_verify_finds_a_tampered_database() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let server = Server::start(&data);
    for n in 0..3 {
        server.create_request(&agent, &pay(n)).await;
    }
    // Signed checkpoints cover every entry: the tampering below is under a signature.
    served_checkpoint(&server, &agent, 4).await;
    drop(server);
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.starts_with("4 entries") && out.stdout.contains("ok:"),
        "{out}"
    );

    let db = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    let (seq, original): (i64, Vec<u8>) = db
        .query_row(
            "SELECT seq, bytes FROM events ORDER BY seq LIMIT 1 OFFSET 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let set_bytes = |bytes: &[u8]| {
        db.execute(
            "UPDATE events SET bytes = ?1 WHERE seq = ?2",
            rusqlite::params![bytes, seq],
        )
        .unwrap();
    };

    // A byte of one entry, still canonical JSON: only the tree can tell.
    let mut forged = original.clone();
    change_a_digest_digit(&mut forged);
    set_bytes(&forged);
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 1, "an altered entry passed:\n{out}");
    assert!(
        out.stdout.contains("INVALID") && out.stdout.contains("root the entries do not produce"),
        "{out}"
    );

    // The same entry re-encoded with a space: same JSON, other bytes.
    let mut spaced = original.clone();
    spaced.insert(1, b' ');
    set_bytes(&spaced);
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 1, "a non-canonical entry passed:\n{out}");
    assert!(
        out.stdout
            .contains(&format!("entry {} is not in canonical form", seq - 1)),
        "{out}"
    );

    set_bytes(&original);
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 0, "{out}");

    // The newest entry deleted (with its payload opening, which refers to it).
    db.execute_batch(
        "DELETE FROM payloads WHERE seq = (SELECT max(seq) FROM events);
         DELETE FROM events WHERE seq = (SELECT max(seq) FROM events);",
    )
    .unwrap();
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 1, "a log missing its last entry passed:\n{out}");
    assert!(
        out.stdout.contains("INVALID") && out.stdout.contains("entries were removed"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_consistency_proves_the_log_only_grew() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let file = |name: &str| tmp.path().join(name);
    let token = create_token(&data, "agent", "a").await;
    // `serve` integrates and signs what the CLI commands append.
    let server = Server::start(&data);
    served_checkpoint(&server, &token, 1).await;
    std::fs::write(file("a.txt"), run_ok(&data, &["log", "checkpoint"]).await).unwrap();
    create_token(&data, "agent", "b").await;
    create_token(&data, "approver", "c").await;
    run_ok(&data, &["token", "revoke", "b"]).await;
    served_checkpoint(&server, &token, 4).await;
    let later = run_ok(&data, &["log", "checkpoint"]).await;
    std::fs::write(file("b.txt"), &later).unwrap();
    let (old, _) = Checkpoint::parse(&std::fs::read_to_string(file("a.txt")).unwrap()).unwrap();
    let (new, _) = Checkpoint::parse(&later).unwrap();
    assert_eq!((old.size, new.size), (1, 4));

    let consistency = |a: &str, b: &str| {
        let (a, b) = (file(a), file(b));
        let data = data.clone();
        async move { run(&data, &["log", "consistency", path_str(&a), path_str(&b)]).await }
    };
    let out = consistency("a.txt", "b.txt").await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.starts_with("consistent"), "{out}");
    let out = consistency("a.txt", "a.txt").await;
    assert_eq!(out.code, 0, "{out}");

    let out = consistency("b.txt", "a.txt").await;
    assert_ne!(out.code, 0, "swapped checkpoints passed:\n{out}");

    // A checkpoint edited by hand: its signature no longer verifies.
    let root_line = later.lines().nth(2).unwrap();
    let edited = later.replace(root_line, &STANDARD.encode([7u8; 32]));
    std::fs::write(file("edited.txt"), edited).unwrap();
    let out = consistency("a.txt", "edited.txt").await;
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains("edited.txt") && out.stderr.contains("not a valid signed checkpoint"),
        "{out}"
    );

    // Checkpoints signed with the log's own key for trees it never had (a split view):
    // a larger tree, and a fork of the same size.
    let key: Value =
        serde_json::from_slice(&std::fs::read(data.join("keys/signing-key.json")).unwrap())
            .unwrap();
    let seed = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(key["d"].as_str().unwrap())
        .unwrap();
    let signer = countersign_core::Signer::from_seed(seed.try_into().unwrap());
    for (name, size) in [("forged.txt", new.size), ("fork.txt", old.size)] {
        let forged = Checkpoint {
            origin: new.origin.clone(),
            size,
            root: [7u8; 32],
        }
        .sign(&signer);
        std::fs::write(file(name), forged).unwrap();
    }
    let out = consistency("a.txt", "forged.txt").await;
    assert_eq!(out.code, 1, "a forged later tree passed:\n{out}");
    assert!(out.stdout.contains("INCONSISTENT"), "{out}");
    let out = consistency("fork.txt", "b.txt").await;
    assert_eq!(out.code, 1, "a forked earlier tree passed:\n{out}");
    assert!(out.stdout.contains("INCONSISTENT"), "{out}");

    // Another log's checkpoint.
    let other = tmp.path().join("other");
    create_token(&other, "agent", "x").await;
    std::fs::write(
        file("other.txt"),
        run_ok(&other, &["log", "checkpoint"]).await,
    )
    .unwrap();
    let out = consistency("a.txt", "other.txt").await;
    assert_ne!(out.code, 0, "another log's checkpoint passed:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_while_serving_keeps_old_evidence_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let file = |name: &str| tmp.path().join(name);
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let before_id = server.create_request(&agent, &pay(1)).await;
    let (status, body) = server.decide(&before_id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (old_text, old_jwks) = exported_jwks(&data).await;
    let old_kid = old_jwks.keys[0].kid.clone();
    std::fs::write(file("old-jwks.json"), &old_text).unwrap();
    let (note, before) = served_checkpoint(&server, &agent, 4).await;
    std::fs::write(file("before.txt"), &note).unwrap();
    let out = run(
        &data,
        &["evidence", &before_id, "-o", path_str(&file("before.zip"))],
    )
    .await;
    assert!(out.ok(), "{out}");

    let out = run(&data, &["keys", "rotate"]).await;
    assert!(out.ok(), "{out}");
    let new_kid = out.stdout.trim().to_string();
    assert_ne!(new_kid, old_kid);
    let (new_text, new_jwks) = exported_jwks(&data).await;
    std::fs::write(file("new-jwks.json"), &new_text).unwrap();

    // The served JWKS gains the new key and keeps the old one. (Serving the JWKS also
    // makes `serve` re-read its keys; that it picks them up by itself is tested below.)
    let (status, served) = server.get("/.well-known/jwks.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let kids: BTreeSet<&str> = served["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap())
        .collect();
    assert_eq!(kids, BTreeSet::from([old_kid.as_str(), new_kid.as_str()]));
    assert_eq!(serde_json::from_str::<Value>(&new_text).unwrap(), served);

    // New proofs and checkpoints are signed with the new key.
    let after_id = server.create_request(&agent, &pay(2)).await;
    let (status, view) = server.decide(&after_id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(
        view["proof"]["signatures"][0]["keyid"], new_kid,
        "a proof after the rotation: {view}"
    );
    let (note, after) = served_checkpoint(&server, &agent, before.size + 3).await;
    Checkpoint::verify(&note, &only_key(&new_jwks, &new_kid), None).unwrap_or_else(|e| {
        panic!("the checkpoint after the rotation is not signed by {new_kid}: {e}\n{note}")
    });
    assert!(Checkpoint::verify(&note, &old_jwks, None).is_err());
    std::fs::write(file("after.txt"), &note).unwrap();

    // What was signed before still verifies against the new key set.
    let out = run(
        &data,
        &[
            "verify-bundle",
            path_str(&file("before.zip")),
            "--jwks",
            path_str(&file("new-jwks.json")),
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");
    let out = run(
        &data,
        &[
            "log",
            "consistency",
            path_str(&file("before.txt")),
            path_str(&file("after.txt")),
            "--jwks",
            path_str(&file("new-jwks.json")),
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        after.size > before.size && out.stdout.starts_with("consistent"),
        "{out}"
    );
    // A bundle exported now is signed by the new key only: the old pinned set fails it.
    let out = run(
        &data,
        &["evidence", &after_id, "-o", path_str(&file("after.zip"))],
    )
    .await;
    assert!(out.ok(), "{out}");
    let out = run(&data, &["verify-bundle", path_str(&file("after.zip"))]).await;
    assert_eq!(out.code, 0, "{out}");
    let out = run(
        &data,
        &[
            "verify-bundle",
            path_str(&file("after.zip")),
            "--jwks",
            path_str(&file("old-jwks.json")),
        ],
    )
    .await;
    assert_eq!(out.code, 1, "{out}");
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_processes_append_to_one_log() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let file = |name: &str| tmp.path().join(name);
    let approver = create_token(&data, "approver", "alice").await;
    let agent = create_token(&data, "agent", "http-bot").await;
    let server = Server::start(&data);
    let (note, start) = served_checkpoint(&server, &agent, 2).await;
    std::fs::write(file("start.txt"), &note).unwrap();

    // Three stdio agents and an HTTP agent ask 20 times each, all at once; the approver
    // decides each request over HTTP as soon as it exists. Four processes append.
    let (a, b, c) = tokio::join!(
        mcp(&data, Some("agent-0")),
        mcp(&data, Some("agent-1")),
        mcp(&data, Some("agent-2"))
    );
    let clients = [a, b, c];
    let mut chains = Vec::new();
    for n in 0..4usize {
        for i in 0..20usize {
            let peer = clients.get(n).map(|c| c.peer().clone());
            let http = server.http().clone();
            let base = server.base.clone();
            let (agent, approver) = (agent.clone(), approver.clone());
            chains.push(tokio::spawn(async move {
                let id = match peer {
                    Some(peer) => call(&peer, "request_approval", pay(n * 100 + i))
                        .await
                        .unwrap_or_else(|e| panic!("agent-{n}: {e}"))["request_id"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    None => {
                        let req = http
                            .post(format!("{base}/api/v1/requests"))
                            .bearer_auth(&agent)
                            .json(&pay(n * 100 + i));
                        let (status, body) = send(req).await;
                        assert_eq!(status, StatusCode::CREATED, "{body}");
                        body["request_id"].as_str().unwrap().to_string()
                    }
                };
                let verdict = if i % 2 == 0 { "approved" } else { "rejected" };
                let req = http
                    .post(format!("{base}/api/v1/requests/{id}/decision"))
                    .bearer_auth(&approver)
                    .json(&json!({"decision": verdict}));
                let (status, body) = send(req).await;
                assert_eq!(status, StatusCode::OK, "deciding {id}: {body}");
            }));
        }
    }
    for chain in chains {
        chain.await.unwrap();
    }
    let events = event_count(&data);
    assert_eq!(events, 2 + 80 * 2, "events in the database");

    // Every event is in the log, exactly once, and the newest checkpoint covers them all.
    let (note, end) = served_checkpoint(&server, &agent, events).await;
    assert_eq!(end.size, events, "the newest checkpoint's size");
    std::fs::write(file("end.txt"), &note).unwrap();
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.starts_with(&format!("{events} entries")),
        "{out}"
    );
    let newest = run_ok(&data, &["log", "checkpoint"]).await;
    assert_eq!(Checkpoint::parse(&newest).unwrap().0, end);

    // The served consistency proof from the checkpoint saved at the start verifies, and
    // so does the CLI's.
    let (_, jwks) = exported_jwks(&data).await;
    for n in [&note, &std::fs::read_to_string(file("start.txt")).unwrap()] {
        Checkpoint::verify(n, &jwks, Some(&start.origin)).unwrap();
    }
    let (status, proof) = server
        .get(
            &format!(
                "/api/v1/log/proof/consistency?first={}&second={}",
                start.size, end.size
            ),
            Some(&agent),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{proof}");
    let path: Vec<[u8; 32]> = proof["path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            STANDARD
                .decode(h.as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap()
        })
        .collect();
    countersign_core::merkle::verify_consistency(
        start.size,
        end.size,
        &start.root,
        &end.root,
        &path,
    )
    .unwrap_or_else(|e| panic!("the served consistency proof {proof}: {e}"));
    let out = run(
        &data,
        &[
            "log",
            "consistency",
            path_str(&file("start.txt")),
            path_str(&file("end.txt")),
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");

    for client in clients {
        client.cancel().await.unwrap();
    }
}

/// Without a server running, nothing else integrates what CLI commands append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_checkpoint_integrates_new_entries_first() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    create_token(&data, "agent", "a").await;
    let first = run_ok(&data, &["log", "checkpoint"]).await;
    assert_eq!(Checkpoint::parse(&first).unwrap().0.size, 1, "{first}");
    create_token(&data, "agent", "b").await;
    let second = run_ok(&data, &["log", "checkpoint"]).await;
    assert_eq!(
        Checkpoint::parse(&second).unwrap().0.size,
        event_count(&data),
        "`log checkpoint` after a second token:\n{second}"
    );
}

/// `serve` must switch to a key rotated by another process without being asked, also
/// while it is busy. Its log task reloads the keys when it receives the `key_rotated`
/// event, but events arriving in its 100 ms settle window after another event are
/// drained unread, so a rotation landing there is missed and `serve` goes on signing
/// proofs and checkpoints with the retired key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_switches_to_a_key_rotated_while_it_is_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let (_, health) = server.get("/healthz", None).await;
    let old_kid = health["kid"].as_str().unwrap().to_string();

    // A steady stream of requests keeps the log task settling while the key rotates.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let stream = {
        let (http, base, agent, busy) = (
            server.http().clone(),
            server.base.clone(),
            agent.clone(),
            busy.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0;
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let req = http
                    .post(format!("{base}/api/v1/requests"))
                    .bearer_auth(&agent)
                    .json(&pay(n));
                let (status, body) = send(req).await;
                assert_eq!(status, StatusCode::CREATED, "{body}");
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = run(&data, &["keys", "rotate"]).await;
    assert!(out.ok(), "{out}");
    let new_kid = out.stdout.trim().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    stream.await.unwrap();

    // Well past the feed's poll interval; /healthz names the signing key without
    // re-reading the key files (the JWKS route would).
    let started = Instant::now();
    let mut kid = old_kid.clone();
    while started.elapsed() < Duration::from_secs(2) {
        let (_, health) = server.get("/healthz", None).await;
        kid = health["kid"].as_str().unwrap().to_string();
        if kid == new_kid {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = server.create_request(&agent, &pay(999)).await;
    let (status, view) = server.decide(&id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(
        (kid.as_str(), &view["proof"]["signatures"][0]["keyid"]),
        (new_kid.as_str(), &json!(new_kid)),
        "2 s after `keys rotate` (old key {old_kid}), serve still signs with its old key"
    );
}

/// "Every file is listed in the manifest ... no file is missing" (docs/log-format.md): a
/// bundle whose manifest lists an entry that it does not hold is not valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_bundle_refuses_a_bundle_missing_a_listed_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let server = Server::start(&data);
    let id = server.create_request(&agent, &pay(1)).await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/cancel"),
            Some(&agent),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    drop(server);
    let bundle = tmp.path().join("b.zip");
    let out = run(&data, &["evidence", &id, "-o", path_str(&bundle)]).await;
    assert!(out.ok(), "{out}");
    let zip = std::fs::read(&bundle).unwrap();
    let manifest_bytes = zip_file(&zip, "manifest.json");
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    // Re-serialized, the manifest is still canonical (members in key order, no spaces).
    assert_eq!(serde_json::to_vec(&manifest).unwrap(), manifest_bytes);
    let last = manifest["entries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let gone = [
        format!("entries/{last}.json"),
        format!("proofs/{last}.json"),
    ];
    let mut files: Vec<(String, Vec<u8>)> = unzip(&zip)
        .into_iter()
        .filter(|(p, _)| !gone.contains(p))
        .collect();
    let mut manifest = manifest;
    manifest["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| !gone.iter().any(|g| f["path"] == g.as_str()));
    files[0].1 = serde_json::to_vec(&manifest).unwrap();
    let tampered = tmp.path().join("tampered.zip");
    std::fs::write(&tampered, rezip(&files)).unwrap();
    let out = run(&data, &["verify-bundle", path_str(&tampered)]).await;
    assert_eq!(
        out.code, 1,
        "a bundle missing entry {last} verified:\n{out}"
    );
}
