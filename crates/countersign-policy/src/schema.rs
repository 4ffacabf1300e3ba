//! The Cedar schema policies are checked against.
//!
//! Its fixed part, [`BASE_SCHEMA`], is a public contract (docs/countersign.cedarschema).
//! Two parts depend on the policies: the actions (one per tool a policy names, as
//! cedar-for-agents declares one per tool) and the detail keys. A request's details are
//! free-form, so the schema declares, as optional attributes, every key a policy reads:
//! Cedar's strict validation then makes each policy test `has` before it reads one, and a
//! policy can never fail for lack of a detail at evaluation time.

use std::collections::BTreeSet;

/// The resource of a request made with `request_approval`.
pub const RESOURCE: &str = "countersign";

/// The schema's fixed part. `{input}`, `{number}`, `{decimal}` and `{actions}` are filled
/// in from the policy set by [`generate`].
pub const BASE_SCHEMA: &str = r#"// countersign's Cedar schema: see docs/policies.md.

// A group of agents (`[groups]` in the config). Groups may contain groups.
entity Group in [Group];

// The requesting agent: Agent::"<token name>", in the groups the config gives it.
entity Agent in [Group] = {
  "name": String,
};

// What the action reaches: Server::"countersign" for request_approval, the upstream's
// name for a call through the gateway.
entity Server;

// The time the request was made, in the zone `[policy] timezone` names.
type Time = {
  "hour": Long,          // 0-23
  "minute": Long,        // 0-59
  "weekday": Long,       // 1 = Monday ... 7 = Sunday (ISO 8601)
  "date": String,        // "2026-12-01"
  "zone": String,        // "Europe/Paris"
};

// The requesting agent's requests.
type AgentCounts = {
  "pending": Long,       // waiting for a decision now, this one not included
  "recent": Long,        // made in the last hour, this one not included
};

type RequestContext = {
  "description": String,
  "input": Input,        // every detail, as text
  "number": Numbers,     // the details that are whole numbers ("250", "-3")
  "decimal": Decimals,   // the details that are decimals with at most 4 places ("12.50")
  "room"?: String,       // the room the request is shown in
  "time": Time,
  "agent": AgentCounts,
  // true for a call the gateway holds (the tool is known for certain); false for
  // request_approval, where the tool is what the agent says it will do.
  "gateway": Bool,
};

// Each declares, as optional, every detail key the policies read (`countersign policy
// schema` shows them for your files); the published schema has none.
type Input = {{input}};
type Numbers = {{number}};
type Decimals = {{decimal}};

action "request" appliesTo {
  principal: [Agent],
  resource: [Server],
  context: RequestContext,
};
{actions}"#;

/// The schema of an empty policy set: what docs/countersign.cedarschema publishes.
pub fn base_schema() -> String {
    generate(&BTreeSet::new(), &BTreeSet::new())
}

/// The schema for a policy set that names these actions and reads these detail keys.
pub(crate) fn generate(actions: &BTreeSet<String>, keys: &BTreeSet<String>) -> String {
    let record = |ty: &str| {
        if keys.is_empty() {
            return String::new();
        }
        let fields: Vec<String> = keys
            .iter()
            .map(|k| format!("\n  {}?: {ty},", quote(k)))
            .collect();
        format!("{}\n", fields.concat())
    };
    let mut extra = String::new();
    for action in actions
        .iter()
        .filter(|a| a.as_str() != crate::DEFAULT_ACTION)
    {
        extra.push_str(&format!(
            "\naction {} appliesTo {{\n  principal: [Agent],\n  resource: [Server],\n  context: RequestContext,\n}};\n",
            quote(action)
        ));
    }
    BASE_SCHEMA
        .replace("{input}", &record("String"))
        .replace("{number}", &record("Long"))
        .replace("{decimal}", &record("decimal"))
        .replace("{actions}", &extra)
}

/// A Cedar string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_schema_and_a_generated_one_parse() {
        let actions = BTreeSet::from(["refund".to_string(), "deploy \"prod\"".to_string()]);
        let keys = BTreeSet::from(["amount".to_string(), "env-name".to_string()]);
        for text in [
            generate(&BTreeSet::new(), &BTreeSet::new()),
            generate(&actions, &keys),
        ] {
            let parsed = cedar_policy::Schema::from_cedarschema_str(&text);
            assert!(parsed.is_ok(), "{text}\n{:?}", parsed.err());
        }
        let text = generate(&actions, &keys);
        assert!(text.contains("action \"refund\" appliesTo"), "{text}");
        assert!(text.contains("\"env-name\"?: Long"), "{text}");
    }
}
