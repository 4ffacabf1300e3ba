//! A room and its members as stored: the rules of naming, trashing, restoring and
//! purging a room, and of a member's presence (what an agent's activity says, and when
//! a person's answer sends it back to work).

use serde::{Deserialize, Serialize};

use super::{Presence, room_name, room_title};
use crate::error::CoreError;
use crate::groups::Groups;
use crate::principal::{Principal, Role};
use crate::time::Timestamp;

/// How often a member's last activity is written, at most: many messages from one agent
/// need not all write its membership.
pub const ACTIVITY_EVERY_MS: i64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Room {
    pub name: String,
    pub title: String,
    pub created_at: Timestamp,
    pub created_by: String,
    /// Soft-deleted (in the trash) since.
    pub deleted_at: Option<Timestamp>,
    /// When its messages' texts were erased (after a backup).
    pub purged_at: Option<Timestamp>,
    /// Who besides its creator and the people who decide may join, read and post:
    /// principal ids and `group:<name>`s. Empty: anyone (an open room).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed: Vec<String>,
}

impl Room {
    /// A new room; its title defaults to its name.
    pub fn new(
        name: &str,
        title: Option<&str>,
        by: &Principal,
        now: Timestamp,
    ) -> Result<Self, CoreError> {
        let name = room_name(name)?;
        let title = room_title(title.unwrap_or(&name))?;
        Ok(Self {
            name,
            title,
            created_at: now,
            created_by: by.id.clone(),
            deleted_at: None,
            purged_at: None,
            allowed: Vec::new(),
        })
    }

    /// Whether the room is restricted to named principals and groups.
    pub fn is_restricted(&self) -> bool {
        !self.allowed.is_empty()
    }

    /// Whether `who` may join, read and post here: anyone in an open room; in a
    /// restricted one, its creator, the people who decide, and those it names (by id
    /// or by group).
    pub fn admits(&self, who: &Principal, groups: &Groups) -> bool {
        self.allowed.is_empty()
            || who.role.may_decide()
            || who.id == self.created_by
            || self
                .allowed
                .iter()
                .any(|entry| groups.matches(entry, &who.id))
    }

    /// Refuses `who` when the room does not admit it.
    pub fn check_admits(&self, who: &Principal, groups: &Groups) -> Result<(), CoreError> {
        if self.admits(who, groups) {
            Ok(())
        } else {
            Err(CoreError::Forbidden(format!(
                "room {} is restricted to named members and {} is not one of them: its creator or an admin can add it",
                self.name, who.id
            )))
        }
    }

    /// Restricts the room to `allowed` (principal ids and `group:<name>`s; empty opens
    /// it to anyone). Only its creator or an admin may. Whether it changed.
    pub fn restrict(
        &mut self,
        by: &Principal,
        allowed: &[String],
        groups: &Groups,
    ) -> Result<bool, CoreError> {
        if by.role != Role::Admin && by.id != self.created_by {
            return Err(CoreError::Forbidden(format!(
                "only the creator of room {} ({}) or an admin may change who may use it",
                self.name, self.created_by
            )));
        }
        let allowed = groups.check_list("allowed", allowed)?;
        if allowed == self.allowed {
            return Ok(false);
        }
        self.allowed = allowed;
        Ok(true)
    }

    /// Refuses a room in the trash: nobody posts or joins there until it is restored.
    pub fn check_open(&self) -> Result<(), CoreError> {
        match self.deleted_at {
            Some(_) => Err(CoreError::Refused(format!(
                "room {} is in the trash; an admin can restore it",
                self.name
            ))),
            None => Ok(()),
        }
    }

    pub fn rename(&mut self, title: &str) -> Result<(), CoreError> {
        self.title = room_title(title)?;
        Ok(())
    }

    /// Moves the room to the trash; false when it already was.
    pub fn trash(&mut self, now: Timestamp) -> bool {
        if self.deleted_at.is_some() {
            return false;
        }
        self.deleted_at = Some(now);
        true
    }

    /// Takes the room out of the trash; false when it was not there.
    pub fn restore(&mut self) -> bool {
        self.deleted_at.take().is_some()
    }

