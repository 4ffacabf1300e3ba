//! The settings that keep one agent from crowding out the others: `[groups]` (who a
//! room may be restricted to), `[rooms]` (how fast a token may post), `[limits]` (how
//! many requests one requester may have pending, how many notifications one
//! requester's requests send before they are summed up in a digest). File only: these
//! are an operator's decisions, not a process's.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use countersign_core::{Groups, Identities};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomsSection {
    /// Messages one principal may post per minute, across rooms (0: no limit).
    pub messages_per_minute: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Requests one requester may have pending at once.
    pub pending_per_agent: Option<usize>,
    /// New-request notifications sent for one requester per window; beyond them, one
    /// digest per route and window says how many more wait.
    pub notifications_per_agent: Option<u32>,
    /// The window, in minutes (default 10).
    pub notification_window_minutes: Option<u64>,
    /// Whether `request_approval` may ask for its own quorum (`approvals`, `approvers`).
    pub request_quorum: Option<bool>,
}

/// What the three sections resolve to.
#[derive(Debug, Clone, PartialEq)]
pub struct Guards {
    pub groups: Groups,
    /// `[tokens] accounts` and `[cli] accounts`: the account each identity counts as.
    pub identities: Identities,
    pub room_messages_per_minute: u32,
    pub pending_per_agent: Option<usize>,
    pub request_quorum: bool,
    pub digest: Option<countersign_server::notify::DigestConfig>,
}

/// The identities `[tokens] accounts` (token name → username) and `[cli] accounts` (OS
/// user → username) map to dashboard accounts.
pub fn identities(
    tokens: &BTreeMap<String, String>,
    os_users: &BTreeMap<String, String>,
) -> anyhow::Result<Identities> {
    let tokens = tokens
        .iter()
        .map(|(name, user)| (format!("token:{name}"), user.clone()));
    let os_users = os_users
        .iter()
        .map(|(name, user)| (format!("local:{name}"), user.clone()));
    Identities::new(tokens.chain(os_users))
        .map_err(anyhow::Error::msg)
        .context("[tokens] accounts / [cli] accounts")
}

pub fn resolve(
    groups: Option<BTreeMap<String, Vec<String>>>,
    identities: Identities,
    rooms: Option<RoomsSection>,
    limits: Option<LimitsSection>,
) -> anyhow::Result<Guards> {
    let groups = Groups::new(groups.unwrap_or_default())
        .map_err(anyhow::Error::msg)
        .context("[groups]")?;
    let room_messages_per_minute = rooms
        .and_then(|r| r.messages_per_minute)
        .unwrap_or(countersign_server::rooms::DEFAULT_MESSAGES_PER_MINUTE);
    let limits = limits.unwrap_or_default();
    if limits.pending_per_agent == Some(0) {
        bail!(
            "[limits] pending_per_agent = 0 would refuse every request; leave it out for no limit"
        );
    }
    let digest = match (
        limits.notifications_per_agent,
        limits.notification_window_minutes,
    ) {
        (None, Some(_)) => {
            bail!("[limits] notification_window_minutes needs notifications_per_agent")
        }
        (None, None) => None,
        (Some(per_agent), window) => {
            let window = window.unwrap_or(10);
            if !(1..=24 * 60).contains(&window) {
                bail!("[limits] notification_window_minutes must be between 1 and 1440");
            }
            Some(countersign_server::notify::DigestConfig {
                per_agent,
                window_seconds: window * 60,
            })
        }
    };
    Ok(Guards {
        groups,
        identities,
        room_messages_per_minute,
        pending_per_agent: limits.pending_per_agent,
        request_quorum: limits.request_quorum.unwrap_or(false),
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_resolve_with_their_defaults_and_bounds() {
        let guards = resolve(None, Identities::default(), None, None).unwrap();
        assert_eq!(
            guards.room_messages_per_minute,
            countersign_server::rooms::DEFAULT_MESSAGES_PER_MINUTE
        );
        assert_eq!((guards.pending_per_agent, guards.digest), (None, None));

        let groups = BTreeMap::from([("ops".to_string(), vec!["token:bot".to_string()])]);
        let guards = resolve(
            Some(groups),
            Identities::default(),
            Some(RoomsSection {
                messages_per_minute: Some(5),
            }),
            Some(LimitsSection {
                pending_per_agent: Some(3),
                notifications_per_agent: Some(2),
                notification_window_minutes: None,
                request_quorum: None,
            }),
        )
        .unwrap();
        assert!(guards.groups.contains("ops", "token:bot"));
        assert_eq!(guards.room_messages_per_minute, 5);
        assert_eq!(guards.pending_per_agent, Some(3));
        assert_eq!(
            guards.digest,
            Some(countersign_server::notify::DigestConfig {
                per_agent: 2,
                window_seconds: 600
            })
        );

        let bad = BTreeMap::from([("ops".to_string(), vec!["bot".to_string()])]);
        let err = resolve(Some(bad), Identities::default(), None, None).unwrap_err();
        assert!(format!("{err:#}").contains("not a principal id"), "{err:#}");
        let zero = LimitsSection {
            pending_per_agent: Some(0),
            ..LimitsSection::default()
        };
        assert!(resolve(None, Identities::default(), None, Some(zero)).is_err());
    }

    #[test]
    fn tokens_and_os_users_map_to_accounts() {
        let tokens = BTreeMap::from([("alice-laptop".to_string(), "alice".to_string())]);
        let os = BTreeMap::from([("al".to_string(), "alice".to_string())]);
        let ids = identities(&tokens, &os).unwrap();
        assert_eq!(ids.account_of("token:alice-laptop"), "user:alice");
        assert_eq!(ids.account_of("local:al"), "user:alice");
        let bad = BTreeMap::from([("x".to_string(), "not a name".to_string())]);
        let err = identities(&bad, &BTreeMap::new()).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("[tokens] accounts") && err.contains("not a dashboard username"),
            "{err}"
        );
    }
}
