//! Why a request is decided the way it is, as the dashboard shows it: the policies that
//! sent it to a person or decided it, with their requirements and, when the set that
//! acted is the one in force, their text. Only the dashboard serves it: policy text is the
//! operator's, and an agent has no business reading the rules it is held to.

use countersign_core::{ApprovalRequest, AuthorizationType, Timestamp};
use countersign_policy::{PolicySet, Requirements};
use serde::Serialize;

/// How policies took part in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhyKind {
    /// Matching permits with requirements sent it to people.
    Held,
    /// A policy decided it at once (`authorization_type: policy`).
    Policy,
    /// Nobody decided in time and a policy's `@on_timeout` decided (`fallback`).
    Fallback,
    /// Made while a set was in force, and no policy in it held or decided it: one
    /// person decides, as without policies.
    NoMatch,
}

/// The dashboard's answer to "why a person, or why not".
#[derive(Debug, Clone, Serialize)]
pub struct WhyView {
    pub kind: WhyKind,
    /// The policy set that acted (for `no_match`: the one in force), `sha256:<hex>`.
    pub policy_set: String,
    /// Whether that set is the one in force. When it is not, the policies' text is in the
    /// log's `policy_set_loaded` entry with this digest, not here.
    pub in_force: bool,
    /// The policies that held or decided it, in the order the request records them.
    pub policies: Vec<WhyPolicy>,
}

/// One policy behind a request.
#[derive(Debug, Clone, Serialize)]
pub struct WhyPolicy {
    pub id: String,
    /// `permit` or `forbid` (known while its set is in force).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<&'static str>,
    /// `@reason`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its requirement annotations (`@timeout_hours`, `@on_timeout`).
    #[serde(skip_serializing_if = "Requirements::is_empty")]
    pub requirements: Requirements,
    /// The policy as written (while its set is in force).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl WhyView {
    /// Why `request` is decided as it is, against the set `in_force`, whose version was
    /// first logged at `since`. `None`: policies had no part in it, or none are in force
    /// (then the dashboard shows nothing about policies).
    pub fn of(
        request: &ApprovalRequest,
        in_force: &PolicySet,
        since: Option<Timestamp>,
    ) -> Option<Self> {
        // A standing grant approved it: its decision names the grant, not a policy.
        if request
            .decision
            .as_ref()
            .is_some_and(|d| d.authorization_type == AuthorizationType::Grant)
        {
            return None;
        }
        let by_rule = request
            .decision
            .as_ref()
            .and_then(|d| match d.authorization_type {
                AuthorizationType::Human => None,
                kind => d.policy.as_ref().map(|p| (kind, p)),
            });
        if let Some((kind, policy)) = by_rule {
            let (kind, ids) = match (kind, &request.policy) {
                // A fallback names the holding policies joined by commas; the hold has
                // them one by one.
                (AuthorizationType::Fallback, Some(hold)) => {
                    (WhyKind::Fallback, hold.policies.clone())
                }
                (AuthorizationType::Fallback, None) => (WhyKind::Fallback, vec![policy.id.clone()]),
                _ => (WhyKind::Policy, vec![policy.id.clone()]),
            };
            return Some(Self::acted(kind, &policy.policy_set, &ids, in_force));
        }
        if let Some(hold) = &request.policy {
            return Some(Self::acted(
                WhyKind::Held,
                &hold.policy_set,
                &hold.policies,
                in_force,
            ));
        }
        // Made before this version was in force: what was in force then is not known
        // here, so say nothing rather than something untrue.
        if in_force.is_empty() || since.is_none_or(|since| request.requested_at < since) {
            return None;
        }
        Some(Self {
            kind: WhyKind::NoMatch,
            policy_set: in_force.digest().to_string(),
            in_force: true,
            policies: Vec::new(),
        })
    }

    fn acted(kind: WhyKind, digest: &str, ids: &[String], in_force: &PolicySet) -> Self {
        let current = digest == in_force.digest();
        let policies = ids
            .iter()
            .map(|id| match in_force.policy(id).filter(|_| current) {
                Some(p) => WhyPolicy {
                    id: id.clone(),
                    effect: Some(p.effect),
                    reason: p.reason.clone(),
                    requirements: p.requirements.clone(),
                    text: Some(p.text.clone()),
                },
                None => WhyPolicy {
                    id: id.clone(),
                    effect: None,
                    reason: None,
                    requirements: Requirements::default(),
                    text: None,
                },
            })
            .collect();
        Self {
            kind,
            policy_set: digest.to_string(),
            in_force: current,
            policies,
        }
    }

