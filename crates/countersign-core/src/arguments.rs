//! A tool call's arguments as an action's details: what the gateway and the hooks bind.
//!
//! Every leaf of the arguments becomes one detail. Its key is the leaf's RFC 6901 JSON
//! Pointer (`/amount`, `/items/0/sku`; `~` written `~0` and `/` written `~1`; the key
//! `""` of the top object gives `/`). Its value is the RFC 8785 (JCS) JSON text of the
//! leaf: a string keeps its quotes (`"\"abc\""`), a number is in its shortest form
//! (`1.50` gives `1.5`), and `true`, `false` and `null` are themselves. Empty objects and
//! empty arrays are leaves (`{}`, `[]`), so two different argument objects never give the
//! same details.
//!
//! Two details sit beside them: `upstream` (the server the call goes to) and `tool` (the
//! tool it calls). Neither starts with `/`, so they cannot meet a pointer. The known-answer
//! cases are in `testdata/gateway/details.json`.

use std::collections::BTreeMap;

use serde_json::Value;

/// The detail naming the server a held call goes to.
pub const UPSTREAM_DETAIL: &str = "upstream";
/// The detail naming the tool a held call calls (also what policies read as the action).
pub const TOOL_DETAIL: &str = "tool";

/// The details of a call of `tool` on `upstream` with `arguments`.
pub fn call_details(
    upstream: &str,
    tool: &str,
    arguments: &serde_json::Map<String, Value>,
) -> BTreeMap<String, String> {
    let mut details = flatten(arguments);
    details.insert(UPSTREAM_DETAIL.into(), upstream.into());
    details.insert(TOOL_DETAIL.into(), tool.into());
    details
}

/// The arguments object flattened to one detail per leaf (see the module's docs). An
/// empty arguments object gives no details.
pub fn flatten(arguments: &serde_json::Map<String, Value>) -> BTreeMap<String, String> {
    let mut details = BTreeMap::new();
    let mut pointer = String::new();
    for (key, value) in arguments {
        walk(&mut details, &mut pointer, key, value);
    }
    details
}

fn walk(details: &mut BTreeMap<String, String>, pointer: &mut String, key: &str, value: &Value) {
    let len = pointer.len();
    pointer.push('/');
    for c in key.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                walk(details, pointer, k, v);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                walk(details, pointer, &i.to_string(), v);
            }
        }
        leaf => {
            details.insert(pointer.clone(), canonical(leaf));
        }
    }
    pointer.truncate(len);
}

/// RFC 8785 text of a leaf. Every JSON value canonicalizes (numbers as serde_json holds
/// them are finite); the fallback is never reached.
fn canonical(value: &Value) -> String {
    crate::jcs::to_string(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Case {
        name: String,
        arguments: serde_json::Map<String, Value>,
        details: BTreeMap<String, String>,
    }

    #[test]
    fn matches_the_known_answers() {
        let cases: Vec<Case> =
            serde_json::from_str(include_str!("../../../testdata/gateway/details.json")).unwrap();
        assert!(cases.len() >= 10, "too few cases: {}", cases.len());
        for case in cases {
            assert_eq!(flatten(&case.arguments), case.details, "case {}", case.name);
        }
    }

    #[test]
    fn leaves_are_canonical_json_text() {
        let args = serde_json::json!({"amount": 1.50, "to": "a/b", "k~": [], "n": {"x": null}});
        let details = flatten(args.as_object().unwrap());
        assert_eq!(details["/amount"], "1.5");
        assert_eq!(details["/to"], "\"a/b\"");
        assert_eq!(details["/k~0"], "[]");
        assert_eq!(details["/n/x"], "null");
        assert_eq!(details.len(), 4);
    }

    #[test]
    fn different_arguments_give_different_details() {
        let a = serde_json::json!({"a": {"b": 1}});
        let b = serde_json::json!({"a/b": 1});
        let c = serde_json::json!({"a": {}});
        let d = serde_json::json!({"a": []});
        let all: Vec<_> = [a, b, c, d]
            .iter()
            .map(|v| flatten(v.as_object().unwrap()))
            .collect();
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn call_details_name_the_upstream_and_the_tool() {
        let args = serde_json::json!({"path": "/tmp/x"});
        let details = call_details("files", "write_file", args.as_object().unwrap());
        assert_eq!(details["upstream"], "files");
        assert_eq!(details["tool"], "write_file");
        assert_eq!(details["/path"], "\"/tmp/x\"");
    }
}
