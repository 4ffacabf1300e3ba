//! Integration tests of the HTTP server: the real router on a port-0 listener over a real
//! SQLite file, driven by reqwest (REST) and rmcp's client (MCP Streamable HTTP).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod auth;
mod decisions;
mod digests;
mod edge;
mod input;
mod log;
mod mcp_http;
mod operate_sweep;
mod policies;
mod protocols;
mod races;
mod redeem;
mod reminders;
mod reviews;
mod rooms;
mod scopes;
mod ui;
mod upgrade;
mod visibility;
