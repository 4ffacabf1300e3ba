//! Bearer tokens: stored only as SHA-256 hashes and compared in constant time.
//!
//! A token is `cs_` followed by 43 base64url characters (32 random bytes). SHA-256 is
//! enough at rest (rather than a slow password hash) because the secret has 256 bits
//! of entropy: there is nothing to guess.
//!
//! A token's name is its holder's identity (`token:<name>` in every request, proof and
//! log entry), so names are unique forever, ignoring ASCII case: a revoked token's name
//! is never given to another token, which could otherwise inherit its requests and
//! unused approvals. And a token that cannot decide (an agent's, an executor's) may not
//! take a name that reads as a person's.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::principal::{Principal, Role};
use crate::scope::Scopes;
use crate::time::Timestamp;

pub const TOKEN_PREFIX: &str = "cs_";

/// A token as stored: never the secret, only its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public handle for listing and revoking, e.g. `tok_3f9d0e5b1a2c`.
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Lowercase hex SHA-256 of the token.
    pub hash: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
    /// When it stops working; `None`: it does not expire.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// What it may reach within its role; `None`: everything its role may (tokens made
    /// before scopes existed, and tokens created without `--scopes`).
    #[serde(default)]
    pub scopes: Option<Scopes>,
}

impl TokenRecord {
    pub fn principal(&self) -> Principal {
        let principal = Principal::from_token(&self.name, self.role);
        match &self.scopes {
            Some(scopes) => principal.with_scopes(scopes),
            None => principal,
        }
    }

    /// Not revoked (it may still have expired: see [`TokenRecord::is_usable`]).
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }

    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Whether the token authenticates at `now`: not revoked and not expired.
    pub fn is_usable(&self, now: Timestamp) -> bool {
        self.is_active() && !self.is_expired(now)
    }

    /// `active`, `expired` (at `now`) or `revoked`, as token lists show it.
    pub fn status(&self, now: Timestamp) -> &'static str {
        if !self.is_active() {
            "revoked"
        } else if self.is_expired(now) {
            "expired"
        } else {
            "active"
        }
    }

    /// The scopes it has: its own, or its role's default ([`Role::default_scopes`]).
    pub fn effective_scopes(&self) -> Scopes {
        self.principal().scopes
    }
}

/// The form of a name that must be unique among all tokens ever created: the name with
/// ASCII letters lowercased (what SQLite's and the migrations' `lower()` agree on).
pub fn name_key(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// Checks what a new token asks for: scopes within its role, and, for a token that
/// cannot decide, a name that does not read as a person's. `people` are the names
/// people go by here (approver and admin tokens, dashboard usernames, display names and
/// the email addresses mapped to them); they are compared ignoring case.
pub fn check_new_token<'a>(
    name: &str,
    role: Role,
    scopes: Option<&Scopes>,
    people: impl IntoIterator<Item = &'a str>,
) -> Result<(), String> {
    validate_token_name(name)?;
    if let Some(scopes) = scopes {
        if scopes.is_empty() {
            return Err("give at least one scope (or none, for the role's default)".into());
        }
        if !scopes.is_subset(&role.scopes()) {
            return Err(format!(
                "a {role} token may have the scopes {}; {} is more than that",
                role.scopes(),
                scopes
            ));
        }
    }
    if role.may_decide() {
        return Ok(());
    }
    if name.contains('@') {
        return Err(format!(
            "{name:?} looks like an email address, a person's name: an {role} token is shown as its name in requests and proofs, so name it after the software (e.g. deploy-bot)"
        ));
    }
    let key = name.trim().to_lowercase();
    if let Some(person) = people.into_iter().find(|p| p.trim().to_lowercase() == key) {
        return Err(format!(
            "{name:?} is how a person here is known ({person:?}: an approver or admin token, a dashboard account, or an approver's email); an {role} token may not take it"
        ));
    }
    Ok(())
}

/// When a token given `--expires TEXT` at `now` stops working: a duration from now
/// (`90m`, `12h`, `30d`, `2w`) or a UTC RFC 3339 time. It must be in the future.
pub fn parse_expiry(text: &str, now: Timestamp) -> Result<Timestamp, String> {
    let text = text.trim();
    let unit_seconds = |unit: char| match unit {
        'm' => Some(60),
        'h' => Some(3600),
        'd' => Some(86_400),
        'w' => Some(7 * 86_400),
        _ => None,
    };
    let duration = text
        .char_indices()
        .last()
        .and_then(|(i, unit)| Some((text[..i].parse::<u64>().ok()?, unit_seconds(unit)?)));
    let at = match duration {
        Some((count, seconds)) => {
            let total = count
                .checked_mul(seconds)
                .filter(|s| *s <= MAX_EXPIRY_SECONDS)
                .ok_or_else(|| format!("{text:?} is more than ten years away"))?;
            now.plus_seconds(total)
        }
        None => Timestamp::parse(text).map_err(|_| {
            format!(
                "{text:?} is not an expiry: give a duration (90m, 12h, 30d, 2w) or a UTC time such as 2027-01-31T00:00:00Z"
            )
        })?,
    };
    if at <= now {
        return Err(format!(
            "the expiry {at} is not in the future (it is {now})"
        ));
    }
    Ok(at)
}

