//! Cedar policies in a running `serve` (docs/policies.md): a permit approves and a
//! forbid refuses without a person, requirements shorten the wait and say what a timeout
//! becomes; every such decision is a signed proof naming its policy and the logged
//! policy set, `countersign verify` accepts it, and `log verify` holds it to the log. A
//! bad file keeps the server from starting, and a bad reload keeps the set in force.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Server};

const POLICIES: &str = r#"
@id("small-refunds")
permit(principal, action == Action::"refund", resource)
when { context.decimal has amount && context.decimal.amount.lessThan(decimal("100.0")) };

@id("no-deletes")
@reason("nothing is deleted by an agent")
forbid(principal, action == Action::"delete", resource);

@id("quick-staging")
@timeout_hours("0.0005")
@on_timeout("approve")
permit(principal in Group::"ci", action == Action::"deploy", resource)
when { context.input has env && context.input.env == "staging" };

@id("quick-payments")
@timeout_hours("0.0005")
@on_timeout("reject")
permit(principal, action == Action::"pay", resource);
"#;

fn configure(data: &Path, policies: &str) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(data.join("p.cedar"), policies).unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        "[policy]\nfiles = [\"p.cedar\"]\ntimezone = \"Europe/Paris\"\n\n[groups]\nci = [\"token:ci-bot\"]\n",
    )
    .unwrap();
}

async fn request(server: &Server, token: &str, tool: &str, details: Value) -> Value {
    let mut details = details;
    details["tool"] = json!(tool);
    let id = server
        .create_request(
            token,
            &json!({"action_description": format!("{tool} something"), "action_details": details}),
        )
        .await;
    server.request_view(token, &id).await
}

/// `countersign verify` on a proof, with the data directory's keys: its exit status and
/// what it printed.
async fn verify(data: &Path, proof: &Value) -> (bool, String) {
    let file = common::write_json(data, "proof.json", proof);
    let out = common::run(data, &["verify", common::path_str(&file)]).await;
    (out.ok(), format!("{}{}", out.stdout, out.stderr))
}

#[tokio::test]
async fn policies_decide_the_clear_cases_with_signed_traceable_proofs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data, POLICIES);
    let validate = common::run_ok(&data, &["policy", "validate"]).await;
    assert!(
        validate.contains("valid: 4 policies (3 permit, 1 forbid)"),
        "{validate}"
    );
    let digest = validate
        .split("policy set ")
        .nth(1)
        .map(|d| d.trim().to_string())
        .unwrap();
    assert!(digest.starts_with("sha256:"), "{digest}");

    let agent = common::create_token(&data, "agent", "ci-bot").await;
    let approver = common::create_token(&data, "approver", "alice@example.com").await;
    let server = Server::start(&data);

    // A permit without requirements: approved at once, by the policy.
    let refund = request(&server, &agent, "refund", json!({"amount": "25.00"})).await;
    assert_eq!(refund["status"], "approved", "{refund}");
    assert_eq!(refund["decision"]["authorization_type"], "policy");
    assert_eq!(refund["decision"]["approvers"], json!([]));
    assert_eq!(refund["decision"]["policy"]["id"], "small-refunds");
    let statement = common::statement(&refund["proof"]);
    assert_eq!(statement["authorization_type"], "policy");
    assert_eq!(
        statement["policy"],
        json!({"id": "small-refunds", "policy_set": digest})
    );
    let (ok, said) = verify(&data, &refund["proof"]).await;
    assert!(ok, "countersign verify refused a policy's proof: {said}");

    // A forbid: rejected at once, the policy named.
    let delete = request(&server, &agent, "delete", json!({"path": "/"})).await;
    assert_eq!(delete["status"], "rejected", "{delete}");
    assert_eq!(
        common::statement(&delete["proof"])["policy"]["id"],
        "no-deletes"
    );

    // Nothing matches: a person decides, as without policies.
    let big = request(&server, &agent, "refund", json!({"amount": "500"})).await;
    assert_eq!(big["status"], "pending", "{big}");
    assert!(big.get("policy").is_none(), "{big}");
    let (status, _) = server
        .decide(big["request_id"].as_str().unwrap(), &approver, "approve")
        .await;
    assert_eq!(status, StatusCode::OK);
    let big = server
        .request_view(&agent, big["request_id"].as_str().unwrap())
        .await;
    assert_eq!(big["decision"]["authorization_type"], "human");

    // Requirements: a short wait, then what the policy says a timeout becomes.
    let staging = request(&server, &agent, "deploy", json!({"env": "staging"})).await;
    assert_eq!(staging["status"], "pending", "{staging}");
    assert_eq!(staging["policy"]["id"], "quick-staging", "{staging}");
    assert_eq!(staging["policy"]["on_timeout"], "approved");
    let payment = request(&server, &agent, "pay", json!({"amount": "10"})).await;
    assert_eq!(payment["policy"]["id"], "quick-payments", "{payment}");
    let mut settled = (Value::Null, Value::Null);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        settled = (
            server
                .request_view(&agent, staging["request_id"].as_str().unwrap())
                .await,
            server
                .request_view(&agent, payment["request_id"].as_str().unwrap())
                .await,
        );
        if settled.0["status"] != "pending" && settled.1["status"] != "pending" {
            break;
        }
    }
    let (staging, payment) = settled;
    assert_eq!(staging["status"], "approved", "{staging}");
    assert_eq!(staging["decision"]["authorization_type"], "fallback");
    let fallback = common::statement(&staging["proof"]);
    assert_eq!(fallback["authorization_type"], "fallback");
    assert_eq!(
        fallback["policy"],
        json!({"id": "quick-staging", "policy_set": digest})
    );
    let (ok, said) = verify(&data, &staging["proof"]).await;
    assert!(ok, "countersign verify refused a fallback's proof: {said}");
    assert_eq!(payment["status"], "rejected", "{payment}");
    assert_eq!(payment["decision"]["authorization_type"], "fallback");

    // Not in the deploy policy's group: no requirement applies, a person decides.
    let other = common::create_token(&data, "agent", "other-bot").await;
    let outside = request(&server, &other, "deploy", json!({"env": "staging"})).await;
    assert_eq!(outside["status"], "pending");
    assert!(outside.get("policy").is_none(), "{outside}");

    // The log holds the policy set's text, and the database agrees with the log.
    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {}{}", out.stdout, out.stderr);
    let (status, entry) = server.get("/api/v1/log/entries/0", Some(&approver)).await;
    assert_eq!(status, StatusCode::OK, "{entry}");
    let mut found = false;
    for i in 0..40 {
        let (status, entry) = server
            .get(&format!("/api/v1/log/entries/{i}"), Some(&approver))
            .await;
        if status != StatusCode::OK {
            break;
        }
        if entry["entry"]["type"] == "policy_set_loaded" {
            assert_eq!(
                entry["entry"]["data"]["policy_set"],
                digest.as_str(),
                "{entry}"
            );
            assert_eq!(entry["entry"]["data"]["files"], json!(["p.cedar"]));
            found = true;
        }
    }
    assert!(found, "no policy_set_loaded entry in the log");
}