    /// The short form a list shows: the kind and the ids, without the text.
    pub fn brief(mut self) -> Self {
        for policy in &mut self.policies {
            policy.text = None;
            policy.reason = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::{
        Limits, NewRequest, PolicyHold, PolicyRef, Principal, Role, Signer, Verdict,
    };
    use countersign_policy::{OnTimeout, PolicyFile};

    const TEXT: &str = r#"@id("big")
@timeout_hours("4")
@on_timeout("reject")
permit(principal, action == Action::"refund", resource);"#;

    fn set(text: &str) -> PolicySet {
        PolicySet::load(vec![PolicyFile {
            name: "p.cedar".into(),
            text: text.into(),
        }])
        .unwrap()
    }

    fn request_at(at: &str) -> ApprovalRequest {
        let new = NewRequest {
            description: "Refund".into(),
            ..NewRequest::default()
        };
        let agent = Principal::from_token("bot", Role::Agent);
        ApprovalRequest::create(
            "req_1".into(),
            new,
            &agent,
            self::at(at),
            &Limits::default(),
        )
        .unwrap()
        .request
    }

    /// `request` decided by a rule.
    fn ruled(
        request: &ApprovalRequest,
        kind: AuthorizationType,
        id: &str,
        set: &str,
    ) -> ApprovalRequest {
        let policy = PolicyRef {
            id: id.into(),
            policy_set: set.into(),
        };
        let signer = Signer::from_seed([9; 32]);
        request
            .decide_by_rule(
                Verdict::Rejected,
                kind,
                policy,
                request.requested_at,
                "n".into(),
                &signer,
            )
            .unwrap()
            .request
    }

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
    }

    #[test]
    fn a_held_request_names_its_policies_with_text_while_their_set_is_in_force() {
        let set = set(TEXT);
        let mut request = request_at("2026-01-02T00:00:00.000Z");
        request.policy = Some(PolicyHold {
            policy_set: set.digest().into(),
            policies: vec!["big".into()],
            on_timeout: Some(Verdict::Rejected),
        });
        let why = WhyView::of(&request, &set, None).unwrap();
        assert_eq!(why.kind, WhyKind::Held);
        assert!(why.in_force);
        assert_eq!(why.policies[0].id, "big");
        assert_eq!(why.policies[0].text.as_deref(), Some(TEXT));
        assert_eq!(why.policies[0].requirements.timeout_hours, Some(4.0));
        assert_eq!(
            why.policies[0].requirements.on_timeout,
            Some(OnTimeout::Reject)
        );
        assert_eq!(why.clone().brief().policies[0].text, None);

        // Another version in force: the digest and ids, no text that is not the one.
        let newer = self::set(&TEXT.replace('4', "5"));
        let why = WhyView::of(&request, &newer, None).unwrap();
        assert!(!why.in_force);
        assert_eq!(why.policy_set, set.digest());
        assert_eq!(why.policies[0].text, None);
        assert_eq!(why.policies[0].effect, None);
    }

    #[test]
    fn a_fallback_names_each_holding_policy_and_a_rule_its_one() {
        let set = set(TEXT);
        let mut request = request_at("2026-01-02T00:00:00.000Z");
        request.policy = Some(PolicyHold {
            policy_set: set.digest().into(),
            policies: vec!["big".into(), "other".into()],
            on_timeout: Some(Verdict::Rejected),
        });
        let request = ruled(
            &request,
            AuthorizationType::Fallback,
            "big,other",
            set.digest(),
        );
        let why = WhyView::of(&request, &set, None).unwrap();
        assert_eq!(why.kind, WhyKind::Fallback);
        let ids: Vec<_> = why.policies.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["big", "other"]);
        assert!(why.policies[1].text.is_none(), "not a policy of the set");

        let fresh = request_at("2026-01-02T00:00:00.000Z");
        let request = ruled(&fresh, AuthorizationType::Policy, "big", set.digest());
        let why = WhyView::of(&request, &set, None).unwrap();
        assert_eq!(why.kind, WhyKind::Policy);
        assert_eq!(why.policies[0].effect, Some("permit"));
    }

    #[test]
    fn no_match_only_for_requests_made_under_the_set_in_force() {
        let set = set(TEXT);
        let since = Some(at("2026-01-01T00:00:00.000Z"));
        let after = request_at("2026-01-02T00:00:00.000Z");
        let before = request_at("2025-12-31T00:00:00.000Z");
        let why = WhyView::of(&after, &set, since).unwrap();
        assert_eq!(why.kind, WhyKind::NoMatch);
        assert_eq!(why.policy_set, set.digest());
        assert!(WhyView::of(&before, &set, since).is_none());
        assert!(WhyView::of(&after, &set, None).is_none());
        assert!(WhyView::of(&after, &PolicySet::empty(), since).is_none());
    }
}
