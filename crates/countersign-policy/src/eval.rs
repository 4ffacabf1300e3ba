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

use crate::index::Literal;
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

    /// With `use_index: false`, every policy that may apply to the action is evaluated
    /// (the tests compare the two).
    fn evaluate_indexed(&self, input: &Input<'_>, use_index: bool) -> Evaluation {
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
        // Only the policies whose guard the request meets (index.rs); countersign reads
        // which policies matched and which failed, so the parts' answers add up.
        let authorizer = Authorizer::new();
        let mut matched: Vec<String> = Vec::new();
        let mut errors: Vec<(String, String)> = Vec::new();
        let unindexed;
        let parts: Vec<&cedar_policy::PolicySet> = if use_index {
            set.sets_for(|path| value_at(input, path)).collect()
        } else {
            unindexed = set.unindexed();
            vec![&unindexed]
        };
        for part in parts {
            let response = authorizer.is_authorized(&request, part, &entities);
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
        // Cedar names only the forbids that matched when one did; a part of the index
        // without a forbid named its permits. Keep Cedar's answer for the whole set.
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

fn no_match() -> Evaluation {
    Evaluation {
        outcome: Outcome::NoMatch,
        matched: Vec::new(),
        errors: Vec::new(),
    }
}

/// The entity types a request names.
#[derive(Clone, Copy)]
enum Type {
    Agent,
    Group,
    Server,
    Action,
}

/// `Type::"id"`. The type names are parsed once: Cedar parses a type name with its full
/// parser each time (a few microseconds, several times a request).
fn uid(ty: Type, id: &str) -> Result<EntityUid, String> {
    static NAMES: std::sync::OnceLock<Result<[EntityTypeName; 4], String>> =
        std::sync::OnceLock::new();
    let names = NAMES
        .get_or_init(|| {
            let name = |n: &str| EntityTypeName::from_str(n).map_err(|e| e.to_string());
            Ok([
                name("Agent")?,
                name("Group")?,
                name("Server")?,
                name("Action")?,
            ])
        })
        .as_ref()
        .map_err(Clone::clone)?;
    let id = EntityId::from_str(id).map_err(|e| e.to_string())?;
    Ok(EntityUid::from_type_name_and_id(
        names[ty as usize].clone(),
        id,
    ))
}

/// `decimal("<text>")`, from a cache: Cedar parses the function's name each time it
/// builds one (5 to 6 us, more than the rest of the request together). Per thread, and
/// emptied when full, so it needs no lock and stays small.
fn decimal(text: String) -> RestrictedExpression {
    const MOST: usize = 4096;
    thread_local! {
        static BUILT: std::cell::RefCell<HashMap<String, RestrictedExpression>> =
            std::cell::RefCell::new(HashMap::new());
    }
    BUILT.with(|built| {
        let mut built = built.borrow_mut();
        if let Some(expr) = built.get(&text) {
            return expr.clone();
        }
        if built.len() >= MOST {
            built.clear();
        }
        let expr = RestrictedExpression::new_decimal(&text);
        built.insert(text, expr.clone());
        expr
    })
}

fn cedar_request(
    input: &Input<'_>,
    action: &str,
) -> Result<(cedar_policy::Request, Entities), String> {
    let principal = uid(Type::Agent, input.agent)?;
    let parents: HashSet<EntityUid> = input
        .groups
        .iter()
        .map(|g| uid(Type::Group, g))
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
    let resource = uid(Type::Server, input.resource)?;
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
            decimals.push((key.clone(), decimal(d)));
        }
    }
    let record = |pairs: Vec<(String, RestrictedExpression)>| {
        RestrictedExpression::new_record(pairs).map_err(|e| e.to_string())
    };
    let fields = |pairs: Vec<(&str, Literal)>| {
        record(
            pairs
                .into_iter()
                .map(|(name, value)| (name.to_string(), value.expression()))
                .collect(),
        )
    };
    let time = fields(time_fields(input))?;
    let agent_counts = fields(agent_fields(input))?;
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
    let request = cedar_policy::Request::new(
        principal,
        uid(Type::Action, action)?,
        resource,
        context,
        None,
    )
    .map_err(|e| e.to_string())?;
    Ok((request, entities))
}

/// The value the request's context has at `path` (`["room"]`, `["input", "env"]`), as
/// [`cedar_request`] puts it there; `None` where it has none (or one no guard compares).
fn value_at(input: &Input<'_>, path: &[String]) -> Option<Literal> {
    let field = |fields: Vec<(&str, Literal)>, key: &str| {
        fields
            .into_iter()
            .find(|(name, _)| *name == key)
            .map(|(_, v)| v)
    };
    match path {
        [one] => match one.as_str() {
            "description" => Some(Literal::Str(input.description.to_string())),
            "room" => input.room.map(|r| Literal::Str(r.to_string())),
            "gateway" => Some(Literal::Bool(input.gateway)),
            _ => None,
        },
        [record, key] => match record.as_str() {
            "input" => input.details.get(key).map(|v| Literal::Str(v.clone())),
            "number" => input
                .details
                .get(key)
                .and_then(|v| as_long(v))
                .map(Literal::Long),
            "time" => field(time_fields(input), key),
            "agent" => field(agent_fields(input), key),
            _ => None,
        },
        _ => None,
    }
}

/// `context.time`: the request's time in the configured zone.
fn time_fields(input: &Input<'_>) -> Vec<(&'static str, Literal)> {
    let local = input.now.with_timezone(&input.zone);
    let long = |n: u32| Literal::Long(i64::from(n));
    vec![
        ("hour", long(local.hour())),
        ("minute", long(local.minute())),
        ("weekday", long(local.weekday().number_from_monday())),
        ("date", Literal::Str(local.format("%Y-%m-%d").to_string())),
        ("zone", Literal::Str(input.zone.name().to_string())),
    ]
}

/// `context.agent`: the agent's requests waiting now and made in the last hour.
fn agent_fields(input: &Input<'_>) -> Vec<(&'static str, Literal)> {
    let count = |n: u64| Literal::Long(i64::try_from(n).unwrap_or(i64::MAX));
    vec![
        ("pending", count(input.pending)),
        ("recent", count(input.recent)),
    ]
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
        for i in 0..120u64 {
            let tool = i % 6;
            let policy = match i % 8 {
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
                    [5, 900, 9000][(i % 3) as usize]
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
                // No guard.
                _ => "permit(principal, action, resource) when { context.number has n && context.number.n < 4 };".to_string(),
            };
            text.push_str(&policy);
            text.push('\n');
        }
        text
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
        for case in 0..3000 {
            let tool = format!("t{}", rng.below(8));
            let mut details = BTreeMap::new();
            if rng.below(4) > 0 {
                details.insert("env".to_string(), format!("e{}", rng.below(4)));
            }
            match rng.below(5) {
                0 => {}
                1 => {
                    details.insert("n".to_string(), "9000".to_string());
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
            let input = Input {
                agent: "bot",
                groups: &groups,
                tool: (rng.below(5) > 0).then_some(tool.as_str()),
                resource: crate::RESOURCE,
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
            let evaluated: usize = part
                .sets_for(|path| value_at(&input, path))
                .map(|s| s.policies().count())
                .sum();
            skipped += part.unindexed().policies().count() - evaluated;
        }
        // The cases reach every outcome, with and without failing policies, and the
        // index did skip policies (else this would compare a set with itself).
        assert_eq!(outcomes.len(), 6, "{outcomes:?}");
        assert!(
            skipped > 3000 * 20,
            "only {skipped} policy evaluations skipped"
        );
    }
}
