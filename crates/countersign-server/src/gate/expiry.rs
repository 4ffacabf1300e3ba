//! The expiry sweeper: pending requests past their expiry time out (or become what a
//! policy's fallback says), soon after it passes.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::Status;
use tokio_util::sync::CancellationToken;

use super::Gate;
use crate::error::GateError;

impl Gate {
    /// Times out every pending request whose expiry has passed; returns how many.
    pub async fn expire_due(&self) -> Result<usize, GateError> {
        let mut expired = 0;
        loop {
            let due = self.store.due_for_expiry(self.now(), 256).await?;
            let batch = due.len();
            for request in due {
                if self.settle_expiry(request).await?.status == Status::TimedOut {
                    expired += 1;
                }
            }
            if batch < 256 {
                return Ok(expired);
            }
        }
    }

    /// Runs [`Gate::expire_due`] whenever the next expiry falls due (at least every
    /// second), until `shutdown`.
    pub async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let delay = match self.store.next_expiry().await {
                Ok(Some(at)) => self.now().millis_until(at).clamp(0, 1000),
                Ok(None) => 1000,
                Err(err) => {
                    tracing::warn!(%err, "could not read the next expiry");
                    1000
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(delay.unsigned_abs())) => {}
            }
            if let Err(err) = self.expire_due().await {
                tracing::warn!(%err, "expiry sweep failed; retrying");
            }
        }
    }
}
