//! countersign's services. The [`Gate`] is the one place requests are created, decided
//! and consumed; it owns the accounts and rooms services and the transparency log.
//! Inbound adapters live in `http` (REST, dashboard, Slack clicks, email links) and
//! `mcp`; the outbound channels (Slack, email, webhooks, behind an outbox) in `notify`,
//! which knows nothing of the inbound side. docs/architecture.md has the map.

pub mod accounts;
pub mod admission;
pub mod atomic_file;
pub mod audit;
pub mod bridge;
pub mod error;
pub mod gate;
pub mod held;
pub mod hosts;
pub mod http;
mod ids;
pub mod keyring;
pub mod links;
pub mod log;
pub mod mcp;
pub mod metrics;
pub mod notify;
pub mod operate;
pub mod rooms;
pub mod views;

pub use countersign_core::Decider;
pub use error::{ErrorKind, GateError};
pub use gate::{Gate, GateBuilder, Settings};
pub use http::{
    HttpConfig, Mounts, router, router_with, router_with_gateways, serve, serve_with, with_channels,
};
pub use keyring::KeyRing;
pub use log::TransparencyLog;
pub use mcp::{Identity, McpService};
