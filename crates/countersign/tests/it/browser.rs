//! The dashboard end to end in real headless Chromium: runs the Node suite in
//! `tests/browser/` (playwright-core driving Debian's `/usr/bin/chromium`) against this
//! package's `countersign` binary. The suite starts its own `countersign serve` on port 0,
//! and saves screenshots at phone and desktop sizes to `target/screenshots/`.
//!
//! Needs `node`, `/usr/bin/chromium` and `npm ci --prefix tests/browser`. Without them the
//! test says what is missing and passes, except under `CI=true`, where that is a failure.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{in_ci, repo_root};

/// The suite takes about a minute; past this something hangs.
const LIMIT: Duration = Duration::from_secs(240);
const CHROMIUM: &str = "/usr/bin/chromium";

/// What is missing to run the suite, if anything.
fn missing(root: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    let node = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match node {
        Ok(out) if out.status.success() => {}
        _ => missing.push("`node` (Node.js 20 or newer) is not on PATH".to_string()),
    }
    if !Path::new(CHROMIUM).exists() {
        missing.push(format!(
            "{CHROMIUM} is missing (apt-get update && apt-get install -y chromium)"
        ));
    }
    if !root
        .join("tests/browser/node_modules/playwright-core/package.json")
        .exists()
    {
        missing.push(
            "tests/browser/node_modules/playwright-core is missing (npm ci --prefix tests/browser)"
                .to_string(),
        );
    }
    missing
}

/// The running suite. Its stdin is a pipe that it watches: when the pipe closes (this guard
/// drops, or this test process dies in any way), the suite closes Chromium, kills its
/// `serve` and exits. Only if it has not gone after a grace period is it killed outright.
/// (No process-group signals: procps-ng 4.0.2's `kill -KILL -PGID` reads some group ids
/// as -1, which signals every process on the machine.)
struct Suite(Child);

impl Drop for Suite {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn dashboard_in_headless_chromium() {
    let root = repo_root();
    let missing = missing(&root);
    if !missing.is_empty() {
        let reason = format!(
            "browser tests skipped:\n  - {}\ninstall with:\n  apt-get update && apt-get install -y chromium\n  npm ci --prefix tests/browser",
            missing.join("\n  - ")
        );
        if in_ci() {
            panic!("{reason}\n(CI=true: a skipped browser test is a failure)");
        }
        eprintln!("{reason}");
        return;
    }

    let screenshots = root.join("target").join("screenshots");
    let mut cmd = Command::new("node");
    cmd.current_dir(&root)
        .arg("--test-reporter=spec")
        .arg("tests/browser/run.mjs")
        .arg("--screenshots")
        .arg(&screenshots);
    // The binary refuses unknown COUNTERSIGN_* variables; the suite strips them from its
    // children too, but none of ours should reach it besides the binary's path.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("COUNTERSIGN_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("COUNTERSIGN_BIN", env!("CARGO_BIN_EXE_countersign"))
        .env("NO_COLOR", "1")
        // The suite ends itself, and everything it started, when this pipe closes.
        .env("BROWSER_TESTS_STDIN_WATCHDOG", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let started = Instant::now();
    let mut suite = Suite(cmd.spawn().expect("run node tests/browser/run.mjs"));
    let status = loop {
        if let Some(status) = suite.0.try_wait().expect("wait for the browser suite") {
            break status;
        }
        if started.elapsed() > LIMIT {
            drop(suite);
            panic!(
                "the browser suite did not finish within {} s; killed it",
                LIMIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(suite);
    assert!(
        status.success(),
        "the browser suite failed ({status}); its output is above, screenshots of failing pages in {}",
        screenshots.join("failures").display()
    );
    println!(
        "browser suite passed in {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        screenshots.display()
    );
}
