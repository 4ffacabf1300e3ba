//! Named groups of principals (`[groups]` in the config, e.g. `ops = ["token:deploy-bot",
//! "user:alice"]`): what a room can be restricted to besides single principals, and
//! what policies can name later. A group lists principal ids only (no nesting), so who
//! is in a group is read off one line of the config.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::CoreError;

/// The prefix that names a group where a principal id could stand: `group:ops`.
pub const GROUP_PREFIX: &str = "group:";

/// The prefixes of principal ids: bearer tokens, dashboard accounts, local OS users, and
/// the bridges `serve` runs for processes on the file contract (docs/bridge.md).
const PRINCIPAL_PREFIXES: [&str; 4] = ["token:", "user:", "local:", "bridge:"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    groups: BTreeMap<String, BTreeSet<String>>,
}

/// Checks a principal id (`token:<name>`, `user:<username>`, `local:<user>` or
/// `bridge:<name>`).
pub fn check_principal_id(field: &str, id: &str) -> Result<(), CoreError> {
    let ok = PRINCIPAL_PREFIXES.iter().any(|prefix| {
        id.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty() && rest.len() <= 128 && !rest.chars().any(char::is_whitespace)
        })
    });
    if ok {
        Ok(())
    } else {
        Err(CoreError::invalid(
            field,
            format!(
                "{id:?} is not a principal id (token:<name>, user:<username>, local:<user> or bridge:<name>)"
            ),
        ))
    }
}

pub(crate) fn check_group_name(name: &str) -> Result<(), CoreError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CoreError::invalid(
            "groups",
            format!("{name:?} is not a group name (1 to 64 of a-z, 0-9, - _ .)"),
        ))
    }
}

impl Groups {
    /// Groups from their names and members, each checked.
    pub fn new(groups: BTreeMap<String, Vec<String>>) -> Result<Self, CoreError> {
        let mut out = BTreeMap::new();
        for (name, members) in groups {
            check_group_name(&name)?;
            let mut set = BTreeSet::new();
            for member in members {
                check_principal_id(&format!("groups.{name}"), &member)?;
                set.insert(member);
            }
            out.insert(name, set);
        }
        Ok(Self { groups: out })
    }

    /// Whether `group` exists.
    pub fn exists(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// Whether `principal` (an id) is in `group`.
    pub fn contains(&self, group: &str, principal: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|m| m.contains(principal))
    }

    /// The groups `principal` (an id) is in, in order.
    pub fn of(&self, principal: &str) -> Vec<String> {
        self.groups
            .iter()
            .filter(|(_, members)| members.contains(principal))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The group names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// Whether `principal` is `who` itself or, for `group:<name>`, a member of it.
    pub fn matches(&self, entry: &str, principal: &str) -> bool {
        match entry.strip_prefix(GROUP_PREFIX) {
            Some(group) => self.contains(group, principal),
            None => entry == principal,
        }
    }

    /// Checks a list of principal ids and `group:<name>`s (each group must exist);
    /// returns it sorted and without repeats.
    pub fn check_list(&self, field: &str, list: &[String]) -> Result<Vec<String>, CoreError> {
        let mut out = BTreeSet::new();
        for entry in list {
            let entry = entry.trim();
            match entry.strip_prefix(GROUP_PREFIX) {
                Some(group) if !self.exists(group) => {
                    return Err(CoreError::invalid(
                        field,
                        format!(
                            "there is no group {group:?} in [groups] (known: {})",
                            if self.groups.is_empty() {
                                "none".to_string()
                            } else {
                                self.names().collect::<Vec<_>>().join(", ")
                            }
                        ),
                    ));
                }
                Some(_) => {}
                None => check_principal_id(field, entry)?,
            }
            out.insert(entry.to_string());
        }
        Ok(out.into_iter().collect())
    }
}

/// Which dashboard account each identity belongs to: a token by its configured account
/// (`[tokens] accounts`), an OS user by `[cli] accounts`. Slack users and email addresses
/// need no entry here, since they already act as the account the operator mapped them
/// to (`user:<username>`). An identity with no entry is its own account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identities {
    /// Principal id → the account's id (`user:<username>`).
    accounts: BTreeMap<String, String>,
}

