//! Batch decisions: many requests, one confirmation, each decided on its own (its own
//! proof and log entry) at the version its decider selected it at.

use countersign_core::{ApprovalRequest, Channel, Decider, DecisionInput, Verdict};

use super::Gate;
use crate::error::GateError;

/// The most requests one batch decision takes.
pub const MAX_BATCH_DECISIONS: usize = 100;

/// What a batch decision did: the requests it decided, and those it did not, with why.
#[derive(Debug, Default)]
pub struct Batch {
    pub decided: Vec<ApprovalRequest>,
    pub not_decided: Vec<(String, GateError)>,
}

impl Gate {
    /// Decides many requests with one confirmation: each at the version its decider
    /// selected it at, each with its own signed proof and log entry. A request that
    /// changed since (decided, timed out, cancelled, an approval recorded) is reported in
    /// `not_decided` with the reason, never decided; so is one this decider may not
    /// decide. At most [`MAX_BATCH_DECISIONS`] at once.
    pub async fn decide_batch(
        &self,
        decider: &Decider,
        selected: &[(String, u64)],
        verdict: Verdict,
        input: DecisionInput,
        channel: Channel,
    ) -> Result<Batch, GateError> {
        if selected.is_empty() || selected.len() > MAX_BATCH_DECISIONS {
            return Err(GateError::BadInput(format!(
                "requests: {} selected; a batch decides 1 to {MAX_BATCH_DECISIONS}",
                selected.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some((id, _)) = selected.iter().find(|(id, _)| !seen.insert(id.as_str())) {
            return Err(GateError::BadInput(format!(
                "requests: {id} is selected twice"
            )));
        }
        let signer = self.keys.signer();
        let mut batch = Batch::default();
        for (id, version) in selected {
            let decided = self
                .transition(id, |request, now| {
                    if request.version != *version {
                        return Err(request
                            .closed_error(now)
                            .map(GateError::from)
                            .unwrap_or_else(|| {
                                GateError::Changed(format!(
                                    "request {id} changed since it was selected (version {version}, now {}): look at it again",
                                    request.version
                                ))
                            }));
                    }
                    self.person_decides(request, decider, verdict, &input, channel, now, &signer)
                })
                .await;
            match decided {
                Ok(request) => batch.decided.push(request),
                Err(err @ GateError::Internal(_)) => return Err(err),
                Err(GateError::Store(err)) => return Err(GateError::Store(err)),
                Err(err) => batch.not_decided.push((id.clone(), err)),
            }
        }
        Ok(batch)
    }
}
