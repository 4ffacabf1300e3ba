//! Asks that join: the same call made again (by the same caller, in the same session,
//! with exactly the same details) joins the request the first one made instead of
//! asking twice, for as long as that request is open or its answer should still be
//! heard, and makes a new request after that. The gateway's held calls and the process
//! operations ask this way.
//!
//! The request's idempotency key is the call's key with an attempt number, which moves
//! on once the request it names is finished, so the same call made again later is a new
//! request with a key of its own.

use std::time::Duration;

use countersign_core::{ApprovalRequest, NewRequest, Principal, Status, Timestamp};
use sha2::{Digest, Sha256};

use super::{Gate, Requested, Via};
use crate::error::GateError;

/// How many finished requests one call's key may step over before it is refused (a
/// session that repeats one call this often should start a new session).
pub(crate) const MAX_ATTEMPTS: u32 = 1000;

/// A call's key from its parts (each length-prefixed, so no two lists of parts share
/// one): 32 hex digits of their SHA-256.
pub(crate) fn join_key(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(&hash.finalize()[..16])
}

impl Gate {
    /// Creates the request `new` describes for `who` (its idempotency key is set here,
    /// from `key`), or returns the one an earlier ask of the same call made, when that
    /// one [joins](joins) (`existing` then). `Ok(None)`: the call passes with no request (a read-only tool
    /// no policy speaks of, `via` the gateway). After [`MAX_ATTEMPTS`] finished requests,
    /// `too_many` says why no more are made.
    pub(crate) async fn create_joining(
        &self,
        who: &Principal,
        new: NewRequest,
        via: &Via,
        key: &str,
        window: Duration,
        too_many: impl FnOnce() -> GateError,
    ) -> Result<Option<Requested>, GateError> {
        for attempt in 0..MAX_ATTEMPTS {
            let new = NewRequest {
                idempotency_key: Some(format!("{key}:{attempt}")),
                ..new.clone()
            };
            let Some(requested) = self.create(who, new, None, Some(via)).await? else {
                return Ok(None);
            };
            if !requested.existing {
                return Ok(Some(requested));
            }
            // Read again: timed out first if its expiry passed.
            let request = self.get(who, requested.request.id.as_str()).await?;
            if joins(&request, self.now(), window) {
                return Ok(Some(Requested {
                    request,
                    existing: true,
                }));
            }
        }
        Err(too_many())
    }
}

/// Whether an ask joins `request` (found by its key) rather than making a new one: while
/// it waits, while its approval is usable and unused, while what it approved has no
/// outcome yet, and for `window` after it was rejected, timed out or cancelled (the ask
/// gets the same answer, so that whoever checks back learns why nothing ran).
fn joins(request: &ApprovalRequest, now: Timestamp, window: Duration) -> bool {
    match request.status {
        Status::Pending => true,
        Status::Approved => match (request.used(), &request.outcome) {
            (None, _) => request.check_usable(now).is_ok(),
            (Some(_), None) => true,
            (Some(_), Some(_)) => false,
        },
        Status::Rejected | Status::TimedOut | Status::Cancelled => {
            let closed = request
                .closed_at
                .or(request.decision.as_ref().map(|d| d.decided_at))
                .unwrap_or(request.requested_at);
            let window = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
            now.millis().saturating_sub(closed.millis()) < window
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tell_their_parts_apart() {
        assert_eq!(join_key(&[b"ab", b"c"]).len(), 32);
        assert_ne!(join_key(&[b"ab", b"c"]), join_key(&[b"a", b"bc"]));
        assert_eq!(join_key(&[b"a", b"b"]), join_key(&[b"a", b"b"]));
    }
}
