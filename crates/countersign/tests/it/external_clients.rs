//! countersign tested from outside Rust: `tests/python/run_all.py` drives the real
//! binary with the official Python MCP SDK (stdio and Streamable HTTP) and checks every
//! proof with a verifier that shares no code with countersign (`cryptography`'s Ed25519,
//! `rfc8785`, urllib, hashlib).
//!
//! The Python interpreter is, in order: `$COUNTERSIGN_TEST_PYTHON`, then the venv at
//! `target/pyvenv` (if it exists), then `python3` on the PATH. Set it up with
//!
//! ```text
//! python3 -m venv target/pyvenv && target/pyvenv/bin/pip install -r tests/python/requirements.txt
//! ```
//!
//! Without Python or its packages the test prints why and passes, except under `CI=true`,
//! where a skip is a failure.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{PYTHON_SETUP, in_ci, python, repo_root};

/// The whole suite takes about 10 s; past this it is hung.
const SUITE_TIMEOUT: Duration = Duration::from_secs(180);

/// Passes with a printed reason, or fails under CI=true, where nothing may be skipped.
fn skip(reason: &str) {
    let message = format!(
        "external_clients SKIPPED: {reason}\n  set up the Python side with: {PYTHON_SETUP}\n  \
         (or point COUNTERSIGN_TEST_PYTHON at an interpreter that has tests/python/requirements.txt)"
    );
    if in_ci() {
        panic!("{message}\nCI=true: a skipped suite is a failure");
    }
    eprintln!("{message}");
}

#[test]
fn python_mcp_sdk_and_independent_verifier() {
    let root = repo_root();
    let (python, source) = python();

    let probe = Command::new(&python)
        .args([
            "-c",
            "import sys; assert sys.version_info >= (3, 10), sys.version\n\
             import mcp, cryptography, rfc8785, anyio, httpx2\n\
             from mcp import Client, StdioServerParameters\n\
             print(mcp.__name__, sys.version.split()[0])",
        ])
        .stdin(Stdio::null())
        .output();
    let probe = match probe {
        Ok(output) => output,
        Err(err) => {
            if source == "COUNTERSIGN_TEST_PYTHON" {
                panic!(
                    "COUNTERSIGN_TEST_PYTHON={} cannot be run: {err}",
                    python.display()
                );
            }
            return skip(&format!(
                "no Python interpreter ({} from {source}: {err})",
                python.display()
            ));
        }
    };
    if !probe.status.success() {
        let stderr = String::from_utf8_lossy(&probe.stderr);
        let last = stderr.trim().lines().last().unwrap_or("").to_string();
        return skip(&format!(
            "{} (from {source}) lacks the packages of tests/python/requirements.txt: {last}",
            python.display()
        ));
    }

    // One file for stdout and stderr keeps the suite's output in order; it is shown on
    // failure (and with --nocapture).
    let log = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let mut child = Command::new(&python)
        .arg(root.join("tests/python/run_all.py"))
        .current_dir(&root)
        .env("COUNTERSIGN_BIN", env!("CARGO_BIN_EXE_countersign"))
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.reopen().unwrap()))
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {}: {e}", python.display()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > SUITE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(log.path()).unwrap_or_default();
    println!("{output}");
    match status {
        None => panic!(
            "tests/python/run_all.py did not finish within {SUITE_TIMEOUT:?}; its output:\n{output}"
        ),
        Some(status) if !status.success() => panic!(
            "tests/python/run_all.py failed ({status}, with {} from {source}); its output:\n{output}",
            python.display()
        ),
        Some(_) => {}
    }
    let summary = output
        .lines()
        .rev()
        .find(|l| l.starts_with("python: "))
        .unwrap_or("");
    assert!(
        summary.ends_with(" 0 failed") && !summary.starts_with("python: 0 passed"),
        "run_all.py exited 0 but its summary is {summary:?}"
    );
    eprintln!(
        "external_clients: {summary} in {:.1}s ({} from {source})",
        started.elapsed().as_secs_f64(),
        python.display()
    );
}
