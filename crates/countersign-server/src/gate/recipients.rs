//! Who an agent may have told about its request. The configured routes are always told
//! (`[notify] default_routes`); a request may name more recipients (`recipient_email`,
//! `recipient_slack`), but only people the operator knows as approvers: an address or
//! Slack id mapped to a dashboard account that may decide, or one the operator listed.
//! Anything else is refused before the request exists, so the server's own From address
//! never carries an agent's text to a stranger.

use std::collections::BTreeMap;

use countersign_core::{ApprovalRequest, CoreError};

use super::Gate;
use crate::error::GateError;

/// The recipients a request may name, besides the routes that are always told. Built by
/// the binary from the channels' settings (`NotifyConfig::recipients`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipients {
    /// Email address (lowercase) → the dashboard account it belongs to, which must be
    /// an active approver or admin; `None` for an address the operator listed.
    pub email: BTreeMap<String, Option<String>>,
    /// Slack user or channel → the dashboard account it belongs to, as for `email`.
    pub slack: BTreeMap<String, Option<String>>,
}

impl Recipients {
    /// The approvers' addresses and Slack ids: names that read as a person's.
    pub fn people(&self) -> impl Iterator<Item = String> + '_ {
        let mapped = |map: &'_ BTreeMap<String, Option<String>>| {
            map.iter()
                .filter(|(_, account)| account.is_some())
                .map(|(to, _)| to.clone())
                .collect::<Vec<_>>()
        };
        mapped(&self.email).into_iter().chain(mapped(&self.slack))
    }
}

impl Gate {
    /// Refuses a recipient of the (validated) new request that is not a known approver,
    /// naming the field.
    pub(super) async fn check_recipients(
        &self,
        request: &ApprovalRequest,
    ) -> Result<(), GateError> {
        let known = &self.settings.recipients;
        let named = [
            (
                "recipient_email",
                request.recipient_email.as_deref().map(str::to_lowercase),
                &known.email,
                "an address mapped to a dashboard account in [email.approvers]",
            ),
            (
                "recipient_slack",
                request.recipient_slack.clone(),
                &known.slack,
                "a Slack user mapped to a dashboard account in [slack.approvers]",
            ),
        ];
        for (field, to, allowed, mapped) in named {
            let Some(to) = to else {
                continue;
            };
            let approver = match allowed.get(&to) {
                None => false,
                Some(None) => true,
                Some(Some(username)) => self
                    .accounts
                    .user_by_name(username)
                    .await?
                    .is_some_and(|u| u.may_decide()),
            };
            if !approver {
                return Err(CoreError::invalid(
                    field,
                    format!(
                        "{to:?} is not a known approver on this server: name {mapped} (an active approver), or one the operator listed in [notify] allowed_recipients; the configured routes are told in any case, so you may leave it out"
                    ),
                )
                .into());
            }
        }
        Ok(())
    }
}
