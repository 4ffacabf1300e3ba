//! What an operator expects of the binary itself: shell completions and man pages
//! generated from the command line, JSON logs for a collector, and a health check that
//! needs no curl.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

#[tokio::test]
async fn completions_and_man_pages_come_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = output({
            let mut cmd = bare_command();
            cmd.args(["completions", shell]);
            cmd
        })
        .await;
        assert!(out.ok(), "completions {shell}: {}", out.stderr);
        for word in [
            "countersign",
            "backup",
            "restore",
            "healthcheck",
            "log-format",
        ] {
            assert!(out.stdout.contains(word), "{shell} completions lack {word}");
        }
    }
    let bad = output({
        let mut cmd = bare_command();
        cmd.args(["completions", "tcsh"]);
        cmd
    })
    .await;
    assert!(!bad.ok() && bad.stderr.contains("tcsh"), "{}", bad.stderr);

    let dir = tmp.path().join("man");
    let out = output({
        let mut cmd = bare_command();
        cmd.arg("man").arg(&dir);
        cmd
    })
    .await;
    assert!(out.ok(), "man: {}", out.stderr);
    for page in [
        "countersign.1",
        "countersign-serve.1",
        "countersign-token-create.1",
        "countersign-backup.1",
    ] {
        let text =
            std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is no man page"
        );
    }
    let serve = std::fs::read_to_string(dir.join("countersign-serve.1")).unwrap();
    assert!(
        serve.contains("listen"),
        "the serve page lacks its --listen option"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_the_health_check() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut child = std::process::Command::new(bin())
        .args([
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(&data)
        .env("COUNTERSIGN_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut addr = None;
    while addr.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no address; stderr so far: {lines:?}"));
        let event: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a stderr line is not JSON ({e}): {line}"));
        assert!(
            event["level"].is_string() && event["timestamp"].is_string(),
            "{event}"
        );
        let message = event["message"].as_str().unwrap_or_default().to_string();
        addr = message
            .split_once("listening on http://")
            .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string));
        lines.push(line);
    }
    let addr = addr.unwrap();

    let healthy = output({
        let mut cmd = bare_command();
        cmd.args(["healthcheck", "--url", &format!("http://{addr}")]);
        cmd
    })
    .await;
    assert_eq!(healthy.code, 0, "{}{}", healthy.stdout, healthy.stderr);
    assert!(healthy.stdout.starts_with("ok:"), "{}", healthy.stdout);

    // A request's log lines are JSON too (the HTTP layer logs at info).
    let _ = reqwest::Client::new()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await;
    let _ = child.kill();
    let _ = child.wait();
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
        assert!(
            serde_json::from_str::<Value>(&line).is_ok(),
            "a stderr line is not JSON: {line}"
        );
    }

    let down = output({
        let mut cmd = bare_command();
        cmd.args([
            "healthcheck",
            "--timeout",
            "2",
            "--url",
            &format!("http://{addr}"),
        ]);
        cmd
    })
    .await;
    assert_eq!(
        down.code, 1,
        "a stopped server was called healthy: {}",
        down.stdout
    );
    assert!(down.stdout.starts_with("unhealthy:"), "{}", down.stdout);
}

/// Stderr lines of `countersign mcp` on `data` for `within`, its stdin held open.
fn mcp_stderr(data: &std::path::Path, within: Duration, until: &str) -> Vec<String> {
    let mut child = std::process::Command::new(bin())
        .args(["mcp", "--data-dir"])
        .arg(data)
        .env_remove("COUNTERSIGN_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + within;
    let mut lines = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(until);
                lines.push(line);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_with_channels_and_no_serve_says_nobody_is_notified() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        data.join("countersign.toml"),
        format!(
            "listen = \"127.0.0.1:{port}\"\n\n[[webhooks]]\nname = \"audit\"\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
        ),
    )
    .unwrap();
    const SAID: &str = "nobody is notified";

    let lines = mcp_stderr(&data, Duration::from_secs(10), SAID);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(SAID) && l.contains(&port.to_string())),
        "no warning without serve: {lines:?}"
    );

    // With this installation's serve at the configured address: nothing to say.
    let mut cmd = serve_command();
    cmd.arg("--data-dir").arg(&data);
    let server = Server::spawn(cmd);
    assert_eq!(server.addr.port(), port);
    let lines = mcp_stderr(&data, Duration::from_secs(4), SAID);
    assert!(
        !lines.iter().any(|l| l.contains(SAID)),
        "warned with serve running: {lines:?}"
    );
}
