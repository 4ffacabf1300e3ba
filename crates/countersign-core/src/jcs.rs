//! RFC 8785 canonical JSON (JCS): what every digest, commitment and log entry hashes.
//!
//! `serde_json_canonicalizer` is the reference we hold ourselves to, but it buffers every
//! key and value separately and parses every key again to sort it, so sealing a request's
//! log entries spent a tenth of the server's CPU in it under load. Here the value is made
//! a `serde_json::Value` once and written out in one pass: keys sorted by their UTF-16
//! code units, strings escaped as RFC 8785 §3.2.2.2 says (which is what `serde_json`
//! writes), numbers as ECMAScript writes a double (integers of at most 2^53 as their
//! digits, the rest through `ryu_js`, as the reference does). The unit tests hold it to
//! the reference's bytes (known documents and thousands of generated ones), and the
//! `action_digest` and `log_entry` fuzz targets to an independent writer of their own.

use serde::Serialize;
use serde_json::Value;

/// The largest integer a double holds exactly: below it, ECMAScript writes an integer as
/// its decimal digits.
const EXACT: u64 = 1 << 53;

/// The canonical JSON of `value`.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    let mut out = Vec::with_capacity(256);
    write(&value, &mut out)?;
    Ok(out)
}

/// The canonical JSON of a JSON value, written straight from it.
pub fn value_to_vec(value: &Value) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(256);
    write(value, &mut out)?;
    Ok(out)
}

/// Appends the canonical JSON of `value` to `out` (for a writer that lays out a known
/// struct's members itself).
pub fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    write(value, out)
}

/// Appends the canonical JSON of the object `map` to `out`.
pub fn write_object(
    map: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    object(map, out)
}

/// Appends `s` as a canonical JSON string to `out`.
pub fn write_string(s: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    string(s, out)
}

/// The canonical JSON of `value`, as text.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    let bytes = to_vec(value)?;
    // Only valid UTF-8 is written: strings come from `str`s, the rest is ASCII.
    String::from_utf8(bytes).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

fn write(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => number(n, out)?,
        Value::String(s) => string(s, out)?,
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => object(map, out)?,
    }
    Ok(())
}

fn object(
    map: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // By UTF-16 code units (RFC 8785 §3.2.3); for ASCII keys that is byte order.
    entries.sort_unstable_by(|(a, _), (b, _)| {
        if a.is_ascii() && b.is_ascii() {
            a.as_bytes().cmp(b.as_bytes())
        } else {
            a.encode_utf16().cmp(b.encode_utf16())
        }
    });
    out.push(b'{');
    for (i, (key, item)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(key, out)?;
        out.push(b':');
        write(item, out)?;
    }
    out.push(b'}');
    Ok(())
}

/// `serde_json`'s string escaping is RFC 8785's: `"` and `\` escaped, the short forms
/// for backspace, tab, line feed, form feed and carriage return, `\u00xx` in lower case
/// for the other controls, everything else (`/` and non-ASCII included) as it is.
fn string(s: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut *out, s)
}

fn number(n: &serde_json::Number, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    if let Some(u) = n.as_u64().filter(|u| *u <= EXACT) {
        out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
    } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= EXACT) {
        out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
    } else {
        let f = n
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| serde::ser::Error::custom("a number JSON cannot hold"))?;
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn same(value: &Value) {
        let ours = to_vec(value).unwrap();
        let reference = serde_json_canonicalizer::to_vec(value).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&reference),
            "{value}"
        );
    }

    #[test]
    fn the_same_bytes_as_the_reference() {
        for value in [
            json!(null),
            json!(true),
            json!({"b": 1, "a": [1, 2, {"d": null, "c": false}], "": "empty key"}),
            json!({"numbers": [0, -0.0, 1, -1, 9007199254740992u64, 9007199254740993u64,
                -9007199254740992i64, -9007199254740993i64, u64::MAX, i64::MIN, 1.5, -0.000001,
                1e21, 1e-7, 123456789.123, 5e-324, 1.7976931348623157e308, 100.0, 0.1]}),
            json!({"escapes": "quote \" backslash \\ slash / controls \u{0}\u{1}\u{8}\u{9}\u{a}\u{b}\u{c}\u{d}\u{1f}\u{7f} é 😀 \u{2028}"}),
            // RFC 8785 §3.2.3's sorting example: by UTF-16 code units, not code points.
            json!({"\u{20ac}": "Euro Sign", "\r": "Carriage Return", "\u{fb33}": "Hebrew Letter Dalet With Dagesh",
                "1": "One", "\u{1f600}": "Emoji: Grinning Face", "\u{80}": "Control", "\u{f6}": "Latin Small Letter O With Diaeresis"}),
            json!({"nested": {"z": {"y": {"x": [[], {}, [{}]]}}}, "A": "upper before lower", "a": 1}),
        ] {
            same(&value);
        }
    }

    #[test]
    fn random_documents_give_the_same_bytes_as_the_reference() {
        // A small deterministic generator: keys and strings from a mixed alphabet (ASCII,
        // controls, astral and BMP characters above the surrogates), numbers of every kind.
        let alphabet: Vec<char> = "aZ09 _-/\\\"\u{0}\u{1f}\u{7f}é€\u{ffff}\u{10000}😀\u{fb33}"
            .chars()
            .collect();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        fn text(next: &mut impl FnMut(u64) -> u64, alphabet: &[char]) -> String {
            (0..next(6))
                .map(|_| alphabet[next(alphabet.len() as u64) as usize])
                .collect()
        }
        fn value(next: &mut impl FnMut(u64) -> u64, alphabet: &[char], depth: u32) -> Value {
            match next(if depth > 3 { 6 } else { 8 }) {
                0 => Value::Null,
                1 => Value::Bool(next(2) == 0),
                2 => json!(next(u64::MAX) >> next(64)),
                3 => json!(-((next(u64::MAX) >> (next(63) + 1)) as i64)),
                4 => json!(f64::from_bits(next(u64::MAX)))
                    .as_f64()
                    .map_or(Value::Null, |f| json!(f)),
                5 => Value::String(text(next, alphabet)),
                6 => Value::Array(
                    (0..next(4))
                        .map(|_| value(next, alphabet, depth + 1))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..next(5))
                        .map(|_| (text(next, alphabet), value(next, alphabet, depth + 1)))
                        .collect(),
                ),
            }
        }
        for _ in 0..5000 {
            let doc = value(&mut next, &alphabet, 0);
            same(&doc);
        }
    }

    #[test]
    fn structs_canonicalize_by_their_fields() {
        #[derive(Serialize)]
        struct Entry<'a> {
            v: u32,
            kind: &'a str,
            at: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            actor: Option<&'a str>,
            data: Value,
        }
        let entry = Entry {
            v: 1,
            kind: "request_created",
            at: "2026-12-04T00:00:00.000Z",
            actor: None,
            data: json!({"version": 1, "status": "pending"}),
        };
        assert_eq!(
            to_string(&entry).unwrap(),
            r#"{"at":"2026-12-04T00:00:00.000Z","data":{"status":"pending","version":1},"kind":"request_created","v":1}"#
        );
        assert_eq!(
            to_vec(&entry).unwrap(),
            serde_json_canonicalizer::to_vec(&entry).unwrap()
        );
    }
}
