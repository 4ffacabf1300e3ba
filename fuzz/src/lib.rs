//! The harnesses behind countersign's fuzz targets. Each module has a `run(&[u8])` that
//! `fuzz_targets/<name>.rs` hands libFuzzer's input to, so the same code runs under
//! `cargo fuzz` (nightly flags) and under `examples/replay.rs` (stable, no libFuzzer).
//!
//! A harness fails by panicking: on a panic inside countersign, or on a broken
//! invariant (a tampered bundle that verifies, a log entry whose canonical form does
//! not round-trip, a 5xx from the server, ...), each stated where it is checked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fixtures;
pub mod jcs;

pub mod action_digest;
pub mod bundle_mutate;
pub mod bundle_verify;
pub mod checkpoint;
pub mod log_entry;
pub mod merkle;
pub mod policy_eval;
pub mod proof_verify;
pub mod server;
pub mod server_inputs;
pub mod server_mcp;
pub mod server_rest;

/// Every target, by name, for the replay and seed tools.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("proof_verify", proof_verify::run),
    ("bundle_verify", bundle_verify::run),
    ("bundle_mutate", bundle_mutate::run),
    ("checkpoint", checkpoint::run),
    ("merkle", merkle::run),
    ("log_entry", log_entry::run),
    ("action_digest", action_digest::run),
    ("server_inputs", server_inputs::run),
    ("server_rest", server_rest::run),
    ("server_mcp", server_mcp::run),
    ("policy_eval", policy_eval::run),
];
