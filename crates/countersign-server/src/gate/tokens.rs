//! Bearer tokens: created and revoked by admins (each change logged), and the one place
//! a presented token becomes a principal. Only tokens' hashes are stored. A token's name
//! is its holder's identity, so it is unique forever and, for a token that cannot
//! decide, never a person's; a token may expire and may be narrowed to some scopes.

use countersign_core::token::{
    check_new_token, format_token, hash_token, name_key, parse_expiry, token_matches,
};
use countersign_core::{Event, EventKind, Principal, Role, Scopes, TokenRecord};
use countersign_store::StoreError;

use super::Gate;
use crate::error::GateError;
use crate::ids::{new_salt, secret_bytes, short_id};

/// What a new token is to be.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// Who holds it: shown in requests and proofs.
    pub name: String,
    pub role: Role,
    /// When it stops working: a duration (`30d`) or an RFC 3339 time; `None`: never.
    pub expires: Option<String>,
    /// What it may reach within its role; `None`: everything the role may.
    pub scopes: Option<Scopes>,
}

impl NewToken {
    /// A token with its role's every scope that does not expire.
    pub fn new(name: &str, role: Role) -> Self {
        Self {
            name: name.to_string(),
            role,
            expires: None,
            scopes: None,
        }
    }
}

impl Gate {
    /// Creates a token with its role's every scope and no expiry; see
    /// [`Gate::create_token_as`].
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        actor: &Principal,
    ) -> Result<(TokenRecord, String), GateError> {
        self.create_token_as(NewToken::new(name, role), actor).await
    }

    /// Creates a token and returns it with its secret, which is shown once and never
    /// stored. Refused (with the reason) for a name any token ever had, a person's name
    /// on a token that cannot decide, scopes beyond the role's, an expiry in the past.
    pub async fn create_token_as(
        &self,
        new: NewToken,
        actor: &Principal,
    ) -> Result<(TokenRecord, String), GateError> {
        let now = self.now();
        let expires_at = new
            .expires
            .as_deref()
            .map(|text| parse_expiry(text, now))
            .transpose()
            .map_err(|e| GateError::BadInput(format!("invalid expires: {e}")))?;
        let tokens = self.store.list_tokens().await?;
        let people = self.people(&tokens).await?;
        check_new_token(
            &new.name,
            new.role,
            new.scopes.as_ref(),
            people.iter().map(String::as_str),
        )
        .map_err(GateError::BadInput)?;
        let key = name_key(&new.name);
        if let Some(taken) = tokens.iter().find(|t| name_key(&t.name) == key) {
            return Err(name_taken(&new.name, taken));
        }
        let token = format_token(secret_bytes()?);
        let record = TokenRecord {
            id: short_id("tok")?,
            name: new.name,
            role: new.role,
            hash: hash_token(&token),
            created_at: now,
            revoked_at: None,
            expires_at,
            scopes: new.scopes,
        };
        let event = Event::system(
            EventKind::TokenCreated,
            now,
            Some(actor.id.clone()),
            serde_json::json!({
                "token_id": record.id,
                "name": record.name,
                "role": record.role,
                "expires_at": record.expires_at,
                "scopes": record.scopes,
            }),
        );
        match self
            .store
            .create_token(&record, &event.seal(new_salt()?))
            .await
        {
            Ok(()) => {}
            // Another process created a token of this name meanwhile.
            Err(StoreError::Duplicate(what)) => {
                return Err(GateError::BadInput(format!(
                    "{what} already exists; choose another name"
                )));
            }
            Err(err) => return Err(err.into()),
        }
        self.feed.poke();
        Ok((record, token))
    }

    /// The names people go by here, which a token that cannot decide may not take:
    /// approver and admin tokens (revoked ones too), dashboard accounts' usernames and
    /// display names, and the email addresses and Slack ids mapped to accounts.
    async fn people(&self, tokens: &[TokenRecord]) -> Result<Vec<String>, GateError> {
        let mut people: Vec<String> = tokens
            .iter()
            .filter(|t| t.role.may_decide())
            .map(|t| t.name.clone())
            .collect();
        for user in self.accounts.users().await? {
            people.push(user.username);
            people.push(user.display_name);
        }
        people.extend(self.settings.recipients.people());
        Ok(people)
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
                    // Only tokens made before names were unique can share one.
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

    /// The principal behind a bearer token, with the token's scopes. Unknown, revoked
    /// and expired tokens are refused alike.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, GateError> {
        let refused = || {
            GateError::Unauthenticated(
                "the bearer token is not valid (unknown, revoked or expired)".to_string(),
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
        if !record.is_usable(self.now()) || !token_matches(token, &record.hash) {
            return Err(refused());
        }
        Ok(record.principal())
    }
}

fn name_taken(name: &str, taken: &TokenRecord) -> GateError {
    let state = match taken.revoked_at {
        Some(at) => format!("revoked at {at}"),
        None => "active".to_string(),
    };
    GateError::BadInput(format!(
        "a token named {:?} already exists ({}, {state}); token names are never reused, so that a new token cannot inherit an old one's requests and approvals: choose another name{}",
        taken.name,
        taken.id,
        if taken.name != name {
            " (names that differ only in case are the same name)"
        } else {
            ""
        }
    ))
}