impl Identities {
    /// From `(principal id, username)` pairs, each checked; a principal id is a token's
    /// (`token:`) or an OS user's (`local:`), since a dashboard account is itself.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, CoreError> {
        let mut accounts = BTreeMap::new();
        for (identity, username) in pairs {
            check_principal_id("accounts", &identity)?;
            if identity.starts_with("user:") {
                return Err(CoreError::invalid(
                    "accounts",
                    format!(
                        "{identity} is a dashboard account already; map tokens and OS users to accounts"
                    ),
                ));
            }
            let account = format!("user:{}", username.trim());
            check_principal_id("accounts", &account).map_err(|_| {
                CoreError::invalid(
                    "accounts",
                    format!("{username:?} (for {identity}) is not a dashboard username"),
                )
            })?;
            accounts.insert(identity, account);
        }
        Ok(Self { accounts })
    }

    /// The account `principal` (an id) counts as: its dashboard account's id, or itself.
    pub fn account_of<'a>(&'a self, principal: &'a str) -> &'a str {
        self.accounts
            .get(principal)
            .map_or(principal, String::as_str)
    }

    /// How many identities are mapped.
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_map_to_accounts_and_the_rest_count_as_themselves() {
        let ids = Identities::new([
            ("token:alice-laptop".to_string(), "alice".to_string()),
            ("local:al".to_string(), "alice".to_string()),
        ])
        .unwrap_or_default();
        assert_eq!(ids.account_of("token:alice-laptop"), "user:alice");
        assert_eq!(ids.account_of("local:al"), "user:alice");
        assert_eq!(ids.account_of("user:alice"), "user:alice");
        assert_eq!(ids.account_of("token:bob"), "token:bob");
        for (identity, username, says) in [
            ("alice-laptop", "alice", "not a principal id"),
            ("user:bob", "alice", "dashboard account already"),
            ("token:x", "two words", "not a dashboard username"),
        ] {
            let err = Identities::new([(identity.to_string(), username.to_string())])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(says), "{identity}: {err}");
        }
    }

    fn groups() -> Groups {
        Groups::new(BTreeMap::from([(
            "ops".to_string(),
            vec!["token:deploy-bot".to_string(), "user:alice".to_string()],
        )]))
        .unwrap()
    }

    #[test]
    fn groups_hold_principal_ids_and_are_checked() {
        let g = groups();
        assert!(g.contains("ops", "token:deploy-bot"));
        assert!(!g.contains("ops", "token:other"));
        assert!(!g.contains("nope", "user:alice"));
        assert!(g.matches("group:ops", "user:alice"));
        assert!(g.matches("token:x", "token:x"));
        assert!(!g.matches("group:ops", "token:x"));
        let bad = Groups::new(BTreeMap::from([(
            "ops".to_string(),
            vec!["alice".to_string()],
        )]));
        assert!(bad.unwrap_err().to_string().contains("not a principal id"));
        let bad = Groups::new(BTreeMap::from([("Ops Team".to_string(), vec![])]));
        assert!(bad.unwrap_err().to_string().contains("not a group name"));
    }

    #[test]
    fn lists_name_known_groups_and_real_principals() {
        let g = groups();
        assert_eq!(
            g.check_list(
                "allowed",
                &["token:b".into(), "group:ops".into(), "token:b".into()]
            )
            .unwrap(),
            ["group:ops", "token:b"]
        );
        let err = g.check_list("allowed", &["group:dev".into()]).unwrap_err();
        assert!(err.to_string().contains("no group \"dev\""), "{err}");
        assert!(g.check_list("allowed", &["bot".into()]).is_err());
        assert!(g.check_list("allowed", &["token:".into()]).is_err());
    }
}
