//! Anchoring keys: endorsing a key with a trusted one, in a signed `key_endorsed` entry of
//! the log, so that every verifier that trusts the endorser can trace the endorsed key
//! (see `countersign_core::anchor`). Rotation endorses the new key with the old one; an
//! operator endorses another instance's key with `countersign keys trust KID`; and on
//! the first start after an upgrade, the keys published in the database until then are
//! endorsed once, so an existing deployment of several instances keeps working.

use countersign_core::anchor::Endorsement;
use countersign_core::{Jwk, Principal, Signer};

use super::Gate;
use crate::error::GateError;
use crate::ids::new_salt;
use crate::keyring;

/// The database setting holding the key ids published before keys were anchored: the
/// only ones ever endorsed without an operator naming them.
const LEGACY_KEYS: &str = "anchor:legacy_keys";

/// What `trust_key` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trusted {
    /// Newly endorsed by the given key id.
    Endorsed(String),
    /// Already traceable from this process's keys; nothing written.
    Already,
}

impl Gate {
    async fn endorse(
        &self,
        key: &Jwk,
        by: &Signer,
        actor: Option<&Principal>,
    ) -> Result<(), GateError> {
        let event = Endorsement::sign(key, by).event(self.now(), actor.map(|a| a.id.clone()));
        self.store.append_event(&event.seal(new_salt()?)).await?;
        self.feed.poke();
        Ok(())
    }

    /// Endorses the key `kid`, published in the database by another instance, with this
    /// process's signing key: from then on every process that trusts this key trusts it.
    pub async fn trust_key(&self, actor: &Principal, kid: &str) -> Result<Trusted, GateError> {
        if self.jwks().await?.find(kid).is_some() {
            return Ok(Trusted::Already);
        }
        let jwk = keyring::candidate(&*self.store, kid).await?.ok_or_else(|| {
            GateError::NotFound(format!(
                "key {kid}: no instance published it in this database (each instance publishes its key when it starts)"
            ))
        })?;
        let signer = self.keys.signer();
        self.endorse(&jwk, &signer, Some(actor)).await?;
        Ok(Trusted::Endorsed(signer.kid().to_string()))
    }

    /// Endorses what the key files and the database held before keys were anchored, so
    /// trust is traceable in the log: each key file by the one rotated out before it, and
    /// (once per database: the list is fixed the first time) the keys other instances
    /// had published by then. Idempotent; returns the key ids it endorsed.
    pub(crate) async fn anchor_existing_keys(
        &self,
        legacy: &[String],
    ) -> Result<Vec<String>, GateError> {
        let endorsements = keyring::endorsements(&*self.store).await?;
        let endorsed_by = |endorser: &str, kid: &str| {
            endorsements
                .iter()
                .any(|e| e.endorser == endorser && e.key.kid == kid)
        };
        let mut done = Vec::new();
        let signers = self
            .keys
            .file_signers()
            .map_err(|e| GateError::internal("could not read the key files", e))?;
        for pair in signers.windows(2) {
            let [older, newer] = pair else { continue };
            if !endorsed_by(older.kid(), newer.kid()) {
                self.endorse(&newer.jwk(), older, None).await?;
                done.push(newer.kid().to_string());
            }
        }
        let trusted = self.jwks().await?;
        let signer = self.keys.signer();
        for kid in legacy {
            if trusted.find(kid).is_some() {
                continue;
            }
            if let Ok(Some(jwk)) = keyring::candidate(&*self.store, kid).await {
                self.endorse(&jwk, &signer, None).await?;
                done.push(kid.clone());
            }
        }
        Ok(done)
    }
}

/// Fixes, the first time any process of a database runs with anchored keys, which keys
/// were published before: returns that list (the same for every later call).
pub(crate) async fn legacy_keys(
    store: &dyn countersign_store::Store,
) -> Result<Vec<String>, GateError> {
    let published: Vec<String> = store
        .meta_list("jwk:")
        .await?
        .into_iter()
        .map(|(key, _)| key.trim_start_matches("jwk:").to_string())
        .collect();
    let json = serde_json::to_string(&published)
        .map_err(|e| GateError::internal("encode the key list", e))?;
    let fixed = store.meta_set_once(LEGACY_KEYS, &json).await?;
    serde_json::from_str(&fixed)
        .map_err(|e| GateError::Store(countersign_store::StoreError::Corrupt(e.to_string())))
}