#[tokio::test]
async fn a_bad_policy_file_is_refused_and_a_bad_reload_keeps_the_set_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(
        &data,
        "@aprovals(\"2\") permit(principal, action, resource);",
    );
    let out = common::run(&data, &["policy", "validate"]).await;
    assert!(!out.ok());
    assert!(
        out.stdout.contains("invalid: p.cedar")
            && out.stdout.contains("unknown annotation @aprovals"),
        "{}",
        out.stdout
    );
    let doctor = common::run(&data, &["doctor"]).await;
    assert!(
        doctor.stdout.contains("the policy files do not load"),
        "{}",
        doctor.stdout
    );
    // serve refuses to start on it, saying why.
    let mut serve = common::serve_command();
    serve
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let started = serve.output().unwrap();
    assert!(!started.status.success());
    let said = String::from_utf8_lossy(&started.stderr);
    assert!(said.contains("unknown annotation @aprovals"), "{said}");

    // A good set, then a bad edit: the good set stays in force.
    std::fs::write(data.join("p.cedar"), POLICIES).unwrap();
    let agent = common::create_token(&data, "agent", "ci-bot").await;
    let server = Server::start(&data);
    std::fs::write(data.join("p.cedar"), "permit(principal, action, resource").unwrap();
    let mut warned = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if server
            .stderr()
            .contains("the policies did not load; the set in force stays")
        {
            warned = true;
            break;
        }
    }
    assert!(
        warned,
        "no warning about the bad reload: {}",
        server.stderr()
    );
    let refund = request(&server, &agent, "refund", json!({"amount": "5"})).await;
    assert_eq!(
        refund["decision"]["policy"]["id"], "small-refunds",
        "{refund}"
    );

    // A good edit is picked up: now every refund is refused.
    std::fs::write(
        data.join("p.cedar"),
        "@id(\"no-refunds\") forbid(principal, action == Action::\"refund\", resource);",
    )
    .unwrap();
    let mut refused = Value::Null;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        refused = request(&server, &agent, "refund", json!({"amount": "5"})).await;
        if refused["status"] == "rejected" {
            break;
        }
    }
    assert_eq!(
        refused["decision"]["policy"]["id"], "no-refunds",
        "{refused}"
    );
}

#[tokio::test]
async fn policy_test_explains_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data, POLICIES);
    let req = common::write_json(
        &data,
        "req.json",
        &json!({"agent": "ci-bot", "description": "deploy", "details": {"tool": "deploy", "env": "staging"}}),
    );
    let out = common::run_ok(&data, &["policy", "test", common::path_str(&req)]).await;
    assert!(
        out.contains("principal: Agent::\"ci-bot\" in [\"ci\"]"),
        "{out}"
    );
    assert!(out.contains("matched: quick-staging"), "{out}");
    assert!(out.contains("if nobody does, approved (fallback)"), "{out}");
    let json = common::run_ok(&data, &["policy", "test", "--json", common::path_str(&req)]).await;
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["outcome"], "person");
    assert_eq!(json["requirements"]["on_timeout"], "approve");
    let schema = common::run_ok(&data, &["policy", "schema"]).await;
    assert!(schema.contains("action \"deploy\" appliesTo"), "{schema}");
    assert!(schema.contains("\"amount\"?: decimal"), "{schema}");
}
