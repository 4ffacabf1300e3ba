//! One request through the policies: Cedar's answer, and what countersign does with it.
//!
//! - a matching `forbid` rejects at once;
//! - matching `permit`s without requirement annotations approve without a person;
//! - matching `permit`s with requirement annotations send it to people under the
//!   strictest of them (and so do permits without annotations matched alongside them);
//! - nothing matching: one person decides, as without policies.
//!
//! Fail closed: a `forbid` that could not be evaluated (Cedar skips policies that error)
//! keeps a request from being approved by policy; a person decides it.

use std::collections::BTreeMap;

use cedar_policy::Authorizer;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::index::Indexed;
use crate::prefilter::{Facts, Settled};
use crate::request::{Known, cedar_request};
use crate::requirements::Requirements;
use crate::set::PolicySet;

/// What a request is, as the policies see it.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The requesting agent's token name.
    pub agent: &'a str,
    /// The groups the config puts the agent in.
    pub groups: &'a [String],
    /// The tool: the gateway's upstream tool, or the `tool` detail; `None` is
    /// `Action::"request"`.
    pub tool: Option<&'a str>,
    /// The server the action reaches (`RESOURCE` for request_approval).
    pub resource: &'a str,
    /// Whether the gateway holds this call (the tool is certain).
    pub gateway: bool,
    pub description: &'a str,
    pub details: &'a BTreeMap<String, String>,
    pub room: Option<&'a str>,
    pub now: DateTime<Utc>,
    pub zone: chrono_tz::Tz,
    /// The agent's requests waiting now, and made in the last hour (this one excluded).
    pub pending: u64,
    pub recent: u64,
}

/// What the policies say to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A `forbid` matched: rejected at once, by this policy.
    Reject { policy: String },
    /// `permit`s without requirements matched, and nothing else: approved by the first
    /// of them (in id order).
    Approve { policy: String },
    /// People decide under these requirements (policies: those that set them).
    Person {
        policies: Vec<String>,
        requirements: Requirements,
    },
    /// No policy matched: one person decides, as without policies.
    NoMatch,
}

/// An outcome and everything that went into it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Every policy that matched, in id order.
    pub matched: Vec<String>,
    /// Policies that could not be evaluated, with Cedar's reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl PolicySet {
    /// Evaluates one request.
    pub fn evaluate(&self, input: &Input<'_>) -> Evaluation {
        self.evaluate_indexed(input, true)
    }

    /// The same request evaluated by Cedar over every policy that names its action (or
    /// none), without the index or countersign's own tests: what [`Self::evaluate`] must
    /// always equal (the tests and the `policy_eval` fuzz target hold it to that).
    pub fn evaluate_by_cedar_alone(&self, input: &Input<'_>) -> Evaluation {
        self.evaluate_indexed(input, false)
    }

    /// With `use_index: false`, every policy that may apply to the action is evaluated
    /// (the tests compare the two).
    fn evaluate_indexed(&self, input: &Input<'_>, use_index: bool) -> Evaluation {
        let action_name = input.tool.unwrap_or(crate::DEFAULT_ACTION);
        let set = self.by_action.get(action_name).unwrap_or(&self.any_action);
        if set.is_empty() {
            return no_match();
        }
        // Only the policies the request may match (index.rs), and of those, the ones
        // their tests do not settle (prefilter.rs) go to Cedar: the same answer as Cedar
        // over every policy for the action, for much less work.
        let selection = if use_index {
            self.selected(set, input)
        } else {
            Selection {
                cedar: set.every(),
                matched: Vec::new(),
            }
        };
        let mut matched: Vec<String> = selection
            .matched
            .iter()
            .filter_map(|&n| self.policies.get(n as usize))
            .map(|p| p.id().to_string())
            .collect();
        let mut errors: Vec<(String, String)> = Vec::new();
        if !selection.cedar.is_empty() {
            let to_person = |e: String| Evaluation {
                outcome: Outcome::Person {
                    policies: Vec::new(),
                    requirements: Requirements::default(),
                },
                matched: Vec::new(),
                errors: vec![e],
            };
            let (request, entities) = match cedar_request(input, action_name) {
                Ok(built) => built,
                // Only a detail Cedar cannot represent gets here; people decide.
                Err(e) => return to_person(e),
            };
            let part = match self.sets.get(&selection.cedar, &self.policies) {
                Ok(part) => part,
                Err(e) => return to_person(e),
            };
            let response = Authorizer::new().is_authorized(&request, &part, &entities);
            matched.extend(response.diagnostics().reason().map(|id| id.to_string()));
            errors.extend(response.diagnostics().errors().map(|e| {
                let cedar_policy::AuthorizationError::PolicyEvaluationError(e) = e;
                (e.policy_id().to_string(), e.inner().to_string())
            }));
        }
        matched.sort();
        errors.sort();
        let error_texts = errors
            .iter()
            .map(|(id, e)| format!("{id}: {e}"))
            .collect::<Vec<_>>();
        let effect = |id: &str| self.info.get(id).map(|i| i.effect);
        // Cedar names only the forbids that matched when one did.
        if matched.iter().any(|id| effect(id) == Some("forbid")) {
            matched.retain(|id| effect(id) == Some("forbid"));
        }

        if let Some(policy) = matched.iter().find(|id| effect(id) == Some("forbid")) {
            return Evaluation {
                outcome: Outcome::Reject {
                    policy: policy.clone(),
                },
                matched,
                errors: error_texts,
            };
        }
        let forbid_failed = errors.iter().any(|(id, _)| effect(id) == Some("forbid"));
        let permits: Vec<&String> = matched
            .iter()
            .filter(|id| effect(id) == Some("permit"))
            .collect();
        if permits.is_empty() && !forbid_failed {
            return Evaluation {
                matched,
                errors: error_texts,
                ..no_match()
            };
        }
        let with_requirements: Vec<&String> = permits
            .iter()
            .copied()
            .filter(|id| {
                self.info
                    .get(id.as_str())
                    .is_some_and(|i| !i.requirements.is_empty())
            })
            .collect();
        let outcome = if with_requirements.is_empty() && !forbid_failed {
            Outcome::Approve {
                policy: permits.first().map(|p| p.to_string()).unwrap_or_default(),
            }
        } else {
            let requirements = with_requirements
                .iter()
                .filter_map(|id| self.info.get(id.as_str()))
                .map(|i| i.requirements.clone())
                .reduce(|a, b| a.strictest(&b))
                .unwrap_or_default();
            Outcome::Person {
                policies: with_requirements.iter().map(|p| p.to_string()).collect(),
                requirements,
            }
        };
        Evaluation {
            outcome,
            matched,
            errors: error_texts,
        }
    }
}

