//! Standing grants (core's `grant.rs`): given by a person, alone or with an approval;
//! listed and revoked by approvers; used when a request is made that one covers.
//!
//! The request is stored first (pending); then a use is written (the grant's document,
//! with a `grant_used` entry, by compare-and-swap, so two requests cannot take its last
//! use); then the request's decision. A crash before the use leaves a request for a
//! person; a crash after it loses that use, never grants one more than allowed.

use std::collections::BTreeMap;

use countersign_core::{
    ApprovalRequest, Channel, CoreError, Decider, Grant, NewGrant, Role, Transition,
};
use countersign_store::{Docs, Step, StoreError, collection, kinds};

use super::{Gate, TOOL_DETAIL};
use crate::error::GateError;
use crate::ids::{new_nonce, new_salt, short_id};

collection!(pub(crate) GrantDocs: kinds::GRANT => Grant);

/// How many grants one agent may hold at once (active or not yet pruned): a bound on
/// what a request's creation reads.
const MAX_GRANTS_PER_AGENT: usize = 200;

/// What a person grants along with an approval: the request's agent and tool, for
/// `for_seconds` (default one hour) or `max_uses` uses, pinned to the request's own
/// values of the `exact` details, and within the `max` ceilings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantTerms {
    pub for_seconds: Option<u64>,
    pub max_uses: Option<u32>,
    pub exact: Vec<String>,
    pub max: BTreeMap<String, String>,
}

/// The default length of a grant: one hour.
pub const DEFAULT_GRANT_SECONDS: u64 = 3600;

fn doc_id(agent: &str, id: &str) -> String {
    format!("{agent}/{id}")
}

impl Gate {
    /// The grant `terms` describe for `request`: refused (before anything is decided)
    /// when the request has no tool, lacks a detail to pin, or needed a quorum.
    pub fn grant_for(
        &self,
        request: &ApprovalRequest,
        terms: GrantTerms,
    ) -> Result<NewGrant, GateError> {
        if let Some(quorum) = &request.quorum {
            return Err(GateError::Core(CoreError::Refused(format!(
                "request {} needs {} approvals{}: a grant cannot bypass a quorum",
                request.id,
                quorum.required,
                quorum
                    .group
                    .as_deref()
                    .map(|g| format!(" from {g}"))
                    .unwrap_or_default()
            ))));
        }
        let Some(tool) = request.action.details.get(TOOL_DETAIL) else {
            return Err(GateError::BadInput(format!(
                "request {} names no tool (its `tool` detail), so there is nothing to grant",
                request.id
            )));
        };
        let mut exact = BTreeMap::new();
        for key in terms.exact {
            let Some(value) = request.action.details.get(&key) else {
                return Err(GateError::BadInput(format!(
                    "grant.exact: request {} has no detail {key:?}",
                    request.id
                )));
            };
            exact.insert(key, value.clone());
        }
        Ok(NewGrant {
            agent: request.requested_by.id.clone(),
            tool: tool.clone(),
            exact,
            max: terms.max,
            for_seconds: terms.for_seconds.unwrap_or(DEFAULT_GRANT_SECONDS),
            max_uses: terms.max_uses,
            from_request: Some(request.id.clone()),
        })
    }

    /// Signs `new` as `decider`'s (through `channel`) and stores it, logged. Refused for
    /// the decider's own agent and for bounds out of range.
    pub async fn create_grant(
        &self,
        decider: &Decider,
        new: NewGrant,
        channel: Channel,
    ) -> Result<Grant, GateError> {
        let (grant, event) = self.make_grant(decider, new, channel)?;
        Docs::<GrantDocs>::new(&*self.store)
            .insert(
                &doc_id(&grant.agent, &grant.id),
                Some(grant.id.clone()),
                &grant,
                grant.granted_at,
                Some(&event.seal(new_salt()?)),
            )
            .await?;
        self.feed.poke();
        Ok(grant)
    }

    fn make_grant(
        &self,
        decider: &Decider,
        new: NewGrant,
        channel: Channel,
    ) -> Result<(Grant, countersign_core::Event), GateError> {
        let (maker, agent_account) = self.grant_parties(decider, &new, channel)?;
        let signer = self.keys.signer();
        Ok(new.make(short_id("grt")?, maker, &agent_account, self.now(), &signer)?)
    }

