//! An independent RFC 8785 (JCS) writer for the JSON countersign hashes, written from
//! the RFC rather than from serde_json_canonicalizer, to check it differentially:
//! members sorted by their names' UTF-16 code units, strings escaped as ECMAScript's
//! JSON.stringify does (`\"`, `\\`, `\b \f \n \r \t`, other controls as `\u00xx`,
//! everything else literal), no whitespace.
//!
//! Numbers need ECMAScript's Number-to-string algorithm; only integers that an IEEE
//! double holds exactly (|n| <= 2^53) are written, and `None` is returned for any other
//! number, so the differential is skipped rather than guessed.

use serde_json::Value;

pub fn to_vec(value: &Value) -> Option<Vec<u8>> {
    let mut out = String::new();
    write(value, &mut out)?;
    Some(out.into_bytes())
}

fn write(value: &Value, out: &mut String) -> Option<()> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            const EXACT: u64 = 1 << 53;
            if let Some(u) = n.as_u64() {
                if u > EXACT {
                    return None;
                }
                out.push_str(&u.to_string());
            } else if let Some(i) = n.as_i64() {
                if i.unsigned_abs() > EXACT {
                    return None;
                }
                out.push_str(&i.to_string());
            } else {
                return None;
            }
        }
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(name, out);
                out.push(':');
                write(member, out)?;
            }
            out.push('}');
        }
    }
    Some(())
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_by_utf16_and_escapes_like_json_stringify() {
        // U+1F600 is a surrogate pair (0xD83D ...) and sorts before U+FF61 in UTF-16,
        // though after it in UTF-8.
        let v = serde_json::json!({"\u{ff61}": "a", "\u{1f600}": "b\u{1}\n\u{2028}"});
        assert_eq!(
            String::from_utf8(to_vec(&v).unwrap()).unwrap(),
            "{\"\u{1f600}\":\"b\\u0001\\n\u{2028}\",\"\u{ff61}\":\"a\"}"
        );
    }
}
