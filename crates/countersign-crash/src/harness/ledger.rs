//! What the server acknowledged, as the load heard it: the checks hold the restarted
//! server to this ledger, and the load works from it (which requests are pending, which
//! approved ones still need their action).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::report::Acked;

/// A decision as its approver was told it.
#[derive(Debug, Clone)]
pub(crate) struct AckedDecision {
    pub(crate) status: String,
    pub(crate) approver: String,
    /// The proof as returned: `payload` and the signatures.
    pub(crate) proof: Value,
}

/// One request as the load knows it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Req {
    pub(crate) agent: usize,
    pub(crate) key: String,
    pub(crate) digest: String,
    /// `action_description` and `action_details` as sent: what a redemption names.
    pub(crate) action: Value,
    /// The acknowledged decision (at most one may ever be acknowledged).
    pub(crate) decision: Option<AckedDecision>,
    /// `already_decided` answers: (status, "name via channel").
    pub(crate) lost: Vec<(String, String)>,
    pub(crate) cancelled: bool,
    pub(crate) acted: bool,
    /// The executor was told it redeemed the proof.
    pub(crate) redeemed: bool,
    pub(crate) outcome: Option<String>,
    /// Last known status (acknowledged or read back after a restart).
    pub(crate) status: String,
    pub(crate) used: bool,
    pub(crate) has_outcome: bool,
}

/// Everything acknowledged so far, and the lists the load works from.
#[derive(Default)]
pub(crate) struct Ledger {
    pub(crate) reqs: BTreeMap<String, Req>,
    pub(crate) by_key: HashMap<(usize, String), String>,
    /// Creations never answered, with their bodies, to retry with the same key.
    pub(crate) unanswered: Vec<(usize, String, Value)>,
    pub(crate) pending: VecDeque<String>,
    pub(crate) next_key: Vec<u64>,
    pub(crate) acked: Acked,
    pub(crate) unanswered_ops: u64,
    pub(crate) violations: Vec<String>,
}

impl Ledger {
    pub(crate) fn violation(&mut self, v: String) {
        self.violations.push(v);
    }

    fn set_status(&mut self, id: &str, status: &str) {
        if let Some(r) = self.reqs.get_mut(id) {
            r.status = status.to_string();
        }
    }

    /// A 409 for a decision or cancellation: someone else closed the request first. That
    /// answer is itself an acknowledgement of the winner's write.
    pub(crate) fn lost_race(&mut self, id: &str, v: &Value) {
        let code = v["error"]["code"].as_str().unwrap_or_default();
        let message = v["error"]["message"].as_str().unwrap_or_default();
        match code {
            "already_decided" => {
                self.acked.lost_races += 1;
                // "request ID is already STATUS (by NAME via CHANNEL at TIME)"
                let status = message
                    .split(" is already ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or_default()
                    .to_string();
                let by = message
                    .split("(by ")
                    .nth(1)
                    .and_then(|rest| rest.split(" at ").next())
                    .unwrap_or_default()
                    .to_string();
                if let Some(r) = self.reqs.get_mut(id) {
                    r.status = status.clone();
                    r.lost.push((status, by));
                }
            }
            "expired" => self.set_status(id, "timed_out"),
            _ => self.violation(format!("{id}: unexpected conflict {v}")),
        }
    }
}

/// The ledger, shared by the load's tasks and the checks.
pub(crate) type Shared = Arc<Mutex<Ledger>>;
