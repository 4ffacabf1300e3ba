//! Bearer tokens: created and revoked by admins (each change logged), and the one place
//! a presented token becomes a principal. Only tokens' hashes are stored.

use countersign_core::token::{format_token, hash_token, token_matches, validate_token_name};
use countersign_core::{Event, EventKind, Principal, Role, TokenRecord};

use super::Gate;
use crate::error::GateError;
use crate::ids::{new_salt, secret_bytes, short_id};

impl Gate {
    /// Creates a token and returns it with its secret, which is shown once and never
    /// stored.
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        actor: &Principal,
    ) -> Result<(TokenRecord, String), GateError> {
        validate_token_name(name).map_err(GateError::BadInput)?;
        let token = format_token(secret_bytes()?);
        let now = self.now();
        let record = TokenRecord {
            id: short_id("tok")?,
            name: name.to_string(),
            role,
            hash: hash_token(&token),
            created_at: now,
            revoked_at: None,
        };
        let event = Event::system(
            EventKind::TokenCreated,
            now,
            Some(actor.id.clone()),
            serde_json::json!({"token_id": record.id, "name": record.name, "role": role}),
        );
        self.store
            .create_token(&record, &event.seal(new_salt()?))
            .await?;
        self.feed.poke();
        Ok((record, token))
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, GateError> {
        Ok(self.store.list_tokens().await?)
    }

    /// Revokes a token by id, or by name when exactly one active token has that name.
    pub async fn revoke_token(
        &self,
        id_or_name: &str,
        actor: &Principal,
    ) -> Result<TokenRecord, GateError> {
        let tokens = self.store.list_tokens().await?;
        let target = match tokens.iter().find(|t| t.id == id_or_name) {
            Some(t) => t.clone(),
            None => {
                let active: Vec<_> = tokens
                    .iter()
                    .filter(|t| t.name == id_or_name && t.is_active())
                    .collect();
                match active.as_slice() {
                    [one] => (*one).clone(),
                    [] => {
                        return Err(GateError::BadInput(format!(
                            "no token with id or active name {id_or_name:?}; `countersign token list` shows them"
                        )));
                    }
                    _ => {
                        return Err(GateError::BadInput(format!(
                            "{} active tokens are named {id_or_name:?}; revoke by id",
                            active.len()
                        )));
                    }
                }
            }
        };
        let now = self.now();
        let event = Event::system(
            EventKind::TokenRevoked,
            now,
            Some(actor.id.clone()),
            serde_json::json!({"token_id": target.id, "name": target.name}),
        );
        let revoked = self
            .store
            .revoke_token(&target.id, now, &event.seal(new_salt()?))
            .await?;
        self.feed.poke();
        Ok(revoked)
    }

    /// The principal behind a bearer token. Unknown and revoked tokens are refused alike.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, GateError> {
        let refused = || {
            GateError::Unauthenticated(
                "the bearer token is not valid (unknown or revoked)".to_string(),
            )
        };
        if !token.starts_with(countersign_core::token::TOKEN_PREFIX) || token.len() > 256 {
            return Err(refused());
        }
        let record = self
            .store
            .token_by_hash(&hash_token(token))
            .await?
            .ok_or_else(refused)?;
        if !record.is_active() || !token_matches(token, &record.hash) {
            return Err(refused());
        }
        Ok(record.principal())
    }
}
