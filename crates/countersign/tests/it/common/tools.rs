//! What the suites find outside Rust: the repository's scripts, a Python interpreter, and
//! whether a test that lacks one may pass without running. Stated once, so every suite
//! picks the same Python and treats `CI=true` alike.

use std::path::{Path, PathBuf};

/// Under `CI=true` nothing may be skipped: a missing tool is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The repository root, where `tests/python`, `tests/browser` and `target/` live.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// The Python interpreter, and where that choice came from: `$COUNTERSIGN_TEST_PYTHON`,
/// else the venv at `target/pyvenv` (made from `tests/python/requirements.txt`), else
/// `python3` on the PATH.
pub fn python() -> (PathBuf, &'static str) {
    if let Some(path) = std::env::var_os("COUNTERSIGN_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return (PathBuf::from(path), "COUNTERSIGN_TEST_PYTHON");
    }
    let venv = repo_root().join("target/pyvenv/bin/python");
    if venv.is_file() {
        return (venv, "the venv at target/pyvenv");
    }
    (PathBuf::from("python3"), "python3 on the PATH")
}

/// How to make the venv `python` looks for.
pub const PYTHON_SETUP: &str = "python3 -m venv target/pyvenv && target/pyvenv/bin/pip install -r tests/python/requirements.txt";

/// A test that cannot run here passes after saying why; under `CI=true` it fails.
pub fn skip(why: &str) {
    if in_ci() {
        panic!("CI=true and {why}");
    }
    eprintln!("SKIPPED: this test passes without running: {why} (with CI=true this is a failure)");
}

/// The suites' Python if it can import every one of `modules`; otherwise why not.
pub fn python_with(modules: &[&str]) -> Result<PathBuf, String> {
    let (python, source) = python();
    let imports = format!("import {}", modules.join(", "));
    let ok = std::process::Command::new(&python)
        .args(["-c", &imports])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(python)
    } else {
        Err(format!(
            "{} (from {source}) cannot `{imports}`; install them: {PYTHON_SETUP}",
            python.display()
        ))
    }
}
