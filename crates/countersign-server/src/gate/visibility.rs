//! Who may read what the log says. People who decide read every entry. Anyone else (an
//! agent, an executor) reads in full only the entries about what is its own: its
//! requests, the decisions it recorded, the rooms it may use, and what it did itself;
//! of every other entry it gets the index, the type and the commitments (the leaf hash
//! and the payload commitment), which is all the Merkle tree needs to verify.

use countersign_core::Principal;
use countersign_store::StoredEvent;

use super::Gate;
use crate::error::GateError;

/// A log entry as one caller may read it.
pub enum EntryShown {
    /// The whole entry.
    Full(StoredEvent),
    /// Only its index, type and commitments.
    Redacted(StoredEvent),
}

impl Gate {
    /// Log entry `index`, as `who` may read it.
    pub async fn log_entry(&self, who: &Principal, index: u64) -> Result<EntryShown, GateError> {
        let event = self.log.entry(index).await?;
        Ok(if self.may_read_entry(who, &event).await? {
            EntryShown::Full(event)
        } else {
            EntryShown::Redacted(event)
        })
    }

    /// Whether `who` may read `event` in full.
    pub async fn may_read_entry(
        &self,
        who: &Principal,
        event: &StoredEvent,
    ) -> Result<bool, GateError> {
        let entry = &event.entry;
        if who.role.may_decide() || entry.actor.as_deref() == Some(who.id.as_str()) {
            return Ok(true);
        }
        let Some(subject) = entry.subject.as_deref() else {
            // Tokens, keys and accounts: the operators' business.
            return Ok(false);
        };
        if let Some(room) = subject.strip_prefix("room:") {
            return Ok(match self.rooms.room(room).await {
                Ok(Some(room)) => room.admits(who, self.rooms.groups()),
                // A subject that is no room name (or a room since gone) is nobody's.
                Ok(None) | Err(GateError::Core(_)) => false,
                Err(e) => return Err(e),
            });
        }
        if subject.starts_with("dec_") {
            // A recorded decision is its recorder's: the actor of its first entry.
            let events = self.store.events_of_subject(subject).await?;
            return Ok(events
                .first()
                .is_some_and(|e| e.entry.actor.as_deref() == Some(who.id.as_str())));
        }
        Ok(self
            .store
            .get_request(subject)
            .await?
            .is_some_and(|r| r.requested_by.id == who.id))
    }
}