/// The policies of an action for one request: those only Cedar can settle, and those the
/// tests settled as matching (by number, in order).
pub(crate) struct Selection {
    pub cedar: Vec<u32>,
    pub matched: Vec<u32>,
}

impl PolicySet {
    /// The request's policies: those whose guard it meets, less those whose tests it
    /// fails, split into those the tests settle and those left to Cedar.
    pub(crate) fn selected(&self, set: &Indexed, input: &Input<'_>) -> Selection {
        let facts = Known::of(input);
        let mut selection = Selection {
            cedar: Vec::new(),
            matched: Vec::new(),
        };
        for n in set.candidates(|path| facts.value(path)) {
            let settled = self
                .tests
                .get(n as usize)
                .map_or(Settled::Open, |tests| tests.settle(&facts));
            match settled {
                Settled::False => {}
                Settled::True => selection.matched.push(n),
                Settled::Open => selection.cedar.push(n),
            }
        }
        selection
    }
}

fn no_match() -> Evaluation {
    Evaluation {
        outcome: Outcome::NoMatch,
        matched: Vec::new(),
        errors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// A small deterministic generator, so a failure names the case that made it.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    fn mixed_policies() -> String {
        let mut text = String::new();
        for i in 0..160u64 {
            let tool = i % 6;
            let policy = match i % 9 {
                // Guarded by the room (an optional attribute, tested first).
                0 => format!(
                    "forbid(principal, action, resource) when {{ context has room && context.room == \"r{}\" }};",
                    i % 9
                ),
                // Guarded by a detail, after a `has` on the input record.
                1 => format!(
                    "permit(principal, action == Action::\"t{tool}\", resource) when {{ context.input has env && context.input.env == \"e{}\" && context.number has n && context.number.n > {} }};",
                    i % 3,
                    i % 7
                ),
                // Guarded by a boolean and by the hour, the literal first.
                2 => "forbid(principal, action, resource) when { context.gateway == true && context.description like \"*drop*\" };".to_string(),
                3 => format!(
                    "@timeout_hours(\"1\") permit(principal, action, resource) when {{ {} == context.time.hour }};",
                    i % 24
                ),
                // Fails on a large number (overflow) after its guard: the error must
                // surface exactly as without the index.
                4 => format!(
                    "forbid(principal, action == Action::\"t{tool}\", resource) when {{ context.number has n && context.number.n == {} && context.number.n + 9223372036854775000 > 0 }};",
                    [5, 900, 9000][((i / 9) % 3) as usize]
                ),
                // Guarded by a number, and by the agent's count.
                5 => format!(
                    "permit(principal, action, resource) when {{ context.number has n && context.number.n == {} }};",
                    i % 11
                ),
                6 => format!(
                    "@timeout_hours(\"3\") permit(principal in Group::\"g{}\", action, resource) when {{ context.agent.pending == {} }};",
                    i % 2,
                    i % 3
                ),
                // Thresholds, the literal on either side; and a decimal, after `has`.
                7 => match (i / 9) % 4 {
                    0 => format!(
                        "permit(principal, action == Action::\"t{tool}\", resource) when {{ context.number has n && context.number.n < {} }};",
                        i % 13
                    ),
                    1 => format!(
                        "@timeout_hours(\"2\") permit(principal == Agent::\"bot{}\", action, resource) when {{ {} <= context.time.hour && context.description like \"*drop*\" }};",
                        i % 2,
                        i % 24
                    ),
                    2 => format!(
                        "forbid(principal, action, resource == Server::\"s{}\") when {{ context.decimal has n && context.decimal.n.greaterThanOrEqual(decimal(\"{}.5\")) }};",
                        i % 2,
                        i % 12
                    ),
                    // Two thresholds-and-equalities in a row, under a group.
                    _ => format!(
                        "permit(principal in Group::\"g{}\", action, resource) when {{ context.number has n && context.number.n > {} && context.input has env && context.input.env == \"e1\" }};",
                        i % 3,
                        i % 10
                    ),
                },
                // No guard.
                _ => "permit(principal, action, resource) when { context.number has n && context.number.n < 4 };".to_string(),
            };
            text.push_str(&policy);
            text.push('\n');
        }
        text
    }

    #[test]
    fn an_action_named_twice_is_one_action() {
        // Found by the policy_eval fuzz target: the policy was listed twice for the
        // action, and Cedar refused the set it was put in twice.
        let set = PolicySet::load(vec![crate::PolicyFile {
            name: "twice.cedar".into(),
            text: r#"permit(principal, action in [Action::"t", Action::"t"], resource) unless { context.gateway };"#.into(),
        }])
        .unwrap();
        let details = BTreeMap::new();
        let input = Input {
            agent: "bot",
            groups: &[],
            tool: Some("t"),
            resource: crate::RESOURCE,
            gateway: false,
            description: "",
            details: &details,
            room: None,
            now: DateTime::<Utc>::from_timestamp(1_764_547_200, 0).unwrap(),
            zone: chrono_tz::UTC,
            pending: 0,
            recent: 0,
        };
        for evaluation in [set.evaluate(&input), set.evaluate_by_cedar_alone(&input)] {
            assert_eq!(
                evaluation.outcome,
                Outcome::Approve {
                    policy: "twice.cedar#1".into()
                }
            );
            assert!(evaluation.errors.is_empty(), "{:?}", evaluation.errors);
        }
    }

    #[test]
    fn the_index_changes_no_answer() {
        let set = PolicySet::load(vec![crate::PolicyFile {
            name: "mixed.cedar".into(),
            text: mixed_policies(),
        }])
        .unwrap();
        let mut rng = Lcg(7);
        let mut outcomes = HashSet::new();
        let mut skipped = 0usize;
        let mut settled = 0usize;
        for case in 0..3000 {
            let tool = format!("t{}", rng.below(8));
            let mut details = BTreeMap::new();
            if rng.below(4) > 0 {
                details.insert("env".to_string(), format!("e{}", rng.below(4)));
            }
            match rng.below(5) {
                0 => {}
                1 if rng.below(2) == 0 => {
                    details.insert("n".to_string(), "9000".to_string());
                }
                1 => {
                    details.insert("n".to_string(), format!("{}.75", rng.below(13)));
                }
                2 => {
                    details.insert("n".to_string(), "not a number".to_string());
                }
                _ => {
                    details.insert("n".to_string(), rng.below(14).to_string());
                }
            }
            let room = format!("r{}", rng.below(12));
            let groups = vec![format!("g{}", rng.below(3))];
            let description = if rng.below(3) == 0 {
                "drop the table"
            } else {
                "read"
            };
            let now = DateTime::<Utc>::from_timestamp(1_764_547_200 + rng.below(86_400) as i64, 0)
                .unwrap();
            let agent = format!("bot{}", rng.below(3));
            let resource = format!("s{}", rng.below(3));
            let input = Input {
                agent: &agent,
                groups: &groups,
                tool: (rng.below(5) > 0).then_some(tool.as_str()),
                resource: &resource,
                gateway: rng.below(2) == 0,
                description,
                details: &details,
                room: (rng.below(3) > 0).then_some(room.as_str()),
                now,
                zone: chrono_tz::Europe::Paris,
                pending: rng.below(4),
                recent: 0,
            };
            let indexed = set.evaluate_indexed(&input, true);
            let everything = set.evaluate_indexed(&input, false);
            assert_eq!(indexed, everything, "case {case}: {input:?}");
            outcomes.insert(format!("{:?}", std::mem::discriminant(&indexed.outcome)));
            outcomes.insert(format!("errors:{}", indexed.errors.is_empty()));
            let action = input.tool.unwrap_or(crate::DEFAULT_ACTION);
            let part = set.by_action.get(action).unwrap_or(&set.any_action);
            let selection = set.selected(part, &input);
            skipped += part.every().len() - selection.cedar.len();
            settled += selection.matched.len();
        }
        // The cases reach every outcome, with and without failing policies, and the
        // index did skip policies (else this would compare a set with itself).
        assert_eq!(outcomes.len(), 6, "{outcomes:?}");
        assert!(
            skipped > 3000 * 20,
            "only {skipped} policy evaluations skipped"
        );
        // And settled many matches without Cedar (else only Cedar was compared).
        assert!(
            settled > 3000,
            "only {settled} matches settled without Cedar"
        );
    }
}
