//! The request as Cedar sees it (its entities and context), and as countersign's own
//! tests read it (`Known`, for the index and the prefilter): both from one [`Input`], so
//! the two agree.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression,
};
use chrono::{DateTime, Datelike, Timelike};

use crate::eval::Input;
use crate::index::Literal;
use crate::prefilter::{Facts, scaled};

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

/// The agent (with its groups as parents) and the resource, as Cedar's entities. The
/// same agent asks again and again: per thread, the last ones built are kept (Cedar
/// computes the hierarchy's closure each time, a sixth of a request's evaluation).
fn entities(
    input: &Input<'_>,
    principal: &EntityUid,
    resource: &EntityUid,
) -> Result<Arc<Entities>, String> {
    type Key = (String, Vec<String>, String);
    const MOST: usize = 1024;
    thread_local! {
        static BUILT: std::cell::RefCell<HashMap<Key, Arc<Entities>>> =
            std::cell::RefCell::new(HashMap::new());
    }
    let key: Key = (
        input.agent.to_string(),
        input.groups.to_vec(),
        input.resource.to_string(),
    );
    if let Some(built) = BUILT.with(|built| built.borrow().get(&key).cloned()) {
        return Ok(built);
    }
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
    let entities = Arc::new(
        Entities::from_entities(
            [
                agent,
                Entity::new_no_attrs(resource.clone(), HashSet::new()),
            ],
            None,
        )
        .map_err(|e| e.to_string())?,
    );
    BUILT.with(|built| {
        let mut built = built.borrow_mut();
        if built.len() >= MOST {
            built.clear();
        }
        built.insert(key, entities.clone());
    });
    Ok(entities)
}

pub(crate) fn cedar_request(
    input: &Input<'_>,
    action: &str,
) -> Result<(cedar_policy::Request, Arc<Entities>), String> {
    let principal = uid(Type::Agent, input.agent)?;
    let resource = uid(Type::Server, input.resource)?;
    let entities = entities(input, &principal, &resource)?;
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

/// The request as the index and the prefilter read it: what [`cedar_request`] puts in
/// the context, read without building it.
pub(crate) struct Known<'a> {
    input: &'a Input<'a>,
    local: DateTime<chrono_tz::Tz>,
}

impl<'a> Known<'a> {
    pub(crate) fn of(input: &'a Input<'a>) -> Self {
        Self {
            input,
            local: input.now.with_timezone(&input.zone),
        }
    }
}

impl Facts for Known<'_> {
    /// The value at `path` (`["room"]`, `["input", "env"]`); `None` where the context
    /// has none (or one no test compares).
    fn value(&self, path: &[String]) -> Option<Literal> {
        let input = self.input;
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
                "time" => time_field(&self.local, key),
                "agent" => agent_field(input, key),
                _ => None,
            },
            _ => None,
        }
    }

    fn has(&self, path: &[String], key: &str) -> Option<bool> {
        let details = self.input.details;
        match path {
            [] => Some(match key {
                "room" => self.input.room.is_some(),
                other => CONTEXT.contains(&other),
            }),
            [record] => match record.as_str() {
                "input" => Some(details.contains_key(key)),
                "number" => Some(details.get(key).and_then(|v| as_long(v)).is_some()),
                "decimal" => Some(details.get(key).and_then(|v| as_decimal(v)).is_some()),
                "time" => Some(TIME.contains(&key)),
                "agent" => Some(AGENT.contains(&key)),
                _ => None,
            },
            _ => None,
        }
    }

    fn decimal(&self, key: &str) -> Option<i64> {
        let text = as_decimal(self.input.details.get(key)?)?;
        scaled(&text)
    }

    fn agent(&self) -> &str {
        self.input.agent
    }

    fn in_group(&self, group: &str) -> bool {
        self.input.groups.iter().any(|g| g == group)
    }

    fn resource(&self) -> &str {
        self.input.resource
    }
}

/// The context's attributes every request has (`room` is the one that may be missing).
const CONTEXT: [&str; 7] = [
    "description",
    "input",
    "number",
    "decimal",
    "time",
    "agent",
    "gateway",
];
const TIME: [&str; 5] = ["hour", "minute", "weekday", "date", "zone"];
const AGENT: [&str; 2] = ["pending", "recent"];

/// `context.time`: the request's time in the configured zone.
fn time_fields(input: &Input<'_>) -> Vec<(&'static str, Literal)> {
    let local = input.now.with_timezone(&input.zone);
    TIME.iter()
        .filter_map(|key| time_field(&local, key).map(|value| (*key, value)))
        .collect()
}

fn time_field(local: &DateTime<chrono_tz::Tz>, key: &str) -> Option<Literal> {
    let long = |n: u32| Literal::Long(i64::from(n));
    Some(match key {
        "hour" => long(local.hour()),
        "minute" => long(local.minute()),
        "weekday" => long(local.weekday().number_from_monday()),
        "date" => Literal::Str(local.format("%Y-%m-%d").to_string()),
        "zone" => Literal::Str(local.timezone().name().to_string()),
        _ => return None,
    })
}

/// `context.agent`: the agent's requests waiting now and made in the last hour.
fn agent_fields(input: &Input<'_>) -> Vec<(&'static str, Literal)> {
    AGENT
        .iter()
        .filter_map(|key| agent_field(input, key).map(|value| (*key, value)))
        .collect()
}

fn agent_field(input: &Input<'_>, key: &str) -> Option<Literal> {
    let count = |n: u64| Literal::Long(i64::try_from(n).unwrap_or(i64::MAX));
    match key {
        "pending" => Some(count(input.pending)),
        "recent" => Some(count(input.recent)),
        _ => None,
    }
}

/// A whole number, written plainly ("250", "-3"; not "+3", "007" or "1e3").
pub(crate) fn as_long(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if plain { s.parse().ok() } else { None }
}

/// Cedar's decimal: at most four places, within i64 at that scale. Whole numbers count
/// ("250" is `decimal("250.0")`), so one comparison covers "250" and "249.99".
pub(crate) fn as_decimal(s: &str) -> Option<String> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, "0"),
    };
    as_long(whole).or_else(|| (whole == "-0").then_some(0))?;
    let text = format!("{whole}.{frac}");
    // At most four places, and within Cedar's range (it refuses values outside it;
    // check here so that evaluation never fails).
    scaled(&text)?;
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
        assert_eq!(
            as_decimal("-922337203685477.5808").as_deref(),
            Some("-922337203685477.5808")
        );
        for not in ["1.23456", "1.", ".5", "abc", "922337203685478.0"] {
            assert_eq!(as_decimal(not), None, "{not:?}");
        }
    }
}
