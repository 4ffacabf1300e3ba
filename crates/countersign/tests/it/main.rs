//! Integration tests of the real `countersign` binary, as one test binary: `common/` is
//! compiled once and the suites share its helpers, and cargo links one executable instead
//! of six. Run one suite with `cargo test -p countersign --test it cli::`.
//!
//! Everything here runs in one process, so no test may change the process's environment,
//! its current directory or other global state: children get what they need on their own
//! command line and environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod approval_gate;
mod approval_gate_ops;
mod audit;
mod backup;
mod batch;
mod bridge;
mod browser;
mod channels;
mod chatroom;
mod cli;
mod container;
mod evidence;
mod exec;
mod external_clients;
mod grants;
mod hooks;
mod instances;
mod metrics;
mod operate;
mod policies;
mod quorum;
mod sdk_verifiers;
mod shipping;
mod tasks;
mod webhooks;
