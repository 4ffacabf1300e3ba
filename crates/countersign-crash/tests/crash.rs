//! The crash harness as a test: 200 crash-and-restart cycles (`CRASH_CYCLES` for more or
//! fewer, `CRASH_SEED` for another seed), failing on any violation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use countersign_crash::harness::{Options, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_across_crashes() {
    let mut options = Options::new(PathBuf::from(env!("CARGO_BIN_EXE_countersign-crash")));
    if let Ok(cycles) = std::env::var("CRASH_CYCLES") {
        options.cycles = cycles.parse().expect("CRASH_CYCLES is a number");
    }
    if let Ok(seed) = std::env::var("CRASH_SEED") {
        options.seed = seed.parse().expect("CRASH_SEED is a number");
    }
    let report = run(&options).await.expect("the harness ran");
    eprint!("{report}");
    assert!(report.cycles == options.cycles, "stopped early:\n{report}");
    assert!(report.violations.is_empty(), "{report}");
}