/// The furthest `--expires` may reach as a duration: ten years.
const MAX_EXPIRY_SECONDS: u64 = 10 * 365 * 86_400;

/// Formats 32 random bytes as a token.
pub fn format_token(secret: [u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret))
}

/// The stored form of a presented token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `token` hashes to `stored_hash`, compared in constant time.
pub fn token_matches(token: &str, stored_hash: &str) -> bool {
    let presented = hash_token(token);
    presented.as_bytes().ct_eq(stored_hash.as_bytes()).into()
}

/// A token name: what the holder is called in proofs, so kept short and printable.
pub fn validate_token_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("a token name must be 1 to 64 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ' '))
    {
        return Err(format!(
            "token name {name:?} may only contain letters, digits, spaces and - _ . @"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_their_hash() {
        let token = format_token([7; 32]);
        assert!(token.starts_with("cs_"));
        assert_eq!(token.len(), 3 + 43);
        let stored = hash_token(&token);
        assert!(token_matches(&token, &stored));
        assert!(!token_matches(&format_token([8; 32]), &stored));
        assert!(!token_matches("", &stored));
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_token_name("alice@example.com").is_ok());
        assert!(validate_token_name("").is_err());
        assert!(validate_token_name("bad\nname").is_err());
        assert_eq!(name_key("Deploy-Bot"), "deploy-bot");
    }

    #[test]
    fn tokens_that_cannot_decide_take_no_persons_name() {
        let people = ["alice", "Alice Approver", "ops@example.com"];
        let check = |name: &str, role| check_new_token(name, role, None, people);
        for role in [Role::Agent, Role::Executor] {
            assert!(check("ALICE", role).unwrap_err().contains("\"alice\""));
            assert!(check("alice approver", role).is_err());
            assert!(
                check("bot@example.com", role)
                    .unwrap_err()
                    .contains("email")
            );
            assert!(check("deploy-bot", role).is_ok());
        }
        // A person's own token may carry their name or address.
        assert!(check("alice@example.com", Role::Approver).is_ok());
        assert!(check("Alice Approver", Role::Admin).is_ok());
    }

    #[test]
    fn scopes_stay_within_the_role() {
        let none: [&str; 0] = [];
        let redeem = Scopes::of([crate::Scope::Redeem]);
        assert!(check_new_token("pay", Role::Executor, Some(&redeem), none).is_ok());
        let err = check_new_token("bot", Role::Agent, Some(&redeem), none).unwrap_err();
        assert!(err.contains("agent token may have the scopes"), "{err}");
        let empty = Scopes::default();
        assert!(check_new_token("bot", Role::Agent, Some(&empty), none).is_err());
        let record = TokenRecord {
            id: "tok_1".into(),
            name: "bot".into(),
            role: Role::Agent,
            hash: String::new(),
            created_at: Timestamp::parse("2026-01-01T00:00:00Z").unwrap(),
            revoked_at: None,
            expires_at: None,
            scopes: Some(Scopes::of([crate::Scope::Rooms])),
        };
        assert_eq!(record.principal().scopes, Scopes::of([crate::Scope::Rooms]));
        let unscoped = TokenRecord {
            scopes: None,
            ..record
        };
        assert_eq!(unscoped.effective_scopes(), Role::Agent.default_scopes());
    }

    #[test]
    fn expiries_are_durations_or_times_in_the_future() {
        let now = Timestamp::parse("2026-11-29T12:00:00Z").unwrap();
        let at = |text| parse_expiry(text, now).map(|t| t.to_string());
        assert_eq!(at("30d").unwrap(), "2026-12-29T12:00:00.000Z");
        assert_eq!(at("90m").unwrap(), "2026-11-29T13:30:00.000Z");
        assert_eq!(at("2w").unwrap(), "2026-12-13T12:00:00.000Z");
        assert_eq!(
            at("2027-01-31T00:00:00Z").unwrap(),
            "2027-01-31T00:00:00.000Z"
        );
        assert!(
            at("2026-11-29T11:59:59Z")
                .unwrap_err()
                .contains("not in the future")
        );
        assert!(at("0d").is_err());
        assert!(at("30x").unwrap_err().contains("not an expiry"));
        assert!(at("99999999999w").unwrap_err().contains("ten years"));
        let record = TokenRecord {
            id: "tok_1".into(),
            name: "bot".into(),
            role: Role::Agent,
            hash: String::new(),
            created_at: now,
            revoked_at: None,
            expires_at: Some(now.plus_seconds(60)),
            scopes: None,
        };
        assert!(record.is_usable(now));
        assert_eq!(record.status(now), "active");
        assert!(
            !record.is_usable(now.plus_seconds(60)),
            "expired at the instant"
        );
        assert_eq!(record.status(now.plus_seconds(60)), "expired");
    }
}
