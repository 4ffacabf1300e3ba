//! The verifier libraries as the services that act on proofs use them: `sdk/typescript`
//! (`@countersign/verify`, node:crypto only) and `sdk/python` (`countersign-verify`, on
//! `cryptography` and `rfc8785`). Each runs its whole own suite here (known answers,
//! forged and malformed proofs, its HTTP client against a stand-in; for TypeScript also
//! `npm pack` and an install from the tarball), plus a live part against a real `serve`:
//! a proof a person approved verifies with the JWKS fetched from the server, also pinned
//! to its key; a wrong pin, another action and a rejection are refused; a redemption for
//! the exact action succeeds once and a second is refused.
//!
//! Needs `node` (20 or newer) and `npm` on PATH for TypeScript, and for Python the venv at
//! `target/pyvenv` with the package installed from the tree:
//!
//! ```text
//! python3 -m venv target/pyvenv && target/pyvenv/bin/pip install -r tests/python/requirements.txt sdk/python
//! ```
//!
//! Without them a test prints what is missing and passes, except under `CI=true`, where
//! that is a failure. `.ci/run` installs both.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{self, Server, in_ci, python, repo_root};

/// Each suite takes seconds (the npm pack and install most of it); past this it hangs.
const LIMIT: Duration = Duration::from_secs(240);

fn skip(suite: &str, reason: &str) {
    let message = format!("sdk_verifiers::{suite} SKIPPED: {reason}");
    if in_ci() {
        panic!("{message}\nCI=true: a skipped suite is a failure");
    }
    eprintln!("{message}");
}

/// A server with an agent, an approver and an executor; one request approved by the
/// approver and one rejected. Writes what the suites' live test reads
/// (`COUNTERSIGN_SDK_LIVE`) and returns its path; the server lives as long as the guard.
async fn live_server(dir: &Path) -> (Server, PathBuf) {
    let data = dir.join("data");
    let agent = common::create_token(&data, "agent", "payments-bot").await;
    let approver = common::create_token(&data, "approver", "alice").await;
    let executor = common::create_token(&data, "executor", "payments").await;
    let server = Server::start(&data);

    let action = json!({
        "description": "Transfer GBP 12,450 to Globex Corp for invoice INV-2341",
        "details": {"vendor": "Globex Corp", "amount": "12450", "currency": "GBP", "invoice_ref": "INV-2341"},
    });
    let refused = json!({"description": "Delete staging database", "details": {"env": "staging"}});
    let mut proofs = Vec::new();
    for (action, decision) in [(&action, "approved"), (&refused, "rejected")] {
        let id = server
            .create_request(
                &agent,
                &json!({"action_description": action["description"], "action_details": action["details"]}),
            )
            .await;
        let (status, body) = server.decide(&id, &approver, decision).await;
        assert_eq!(status, StatusCode::OK, "{decision}: {body}");
        let proof = body["proof"].clone();
        let statement = common::statement(&proof);
        assert_eq!(statement["decision"], decision);
        assert_eq!(statement["authorization_type"], "human");
        proofs.push(proof);
    }
    let live = json!({
        "server": server.base,
        "executor_token": executor,
        "proof": proofs[0],
        "action": action,
        "rejected": {"proof": proofs[1], "action": refused},
    });
    let path = common::write_json(dir, "live.json", &live);
    (server, path)
}

/// Runs a suite to its end (or LIMIT) and returns its exit status and combined output.
async fn run_suite(mut cmd: tokio::process::Command, what: &str) -> (bool, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {LIMIT:?}"))
        .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    (out.status.success(), text)
}

/// The number after `prefix` on the last line that starts with it (`# pass 12`, `Ran 20
/// tests in 1.2s`).
fn count(output: &str, prefix: &str) -> Option<u64> {
    output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_package_verifies_and_redeems_a_live_servers_proofs() {
    let root = repo_root();
    let version = std::process::Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    let major = version.ok().filter(|o| o.status.success()).and_then(|o| {
        let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
        v.strip_prefix('v')?.split('.').next()?.parse::<u32>().ok()
    });
    match major {
        None => return skip("typescript", "`node` (Node.js 20 or newer) is not on PATH"),
        Some(m) if m < 20 => {
            return skip(
                "typescript",
                &format!("node is v{m}, 20 or newer is needed"),
            );
        }
        Some(_) => {}
    }
    if std::process::Command::new("npm")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return skip("typescript", "`npm` is not on PATH");
    }

    let dir = tempfile::tempdir().unwrap();
    let (_server, live) = live_server(dir.path()).await;
    let mut cmd = tokio::process::Command::new("node");
    cmd.args(["--test", "test/"])
        .current_dir(root.join("sdk/typescript"))
        .env("COUNTERSIGN_SDK_LIVE", &live)
        // npm's cache under the test's own directory: nothing of the user's is touched.
        .env("npm_config_cache", dir.path().join("npm-cache"));
    let (ok, output) = run_suite(cmd, "node --test sdk/typescript/test/").await;
    assert!(ok, "the TypeScript package's suite failed:\n{output}");
    let (pass, fail, skipped) = (
        count(&output, "# pass "),
        count(&output, "# fail "),
        count(&output, "# skipped "),
    );
    assert!(
        pass.unwrap_or(0) >= 15 && fail == Some(0) && skipped == Some(0),
        "expected every test to run and pass (the live one included): pass {pass:?}, fail {fail:?}, skipped {skipped:?}\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_verifies_and_redeems_a_live_servers_proofs() {
    let root = repo_root();
    let (python, source) = python();
    let setup = "python3 -m venv target/pyvenv && target/pyvenv/bin/pip install -r tests/python/requirements.txt sdk/python";
    let probe = std::process::Command::new(&python)
        .args([
            "-c",
            "import countersign_verify; print(countersign_verify.__file__)",
        ])
        .stdin(Stdio::null())
        .output();
    let installed = match probe {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.trim().lines().last().unwrap_or("").to_string();
            return skip(
                "python",
                &format!(
                    "{} (from {source}) cannot import countersign_verify ({last}); install it with: {setup}",
                    python.display()
                ),
            );
        }
        Err(err) => {
            return skip(
                "python",
                &format!(
                    "no Python interpreter ({} from {source}: {err})",
                    python.display()
                ),
            );
        }
    };
    // The suite tests the installed package: it must be this tree's, not an older install.
    let tree = root.join("sdk/python/src/countersign_verify/__init__.py");
    if std::fs::read(&installed).ok() != std::fs::read(&tree).ok() {
        return skip(
            "python",
            &format!(
                "{} is not {} (an older install?): run target/pyvenv/bin/pip install sdk/python",
                installed.display(),
                tree.display()
            ),
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let (_server, live) = live_server(dir.path()).await;
    let mut cmd = tokio::process::Command::new(&python);
    // -t sdk/python makes `tests` a package; the library comes from the venv (src layout:
    // the tree's copy is not on the path).
    cmd.args([
        "-m",
        "unittest",
        "discover",
        "-v",
        "-s",
        "sdk/python/tests",
        "-t",
        "sdk/python",
    ])
    .current_dir(&root)
    .env("COUNTERSIGN_SDK_LIVE", &live)
    .env("PYTHONDONTWRITEBYTECODE", "1");
    let (ok, output) = run_suite(cmd, "python -m unittest discover sdk/python/tests").await;
    assert!(ok, "the Python package's suite failed:\n{output}");
    let ran = count(&output, "Ran ").unwrap_or(0);
    assert!(
        ran >= 15 && output.lines().any(|l| l == "OK") && !output.contains("skipped"),
        "expected every test to run and pass (the live one included), ran {ran}:\n{output}"
    );
}
