//! Read-only checks an operator wants beside the process (`[[probe]]`): a named command
//! whose output is returned, bounded by a timeout and an output cap. approval-gate-mcp's
//! `wallet_balance` is one (docs/bridge.md shows it as a configuration). A probe is not
//! gated: the operator declared it read-only by configuring it, and nothing an agent
//! gives reaches its command line.

use serde::Serialize;

use super::ssh::{Bounds, Target};
use crate::error::GateError;

/// One `[[probe]]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    pub name: String,
    pub description: String,
    /// The program and its arguments (no shell here; over SSH the remote shell reads
    /// them quoted).
    pub command: Vec<String>,
    pub target: Target,
    pub bounds: Bounds,
}

/// A probe as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProbeInfo {
    pub name: String,
    pub description: String,
    pub host: String,
}

/// What running a probe gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProbeOutput {
    pub probe: String,
    pub output: String,
    pub exit_code: Option<i32>,
    pub truncated: bool,
    pub timed_out: bool,
}

impl ProbeConfig {
    pub fn info(&self) -> ProbeInfo {
        ProbeInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            host: self.target.describe(),
        }
    }

    pub async fn run(&self) -> Result<ProbeOutput, GateError> {
        let ran = self.target.argv(&self.command, self.bounds).await?;
        Ok(ProbeOutput {
            probe: self.name.clone(),
            output: ran.combined(),
            exit_code: ran.exit_code,
            truncated: ran.truncated,
            timed_out: ran.timed_out,
        })
    }
}
