//! Who is in a room and what they say they are doing: joining, leaving, being removed,
//! presence, and the activity every post refreshes.

use countersign_core::rooms::{
    self, Member, Presence, Room, member_event, presence_event, roster_order,
};
use countersign_core::{Decider, EventKind, Principal};
use countersign_store::{Docs, Step};

use super::{MemberDocs, Rooms};
use crate::error::GateError;
use crate::ids::new_salt;

fn member_id(room: &str, who: &str) -> String {
    format!("{room}/{who}")
}

impl Rooms {
    fn members_docs(&self) -> Docs<'_, MemberDocs> {
        Docs::new(&*self.store)
    }

    /// A room's members, who needs a human first.
    pub async fn members(&self, room: &str) -> Result<Vec<Member>, GateError> {
        let room = rooms::room_name(room)?;
        let mut members: Vec<Member> = self
            .members_docs()
            .list(&format!("{room}/"), 10_000)
            .await?
            .into_iter()
            .map(|m| m.body)
            .collect();
        roster_order(&mut members);
        Ok(members)
    }

    /// The member's own activity in `room` (joining it if new), with the presence or
    /// note it states.
    pub(super) async fn touch(
        &self,
        who: &Principal,
        room: &str,
        status: Option<Presence>,
        note: Option<String>,
    ) -> Result<Member, GateError> {
        let now = self.now();
        let joined = self
            .members_docs()
            .modify(&member_id(room, &who.id), now, |current| {
                Ok::<_, GateError>(match current {
                    Some(stored) => {
                        let mut member = stored.body.clone();
                        if member.touch(status, note.clone(), now) {
                            Step::Write {
                                body: member.clone(),
                                event: None,
                                then: (member, false),
                            }
                        } else {
                            Step::Done((member, false))
                        }
                    }
                    None => {
                        let member = Member::new(room, who, status, note.clone(), now);
                        let event = member_event(EventKind::MemberJoined, room, who, &who.id, now);
                        Step::Write {
                            body: member.clone(),
                            event: Some(event.seal(new_salt()?)),
                            then: (member, true),
                        }
                    }
                })
            })
            .await?;
        if joined.1 {
            self.feed.poke();
        }
        Ok(joined.0)
    }

    /// Moves member `id` from `from` back to working (without counting it as the
    /// member's own activity). A member who has moved on, or left, is left alone.
    pub(super) async fn release(
        &self,
        room: &str,
        id: &str,
        from: Presence,
    ) -> Result<(), GateError> {
        let released = self
            .members_docs()
            .modify(&member_id(room, id), self.now(), |current| {
                Ok::<_, GateError>(match current {
                    Some(stored) => {
                        let mut member = stored.body.clone();
                        if member.release(from) {
                            Step::Write {
                                body: member,
                                event: None,
                                then: true,
                            }
                        } else {
                            Step::Done(false)
                        }
                    }
                    None => Step::Done(false),
                })
            })
            .await?;
        if released {
            self.feed.poke();
        }
        Ok(())
    }

    pub async fn join(&self, who: &Principal, room: &str) -> Result<(Room, Member), GateError> {
        let room = self.open_room(who, room).await?;
        let member = self.touch(who, &room.name, None, None).await?;
        Ok((room, member))
    }

    pub async fn leave(&self, who: &Principal, room: &str) -> Result<(), GateError> {
        let room = self.existing(room).await?;
        if self
            .members_docs()
            .delete(&member_id(&room.name, &who.id))
            .await?
        {
            self.append(member_event(
                EventKind::MemberLeft,
                &room.name,
                who,
                &who.id,
                self.now(),
            ))
            .await?;
        }
        Ok(())
    }

    /// Removes `member` (a principal id) from the room. People who decide only.
    pub async fn kick(&self, who: &Decider, room: &str, member: &str) -> Result<(), GateError> {
        let room = self.existing(room).await?;
        if !self
            .members_docs()
            .delete(&member_id(&room.name, member))
            .await?
        {
            return Err(GateError::NotFound(format!(
                "member {member} of room {}",
                room.name
            )));
        }
        self.append(member_event(
            EventKind::MemberKicked,
            &room.name,
            who.principal(),
            member,
            self.now(),
        ))
        .await?;
        Ok(())
    }

    pub async fn set_presence(
        &self,
        who: &Principal,
        room: &str,
        status: Presence,
        note: Option<String>,
    ) -> Result<Member, GateError> {
        let room = self.open_room(who, room).await?;
        let note = note.map(|n| rooms::message_text("note", &n)).transpose()?;
        // Each presence change is a log entry too: limited like a message.
        self.rate.take(&who.id)?;
        let member = self
            .touch(who, &room.name, Some(status), note.clone())
            .await?;
        self.append(presence_event(
            &room.name,
            who,
            status,
            note.as_deref(),
            self.now(),
        ))
        .await?;
        Ok(member)
    }
}