    /// Only a trashed room's texts may be erased.
    pub fn check_purgeable(&self) -> Result<(), CoreError> {
        match self.deleted_at {
            Some(_) => Ok(()),
            None => Err(CoreError::Refused(format!(
                "room {} is not in the trash: delete it first, then purge",
                self.name
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub room: String,
    pub id: String,
    pub display_name: String,
    pub role: Role,
    pub status: Presence,
    pub note: Option<String>,
    pub joined_at: Timestamp,
    pub last_activity: Timestamp,
}

impl Member {
    /// `who` joining `room` (working, unless it says otherwise).
    pub fn new(
        room: &str,
        who: &Principal,
        status: Option<Presence>,
        note: Option<String>,
        now: Timestamp,
    ) -> Self {
        Self {
            room: room.to_string(),
            id: who.id.clone(),
            display_name: who.display_name.clone(),
            role: who.role,
            status: status.unwrap_or(Presence::Working),
            note,
            joined_at: now,
            last_activity: now,
        }
    }

    /// Applies the member's own activity (and the presence or note it states); whether
    /// the membership needs writing. Activity alone is refreshed at most every
    /// [`ACTIVITY_EVERY_MS`].
    pub fn touch(
        &mut self,
        status: Option<Presence>,
        note: Option<String>,
        now: Timestamp,
    ) -> bool {
        let changes = status.is_some_and(|s| s != self.status) || note.is_some();
        if !changes && self.last_activity.millis_until(now) < ACTIVITY_EVERY_MS {
            return false;
        }
        self.last_activity = now;
        if let Some(status) = status {
            self.status = status;
        }
        if note.is_some() {
            self.note = note;
        }
        true
    }

    /// A person answered what the member waited on: back to working, unless it has moved
    /// on from `from` meanwhile. Not the member's own activity. Whether it changed.
    pub fn release(&mut self, from: Presence) -> bool {
        if self.status != from {
            return false;
        }
        self.status = Presence::Working;
        true
    }
}

/// The roster's order: what needs a human first, then the most recently active.
pub fn roster_order(members: &mut [Member]) {
    members.sort_by(|a, b| {
        a.status
            .rank()
            .cmp(&b.status.rank())
            .then(b.last_activity.cmp(&a.last_activity))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn a_room_is_trashed_restored_and_purged_in_that_order() {
        let alice = Principal::user("alice", "Alice", Role::Admin);
        let mut room = Room::new(" Ops ", None, &alice, at(0)).unwrap();
        assert_eq!((room.name.as_str(), room.title.as_str()), ("ops", "ops"));
        assert!(Room::new("no spaces", None, &alice, at(0)).is_err());
        room.check_open().unwrap();
        assert!(
            room.check_purgeable()
                .unwrap_err()
                .to_string()
                .contains("delete it first")
        );
        assert!(room.trash(at(1)));
        assert!(!room.trash(at(2)), "already in the trash");
        assert_eq!(room.deleted_at, Some(at(1)));
        assert!(
            room.check_open()
                .unwrap_err()
                .to_string()
                .contains("in the trash")
        );
        room.check_purgeable().unwrap();
        assert!(room.restore());
        assert!(!room.restore());
        room.rename("Operations").unwrap();
        assert_eq!(room.title, "Operations");
        assert!(room.rename("").is_err());
    }

    #[test]
    fn a_restricted_room_admits_its_creator_deciders_and_those_it_names() {
        use std::collections::BTreeMap;
        let groups = Groups::new(BTreeMap::from([(
            "ops".to_string(),
            vec!["token:deploy-bot".to_string()],
        )]))
        .unwrap();
        let creator = Principal::from_token("lead-bot", Role::Agent);
        let deploy = Principal::from_token("deploy-bot", Role::Agent);
        let other = Principal::from_token("other-bot", Role::Agent);
        let approver = Principal::user("bob", "Bob", Role::Approver);
        let admin = Principal::user("alice", "Alice", Role::Admin);
        let mut room = Room::new("ops", None, &creator, at(0)).unwrap();
        assert!(room.admits(&other, &groups), "open rooms admit anyone");

        let err = room
            .restrict(&other, &["group:ops".into()], &groups)
            .unwrap_err();
        assert!(err.to_string().contains("only the creator"), "{err}");
        let err = room
            .restrict(&approver, &["group:ops".into()], &groups)
            .unwrap_err();
        assert!(err.to_string().contains("or an admin"), "{err}");
        assert!(
            room.restrict(&creator, &["group:nope".into()], &groups)
                .is_err()
        );
        assert!(
            room.restrict(&creator, &["group:ops".into()], &groups)
                .unwrap()
        );
        assert!(
            !room
                .restrict(&creator, &["group:ops".into()], &groups)
                .unwrap()
        );
        assert!(room.is_restricted());
        assert!(room.admits(&deploy, &groups));
        assert!(room.admits(&creator, &groups));
        assert!(room.admits(&approver, &groups));
        assert!(!room.admits(&other, &groups));
        let err = room.check_admits(&other, &groups).unwrap_err();
        assert!(err.to_string().contains("restricted"), "{err}");

        assert!(
            room.restrict(&admin, &[], &groups).unwrap(),
            "an admin opens it"
        );
        assert!(room.admits(&other, &groups));
    }

    #[test]
    fn activity_is_written_when_it_says_something_or_every_few_seconds() {
        let bot = Principal::from_token("bot", Role::Agent);
        let mut member = Member::new("ops", &bot, None, None, at(0));
        assert_eq!(member.status, Presence::Working);
        assert!(
            !member.touch(None, None, at(1_000)),
            "activity alone, too soon"
        );
        assert!(member.touch(None, None, at(ACTIVITY_EVERY_MS)));
        assert_eq!(member.last_activity, at(ACTIVITY_EVERY_MS));
        assert!(member.touch(Some(Presence::Waiting), None, at(ACTIVITY_EVERY_MS + 1)));
        assert!(!member.touch(Some(Presence::Waiting), None, at(ACTIVITY_EVERY_MS + 2)));
        assert!(member.touch(None, Some("reading".into()), at(ACTIVITY_EVERY_MS + 3)));
        assert_eq!(member.note.as_deref(), Some("reading"));

        assert!(
            !member.release(Presence::Blocked),
            "it waits, it is not blocked"
        );
        assert!(member.release(Presence::Waiting));
        assert_eq!(member.status, Presence::Working);
    }

    #[test]
    fn the_roster_puts_who_needs_a_human_first() {
        let member = |name: &str, status, ms| {
            let mut m = Member::new(
                "ops",
                &Principal::from_token(name, Role::Agent),
                Some(status),
                None,
                at(0),
            );
            m.last_activity = at(ms);
            m
        };
        let mut roster = vec![
            member("a", Presence::Working, 5),
            member("b", Presence::Waiting, 1),
            member("c", Presence::Working, 9),
            member("d", Presence::Blocked, 3),
        ];
        roster_order(&mut roster);
        let ids: Vec<&str> = roster.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["token:b", "token:d", "token:c", "token:a"]);
    }
}
