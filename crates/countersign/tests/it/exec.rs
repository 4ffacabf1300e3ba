//! `countersign exec -- CMD ARGS...`: nothing runs until a person approves exactly that
//! command line; then it runs once, its output streams through, its exit code is the
//! process's and the request's outcome; a rejection runs nothing (exit 126, the reason on
//! stderr); a timeout withdraws the request.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, allow_unattended_cli, run_ok};

fn start_exec(data: &Path, extra: &[&str], command: &[&str]) -> tokio::process::Child {
    let mut cmd = common::command(data, &["exec", "--agent-name", "ops-bot"]);
    cmd.args(extra)
        .arg("--")
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start countersign exec")
}

async fn held(data: &Path) -> Value {
    for _ in 0..300 {
        let out = run_ok(data, &["pending", "--json"]).await;
        let found: Vec<Value> = serde_json::from_str(&out).unwrap();
        if let Some(first) = found.into_iter().next() {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending request within 15 s");
}

async fn finished(child: tokio::process::Child) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("exec ends within 60 s")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn request_row(data: &Path, id: &str) -> (String, Option<String>) {
    let conn = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    conn.query_row(
        "SELECT status, json_extract(body, '$.outcome') FROM requests WHERE id = ?1",
        [id],
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
    )
    .unwrap()
}

#[tokio::test]
async fn exec_runs_only_the_approved_command_once_and_records_its_exit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    allow_unattended_cli(&data);
    let marker = dir.path().join("ran");
    let script = format!("echo streamed; echo run >> {}; exit 3", marker.display());

    // Approved: runs once, output through, exit code kept and recorded.
    let child = start_exec(&data, &["--description", "tidy up"], &["sh", "-c", &script]);
    let request = held(&data).await;
    let details = &request["action_details"];
    assert_eq!(details["upstream"], "exec");
    assert_eq!(details["tool"], "sh");
    assert_eq!(details["/argv/0"], "\"sh\"");
    assert_eq!(details["/argv/2"], serde_json::to_string(&script).unwrap());
    assert!(
        details["/program"].as_str().unwrap().ends_with("sh\""),
        "{details}"
    );
    assert!(details.get("/cwd").is_some(), "{details}");
    assert!(
        details
            .as_object()
            .unwrap()
            .values()
            .any(|v| v == "\"PATH\""),
        "environment names bound: {details}"
    );
    assert_eq!(request["action_description"], "tidy up");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "nothing runs before the approval");
    let id = request["request_id"].as_str().unwrap().to_string();
    run_ok(&data, &["approve", &id, "-y"]).await;
    let (code, stdout, stderr) = finished(child).await;
    assert_eq!(code, 3, "the command's exit code: {stderr}");
    assert_eq!(stdout, "streamed\n");
    assert!(stderr.contains(&id), "it said what it waited for: {stderr}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "run\n");
    let (status, outcome) = request_row(&data, &id);
    assert_eq!(status, "approved");
    let outcome: Value = serde_json::from_str(&outcome.expect("an outcome")).unwrap();
    assert_eq!(outcome["status"], "failed", "{outcome}");
    assert!(
        outcome["summary"].as_str().unwrap().starts_with("exit 3"),
        "{outcome}"
    );

    // Rejected: nothing runs, 126, the reason on stderr.
    let child = start_exec(&data, &[], &["sh", "-c", &script]);
    let id = held(&data).await["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    run_ok(
        &data,
        &["reject", &id, "-y", "--comment", "not during the freeze"],
    )
    .await;
    let (code, stdout, stderr) = finished(child).await;
    assert_eq!(code, 126, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("not during the freeze"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "run\n",
        "ran once only"
    );

    // The same command again from the same shell, within the hold: the same answer
    // (a retry joins the request it made), with no new request.
    let child = start_exec(&data, &[], &["sh", "-c", &script]);
    let (code, _, stderr) = finished(child).await;
    assert_eq!(code, 126, "{stderr}");
    assert!(
        stderr.contains("not during the freeze") && stderr.contains(&id),
        "{stderr}"
    );

    // Not decided in time: withdrawn, not run.
    let child = start_exec(&data, &["--hold", "2"], &["sh", "-c", &script, "again"]);
    let id = held(&data).await["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, _, stderr) = finished(child).await;
    assert_eq!(code, 126);
    assert!(stderr.contains("not approved in time"), "{stderr}");
    assert_eq!(request_row(&data, &id).0, "cancelled");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "run\n");

    // A program that does not exist is refused before anything is asked.
    let out = common::run(&data, &["exec", "--", "no-such-program-here"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("not found on PATH"), "{out}");
}