    /// The grant's maker (as an approver through `channel`, with its account) and the
    /// account of its agent; refused for an agent that is not a principal id.
    fn grant_parties(
        &self,
        decider: &Decider,
        new: &NewGrant,
        channel: Channel,
    ) -> Result<(countersign_core::Approver, String), GateError> {
        let well_formed = new.agent.split_once(':').is_some_and(|(kind, name)| {
            !kind.is_empty() && !name.is_empty() && new.agent.len() <= 200
        }) && !new.agent.chars().any(char::is_whitespace);
        if !well_formed {
            return Err(GateError::BadInput(format!(
                "grant.agent: {:?} is not a principal id (token:<name>, stdio:<name>, ...)",
                new.agent
            )));
        }
        let by = decider.principal();
        let identities = &self.settings.identities;
        let maker = countersign_core::Approver {
            account: Some(identities.account_of(&by.id).to_string()),
            ..by.as_approver(channel)
        };
        Ok((maker, identities.account_of(&new.agent).to_string()))
    }

    /// Checks that `decider` could grant `new`, without signing or storing anything (so
    /// that an approval carrying a grant that would be refused is refused before it
    /// decides).
    pub fn check_grant(&self, decider: &Decider, new: &NewGrant) -> Result<(), GateError> {
        let (maker, agent_account) = self.grant_parties(decider, new, Channel::Api)?;
        Ok(new.check(&maker, &agent_account)?)
    }

    /// Every grant, newest first (at most `limit`).
    pub async fn list_grants(
        &self,
        _decider: &Decider,
        limit: usize,
    ) -> Result<Vec<Grant>, GateError> {
        let mut grants: Vec<Grant> = Docs::<GrantDocs>::new(&*self.store)
            .list("", limit)
            .await?
            .into_iter()
            .map(|d| d.body)
            .collect();
        grants.sort_by(|a, b| b.granted_at.cmp(&a.granted_at).then(a.id.cmp(&b.id)));
        Ok(grants)
    }

    /// Revokes grant `id` at once: its maker's account, or an admin.
    pub async fn revoke_grant(&self, decider: &Decider, id: &str) -> Result<Grant, GateError> {
        let docs = Docs::<GrantDocs>::new(&*self.store);
        let Some(found) = docs.by_key(id).await? else {
            return Err(GateError::NotFound(format!("no grant {id}")));
        };
        let by = decider.principal();
        let account = self.settings.identities.account_of(&by.id);
        let maker = found.body.granted_by.account.as_deref() == Some(account);
        if !maker && by.role != Role::Admin {
            return Err(GateError::Forbidden(format!(
                "grant {id} was given by {}: only its maker or an admin may revoke it",
                found.body.granted_by.id
            )));
        }
        let now = self.now();
        let revoked = docs
            .modify(&found.id, now, |current| {
                let Some(current) = current else {
                    return Err(GateError::NotFound(format!("no grant {id}")));
                };
                let (revoked, event) = current.body.revoke(&by.id, now)?;
                Ok(Step::Write {
                    body: revoked.clone(),
                    event: Some(event.seal(new_salt()?)),
                    then: revoked,
                })
            })
            .await?;
        self.feed.poke();
        Ok(revoked)
    }

    /// The decision a live grant gives the stored, pending `request` (the grant's use
    /// already stored), or `None` when no grant covers it.
    pub(crate) async fn approve_by_grant(
        &self,
        request: &ApprovalRequest,
    ) -> Result<Option<Transition>, GateError> {
        let docs = Docs::<GrantDocs>::new(&*self.store);
        let prefix = format!("{}/", request.requested_by.id);
        let grants = docs.list(&prefix, MAX_GRANTS_PER_AGENT).await?;
        if grants.is_empty() {
            return Ok(None);
        }
        let tool = request.action.details.get(TOOL_DETAIL).map(String::as_str);
        let now = self.now();
        for stored in grants {
            if stored.body.why_not(request, tool, now).is_some() {
                continue;
            }
            let used = docs
                .modify(&stored.id, now, |current| {
                    let Some(current) = current else {
                        return Ok(Step::Done(None));
                    };
                    match current.body.use_for(request, tool, now) {
                        Ok((used, event)) => Ok(Step::Write {
                            body: used,
                            event: Some(event.seal(new_salt()?)),
                            // The grant as it covered the request, before this use.
                            then: Some(current.body.clone()),
                        }),
                        // Used up or revoked meanwhile: try the next one.
                        Err(_) => Ok::<_, GateError>(Step::Done(None)),
                    }
                })
                .await;
            let grant = match used {
                Ok(Some(grant)) => grant,
                Ok(None) => continue,
                Err(GateError::Store(StoreError::Unavailable(_))) => continue,
                Err(err) => return Err(err),
            };
            let signer = self.keys.signer();
            let decided = request.decide_by_grant(&grant, tool, now, new_nonce()?, &signer)?;
            return Ok(Some(decided));
        }
        Ok(None)
    }
}
