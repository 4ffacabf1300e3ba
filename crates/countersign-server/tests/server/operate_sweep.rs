//! The operations' sweeper: an operation claimed (record_action) by an instance that
//! died before recording its outcome is recorded `unknown` once its run must have ended
//! (the run timeout plus the margin), never before, never twice, and never run again;
//! one whose outcome was recorded is left alone. The time is a `FixedClock` moved by
//! the test.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::{Clock, FixedClock, SystemClock};
use countersign_server::operate::{
    Bounds, Hold, OperateConfig, Operation, Operations, Performed, ProcessConfig, Target,
};
use tokio_util::sync::CancellationToken;

use crate::support;

const MARGIN: Duration = Duration::from_secs(120);
const RUN_TIMEOUT: u64 = 10;

fn config(dir: &std::path::Path) -> OperateConfig {
    OperateConfig {
        processes: vec![ProcessConfig {
            name: "worker".into(),
            target: Target::Local,
            dir: dir.to_str().unwrap().into(),
            start: "true".into(),
            pattern: "no-such-process-countersign-test".into(),
            log: "worker.log".into(),
            run: Bounds {
                timeout: Duration::from_secs(RUN_TIMEOUT),
                max_output_bytes: 4096,
            },
        }],
        ..OperateConfig::default()
    }
}

fn run(command: &str) -> Operation {
    Operation::Run {
        process: "worker".into(),
        command: command.into(),
    }
}

#[tokio::test]
async fn operations_claimed_without_an_outcome_are_swept_as_unknown() {
    let clock = Arc::new(FixedClock::new(SystemClock.now()));
    let server = support::start_clocked(clock.clone()).await;
    let work = tempfile::tempdir().unwrap();
    let ops = Operations::new(
        server.gate.clone(),
        Arc::new(config(work.path())),
        "serve:test",
    );
    let alice = server.gate.authenticate(&server.approver).await.unwrap();

    // Asked by alice, approved by bob, claimed by a CLI process that then died.
    let request = ops.ask(&alice, &run("echo left"), "s").await.unwrap();
    let id = request.id.to_string();
    let (code, body) = server.decide(&server.approver2, &id, "approved").await;
    assert_eq!(code, 200, "{body}");
    let claim = [("executed_by".to_string(), "cli-4242".to_string())].into();
    server
        .gate
        .record_action(&alice, &id, "run_command".into(), claim)
        .await
        .unwrap();

    // Another one, carried out in full: its outcome stands.
    let done = ops.ask(&alice, &run("echo done"), "s").await.unwrap();
    let (code, body) = server
        .decide(&server.approver2, done.id.as_str(), "approved")
        .await;
    assert_eq!(code, 200, "{body}");
    let performed = ops
        .perform(
            &alice,
            &run("echo done"),
            "s",
            Hold {
                time: Duration::from_secs(5),
                waiting: &mut |_| {},
                progress: &mut |_| {},
                cancel: &CancellationToken::new(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(performed, Performed::Done { .. }), "{performed:?}");

    // Not while the run could still be going.
    assert_eq!(ops.sweep(MARGIN).await.unwrap(), 0);
    clock.advance_seconds(RUN_TIMEOUT + MARGIN.as_secs() - 1);
    assert_eq!(ops.sweep(MARGIN).await.unwrap(), 0, "swept too early");
    let left = server.gate.get(&alice, &id).await.unwrap();
    assert!(left.outcome.is_none());

    // Past it: unknown, once, naming who claimed it.
    clock.advance_seconds(2);
    assert_eq!(ops.sweep(MARGIN).await.unwrap(), 1);
    let swept = server.gate.get(&alice, &id).await.unwrap();
    let outcome = swept.outcome.expect("an outcome");
    assert_eq!(
        serde_json::to_value(outcome.status).unwrap(),
        "unknown",
        "{outcome:?}"
    );
    assert_eq!(outcome.recorded_by, alice.id);
    let summary = outcome.summary.unwrap();
    assert!(summary.contains("cli-4242"), "{summary}");
    assert!(summary.contains("not run again"), "{summary}");
    assert_eq!(ops.sweep(MARGIN).await.unwrap(), 0, "swept once");
    let kept = server.gate.get(&alice, done.id.as_str()).await.unwrap();
    assert_eq!(
        serde_json::to_value(kept.outcome.unwrap().status).unwrap(),
        "succeeded"
    );

    // The same operation asked again is a new request: the swept one never runs.
    let again = ops.ask(&alice, &run("echo left"), "s").await.unwrap();
    assert_ne!(again.id.to_string(), id);
}
