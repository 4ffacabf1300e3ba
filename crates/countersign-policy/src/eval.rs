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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    RestrictedExpression,
};
use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::Serialize;

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
        let action_name = input.tool.unwrap_or(crate::DEFAULT_ACTION);
        let set = self.by_action.get(action_name).unwrap_or(&self.any_action);
        if set.is_empty() {
            return no_match();
        }
        let (request, entities) = match cedar_request(input, action_name) {
            Ok(built) => built,
            // Only a detail Cedar cannot represent gets here; people decide.
            Err(e) => {
                return Evaluation {
                    outcome: Outcome::Person {
                        policies: Vec::new(),
                        requirements: Requirements::default(),
                    },
                    matched: Vec::new(),
                    errors: vec![e],
                };
            }
        };
        let response = Authorizer::new().is_authorized(&request, set, &entities);
        let mut matched: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| id.to_string())
            .collect();
        matched.sort();
        let errors: Vec<(String, String)> = response
            .diagnostics()
            .errors()
            .map(|e| {
                let cedar_policy::AuthorizationError::PolicyEvaluationError(e) = e;
                (e.policy_id().to_string(), e.inner().to_string())
            })
            .collect();
        let error_texts = errors
            .iter()
            .map(|(id, e)| format!("{id}: {e}"))
            .collect::<Vec<_>>();
        let effect = |id: &str| self.info.get(id).map(|i| i.effect);

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

fn no_match() -> Evaluation {
    Evaluation {
        outcome: Outcome::NoMatch,
        matched: Vec::new(),
        errors: Vec::new(),
    }
}

fn uid(ty: &str, id: &str) -> Result<EntityUid, String> {
    let ty = EntityTypeName::from_str(ty).map_err(|e| e.to_string())?;
    let id = EntityId::from_str(id).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(ty, id))
}

fn cedar_request(
    input: &Input<'_>,
    action: &str,
) -> Result<(cedar_policy::Request, Entities), String> {
    let principal = uid("Agent", input.agent)?;
    let parents: HashSet<EntityUid> = input
        .groups
        .iter()
        .map(|g| uid("Group", g))
        .collect::<Result<_, _>>()?;
    let agent = Entity::new(
        principal.clone(),
        HashMap::from([(
            "name".to_string(),
            RestrictedExpression::new_string(input.agent.to_string()),
        )]),
        parents,
    )
    .map_err(|e| e.to_string())?;
    let resource = uid("Server", input.resource)?;
    let entities = Entities::from_entities(
        [
            agent,
            Entity::new_no_attrs(resource.clone(), HashSet::new()),
        ],
        None,
    )
    .map_err(|e| e.to_string())?;

    let mut text = Vec::new();
    let mut numbers = Vec::new();
    let mut decimals = Vec::new();
    for (key, value) in input.details {
        text.push((key.clone(), RestrictedExpression::new_string(value.clone())));
        if let Some(n) = as_long(value) {
            numbers.push((key.clone(), RestrictedExpression::new_long(n)));
        }
        if let Some(d) = as_decimal(value) {
            decimals.push((key.clone(), RestrictedExpression::new_decimal(d)));
        }
    }
    let record = |pairs: Vec<(String, RestrictedExpression)>| {
        RestrictedExpression::new_record(pairs).map_err(|e| e.to_string())
    };
    let local = input.now.with_timezone(&input.zone);
    let long = |n: u32| RestrictedExpression::new_long(i64::from(n));
    let time = record(vec![
        ("hour".into(), long(local.hour())),
        ("minute".into(), long(local.minute())),
        ("weekday".into(), long(local.weekday().number_from_monday())),
        (
            "date".into(),
            RestrictedExpression::new_string(local.format("%Y-%m-%d").to_string()),
        ),
        (
            "zone".into(),
            RestrictedExpression::new_string(input.zone.name().to_string()),
        ),
    ])?;
    let count = |n: u64| RestrictedExpression::new_long(i64::try_from(n).unwrap_or(i64::MAX));
    let agent_counts = record(vec![
        ("pending".into(), count(input.pending)),
        ("recent".into(), count(input.recent)),
    ])?;
    let mut pairs = vec![
        (
            "description".to_string(),
            RestrictedExpression::new_string(input.description.to_string()),
        ),
        ("input".to_string(), record(text)?),
        ("number".to_string(), record(numbers)?),
        ("decimal".to_string(), record(decimals)?),
        ("time".to_string(), time),
        ("agent".to_string(), agent_counts),
        (
            "gateway".to_string(),
            RestrictedExpression::new_bool(input.gateway),
        ),
    ];
    if let Some(room) = input.room {
        pairs.push((
            "room".to_string(),
            RestrictedExpression::new_string(room.to_string()),
        ));
    }
    let context = Context::from_pairs(pairs).map_err(|e| e.to_string())?;
    let request =
        cedar_policy::Request::new(principal, uid("Action", action)?, resource, context, None)
            .map_err(|e| e.to_string())?;
    Ok((request, entities))
}

/// A whole number, written plainly ("250", "-3"; not "+3", "007" or "1e3").
fn as_long(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if plain { s.parse().ok() } else { None }
}

/// Cedar's decimal: at most four places, within i64 at that scale. Whole numbers count
/// ("250" is `decimal("250.0")`), so one comparison covers "250" and "249.99".
fn as_decimal(s: &str) -> Option<String> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, "0"),
    };
    as_long(whole).or_else(|| (whole == "-0").then_some(0))?;
    if frac.is_empty() || frac.len() > 4 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let text = format!("{whole}.{frac}");
    // Cedar refuses values outside its range; check here so that evaluation never fails.
    let scaled = format!("{whole}{frac:0<4}");
    scaled.parse::<i64>().ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_recognised_plainly() {
        assert_eq!(as_long("250"), Some(250));
        assert_eq!(as_long("-3"), Some(-3));
        assert_eq!(as_long("0"), Some(0));
        for not in [
            "",
            "-",
            "+3",
            "007",
            "1e3",
            "12.5",
            " 4",
            "99999999999999999999",
        ] {
            assert_eq!(as_long(not), None, "{not:?}");
        }
        assert_eq!(as_decimal("12.50").as_deref(), Some("12.50"));
        assert_eq!(as_decimal("250").as_deref(), Some("250.0"));
        assert_eq!(as_decimal("-0.5").as_deref(), Some("-0.5"));
        for not in ["1.23456", "1.", ".5", "abc", "922337203685478.0"] {
            assert_eq!(as_decimal(not), None, "{not:?}");
        }
    }
}
