//! Parameters a running process reads each cycle (`[params]`): a manifest declares what
//! may be tuned (approval-gate-mcp's `name -> {type, description}`, with optional `min`,
//! `max` and `allowed`), and the overrides file holds what is set. A value is coerced to
//! the declared type and refused when it cannot be, or when it falls outside the bounds;
//! the file is replaced atomically (a temporary file, fsync, rename, fsync of the
//! directory), here or over SSH on the process's host.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ssh::{Bounds, Target};
use crate::error::GateError;

/// The largest overrides file read or written.
const MAX_OVERRIDES_BYTES: usize = 1024 * 1024;
/// How long one read or write of the overrides file may take.
pub const REMOTE_BOUND: Duration = Duration::from_secs(60);
const REMOTE: Bounds = Bounds {
    timeout: REMOTE_BOUND,
    max_output_bytes: MAX_OVERRIDES_BYTES + 1,
};

/// A declared type, as the manifest names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    Int,
    Float,
    Bool,
    Str,
    Dict,
    List,
}

/// One declared parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(rename = "type")]
    pub ty: ParamType,
    #[serde(default)]
    pub description: String,
    /// The least value (int and float).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// The greatest value (int and float).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// The only values allowed (after coercion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<Value>>,
}

/// The manifest: what this deployment declares tunable.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Manifest(pub BTreeMap<String, ParamSpec>);

impl Manifest {
    /// Parses and checks a manifest (bounds only on numbers, allowed values of the type).
    pub fn parse(text: &str) -> Result<Self, String> {
        let specs: BTreeMap<String, ParamSpec> =
            serde_json::from_str(text).map_err(|e| format!("not a parameter manifest: {e}"))?;
        if specs.is_empty() {
            return Err("declares no parameter".into());
        }
        let manifest = Self(specs);
        for (name, spec) in &manifest.0 {
            if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
                return Err(format!("{name:?}: give a name of 1 to 200 characters"));
            }
            let numeric = matches!(spec.ty, ParamType::Int | ParamType::Float);
            if !numeric && (spec.min.is_some() || spec.max.is_some()) {
                return Err(format!("{name}: min and max are for int and float"));
            }
            if let (Some(min), Some(max)) = (spec.min, spec.max)
                && min > max
            {
                return Err(format!("{name}: min is above max"));
            }
            for value in spec.allowed.iter().flatten() {
                manifest
                    .coerce_unbounded(name, spec, value)
                    .map_err(|e| format!("{name}: allowed value {value}: {e}"))?;
            }
        }
        Ok(manifest)
    }

    pub fn get(&self, name: &str) -> Option<&ParamSpec> {
        self.0.get(name)
    }

    /// `value` as the declared type of `name`, within its bounds, or why not. Text is
    /// read the way approval-gate-mcp reads a tool argument: `"30"` is an int, `"yes"` a
    /// bool, `"{\"a\":1}"` a dict.
    pub fn coerce(&self, name: &str, value: &Value) -> Result<Value, GateError> {
        let spec = self.0.get(name).ok_or_else(|| {
            GateError::BadInput(format!(
                "{name} is not a declared parameter (declared: {})",
                self.0.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let coerced = self
            .coerce_unbounded(name, spec, value)
            .map_err(|e| GateError::BadInput(format!("{name}: {e}")))?;
        if let Some(n) = coerced.as_f64() {
            if let Some(min) = spec.min
                && n < min
            {
                return Err(GateError::BadInput(format!(
                    "{name}: {coerced} is below the least allowed, {min}"
                )));
            }
            if let Some(max) = spec.max
                && n > max
            {
                return Err(GateError::BadInput(format!(
                    "{name}: {coerced} is above the greatest allowed, {max}"
                )));
            }
        }
        if let Some(allowed) = &spec.allowed {
            let same = |a: &Value| match (a.as_f64(), coerced.as_f64()) {
                (Some(x), Some(y)) => x == y,
                _ => *a == coerced,
            };
            if !allowed.iter().any(same) {
                return Err(GateError::BadInput(format!(
                    "{name}: {coerced} is not one of the allowed values {}",
                    Value::Array(allowed.clone())
                )));
            }
        }
        Ok(coerced)
    }

    fn coerce_unbounded(
        &self,
        _name: &str,
        spec: &ParamSpec,
        value: &Value,
    ) -> Result<Value, String> {
        let text = value.as_str().map(str::trim);
        let refuse = || format!("{value} is not a valid {}", type_name(spec.ty));
        match spec.ty {
            ParamType::Int => match (value, text) {
                (Value::Number(n), _) if n.is_i64() || n.is_u64() => Ok(value.clone()),
                (Value::Number(n), _) => match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Value::from(f as i64)),
                    _ => Err(refuse()),
                },
                (_, Some(t)) => t.parse::<i64>().map(Value::from).map_err(|_| refuse()),
                _ => Err(refuse()),
            },
            ParamType::Float => {
                let f = match (value, text) {
                    (Value::Number(n), _) => n.as_f64(),
                    (_, Some(t)) => t.parse::<f64>().ok(),
                    _ => None,
                };
                f.filter(|f| f.is_finite())
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(refuse)
            }
            ParamType::Bool => match (value, text.map(str::to_ascii_lowercase).as_deref()) {
                (Value::Bool(_), _) => Ok(value.clone()),
                (Value::Number(n), _) if n.as_i64() == Some(1) => Ok(Value::Bool(true)),
                (Value::Number(n), _) if n.as_i64() == Some(0) => Ok(Value::Bool(false)),
                (_, Some("true" | "1" | "yes" | "on")) => Ok(Value::Bool(true)),
                (_, Some("false" | "0" | "no" | "off")) => Ok(Value::Bool(false)),
                _ => Err(refuse()),
            },
            ParamType::Str => match value {
                Value::String(_) => Ok(value.clone()),
                Value::Number(_) | Value::Bool(_) => Ok(Value::String(value.to_string())),
                _ => Err(refuse()),
            },
            ParamType::Dict | ParamType::List => {
                let parsed = match text {
                    Some(t) => serde_json::from_str::<Value>(t).map_err(|_| refuse())?,
                    None => value.clone(),
                };
                let fits = match spec.ty {
                    ParamType::Dict => parsed.is_object(),
                    _ => parsed.is_array(),
                };
                if fits { Ok(parsed) } else { Err(refuse()) }
            }
        }
    }
}

fn type_name(ty: ParamType) -> &'static str {
    match ty {
        ParamType::Int => "int",
        ParamType::Float => "float",
        ParamType::Bool => "bool (true/false, yes/no, on/off, 1/0)",
        ParamType::Str => "str",
        ParamType::Dict => "dict (a JSON object)",
        ParamType::List => "list (a JSON array)",
    }
}

/// `[params]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamsConfig {
    pub manifest: Manifest,
    /// The overrides file the process reads (on its host).
    pub overrides: String,
    /// Where that file is: here, or the host of the `[[process]]` `[params] process` names.
    pub target: Target,
}

/// One declared parameter and its override, if set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "EntryWire")]
pub struct ParamEntry {
    pub name: String,
    #[serde(flatten)]
    pub spec: ParamSpec,
    /// The override in force; `None`: the process's own default.
    pub value: Option<Value>,
}

/// A [`ParamEntry`] as read back (a `--server` client): the spec's fields beside the
/// name and value, which the manifest's own strict reading would refuse.
#[derive(Deserialize)]
struct EntryWire {
    name: String,
    #[serde(rename = "type")]
    ty: ParamType,
    #[serde(default)]
    description: String,
    #[serde(default)]
    min: Option<f64>,
    #[serde(default)]
    max: Option<f64>,
    #[serde(default)]
    allowed: Option<Vec<Value>>,
    #[serde(default)]
    value: Option<Value>,
}

impl From<EntryWire> for ParamEntry {
    fn from(w: EntryWire) -> Self {
        Self {
            name: w.name,
            spec: ParamSpec {
                ty: w.ty,
                description: w.description,
                min: w.min,
                max: w.max,
                allowed: w.allowed,
            },
            value: w.value,
        }
    }
}

/// What `list_params` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamsList {
    pub file: String,
    pub declared: Vec<ParamEntry>,
    /// Overrides of names the manifest does not declare (left as they are).
    pub undeclared: Map<String, Value>,
}

impl ParamsList {
    /// As a person reads it: each declared parameter, its type, the override in force
    /// (or "(default)") and its description; then overrides the manifest does not
    /// declare.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} parameter(s) declared; overrides in {}\n\n",
            self.declared.len(),
            self.file
        );
        for p in &self.declared {
            let now = p
                .value
                .as_ref()
                .map_or("(default)".into(), |v| v.to_string());
            let mut bounds = Vec::new();
            if let Some(min) = p.spec.min {
                bounds.push(format!("min {min}"));
            }
            if let Some(max) = p.spec.max {
                bounds.push(format!("max {max}"));
            }
            if let Some(allowed) = &p.spec.allowed {
                let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
                bounds.push(format!("one of {}", allowed.join(", ")));
            }
            let bounds = if bounds.is_empty() {
                String::new()
            } else {
                format!(" [{}]", bounds.join("; "))
            };
            out.push_str(&format!(
                "  {:<28} {:<5} = {:<12} {}{bounds}\n",
                p.name,
                format!("{:?}", p.spec.ty).to_lowercase(),
                now,
                p.spec.description
            ));
        }
        for (name, value) in &self.undeclared {
            out.push_str(&format!("  {name:<28} (not declared) = {value}\n"));
        }
        out
    }
}

impl ParamsConfig {
    /// The overrides in force (an absent or empty file is none).
    pub async fn read(&self) -> Result<Map<String, Value>, GateError> {
        let text = match &self.target {
            Target::Local => match tokio::fs::read(&self.overrides).await {
                Ok(bytes) if bytes.len() > MAX_OVERRIDES_BYTES => {
                    return Err(self.too_large());
                }
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => {
                    return Err(GateError::Unavailable(format!(
                        "cannot read the overrides file {}: {e}",
                        self.overrides
                    )));
                }
            },
            Target::Ssh(_) => {
                let ran = self
                    .target
                    .script(
                        "IFS= read -r f; if [ -e \"$f\" ]; then cat -- \"$f\"; fi",
                        format!("{}\n", self.overrides).as_bytes(),
                        REMOTE,
                    )
                    .await?;
                if !ran.succeeded() {
                    return Err(GateError::Unavailable(format!(
                        "cannot read the overrides file {} on {}: {}",
                        self.overrides,
                        self.target.describe(),
                        ran.stderr.trim()
                    )));
                }
                if ran.truncated {
                    return Err(self.too_large());
                }
                ran.stdout
            }
        };
        if text.trim().is_empty() {
            return Ok(Map::new());
        }
        match serde_json::from_str(&text) {
            Ok(Value::Object(map)) => Ok(map),
            _ => Err(GateError::Unavailable(format!(
                "the overrides file {} does not hold a JSON object; fix or remove it",
                self.overrides
            ))),
        }
    }

    fn too_large(&self) -> GateError {
        GateError::Unavailable(format!(
            "the overrides file {} is larger than {MAX_OVERRIDES_BYTES} bytes",
            self.overrides
        ))
    }

    /// Replaces the overrides file with `overrides`, atomically.
    pub async fn write(&self, overrides: &Map<String, Value>) -> Result<(), GateError> {
        let mut bytes = serde_json::to_vec_pretty(overrides)
            .map_err(|e| GateError::Internal(format!("cannot encode the overrides: {e}")))?;
        bytes.push(b'\n');
        match &self.target {
            Target::Local => {
                let path = Path::new(&self.overrides).to_path_buf();
                tokio::task::spawn_blocking(move || crate::atomic_file::replace(&path, &bytes))
                    .await
                    .map_err(|e| GateError::Internal(format!("the write stopped: {e}")))?
                    .map_err(|e| {
                        GateError::Unavailable(format!(
                            "cannot write the overrides file {}: {e}",
                            self.overrides
                        ))
                    })
            }
            Target::Ssh(_) => {
                let mut input = format!("{}\n", self.overrides).into_bytes();
                input.extend_from_slice(&bytes);
                let ran = self.target.script(REMOTE_WRITE, &input, REMOTE).await?;
                if ran.succeeded() {
                    Ok(())
                } else {
                    Err(GateError::Unavailable(format!(
                        "cannot write the overrides file {} on {}: {}",
                        self.overrides,
                        self.target.describe(),
                        ran.stderr.trim()
                    )))
                }
            }
        }
    }

    /// The manifest with the overrides in force.
    pub async fn list(&self) -> Result<ParamsList, GateError> {
        let mut overrides = self.read().await?;
        let declared = self
            .manifest
            .0
            .iter()
            .map(|(name, spec)| ParamEntry {
                name: name.clone(),
                spec: spec.clone(),
                value: overrides.remove(name),
            })
            .collect();
        Ok(ParamsList {
            file: self.overrides.clone(),
            declared,
            undeclared: overrides,
        })
    }
}

/// On the host: the path on the first line, the content after it. `sync FILE` (GNU
/// coreutils 8.24 and later) fsyncs the file and then its directory.
const REMOTE_WRITE: &str = r#"IFS= read -r f
tmp="$f.countersign.$$"
cat >"$tmp" || { rm -f -- "$tmp"; exit 1; }
sync -- "$tmp" || { rm -f -- "$tmp"; exit 1; }
mv -f -- "$tmp" "$f" || { rm -f -- "$tmp"; exit 1; }
sync -- "$(dirname -- "$f")"
"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn manifest() -> Manifest {
        Manifest::parse(
            r#"{
              "poll_interval_seconds": {"type": "int", "description": "Seconds between work cycles", "min": 1, "max": 3600},
              "ratio": {"type": "float", "description": "r"},
              "dry_run": {"type": "bool", "description": "Plan work but do not execute"},
              "mode": {"type": "str", "description": "m", "allowed": ["fast", "safe"]},
              "limits": {"type": "dict", "description": "d"},
              "shards": {"type": "list", "description": "l"}
            }"#,
        )
        .unwrap()
    }

    #[test]
    fn values_are_coerced_to_the_declared_type() {
        let m = manifest();
        assert_eq!(
            m.coerce("poll_interval_seconds", &json!("30")).unwrap(),
            json!(30)
        );
        assert_eq!(
            m.coerce("poll_interval_seconds", &json!(30.0)).unwrap(),
            json!(30)
        );
        assert_eq!(m.coerce("ratio", &json!("0.25")).unwrap(), json!(0.25));
        assert_eq!(m.coerce("ratio", &json!(2)).unwrap(), json!(2.0));
        assert_eq!(m.coerce("dry_run", &json!("Yes")).unwrap(), json!(true));
        assert_eq!(m.coerce("dry_run", &json!("off")).unwrap(), json!(false));
        assert_eq!(m.coerce("mode", &json!("safe")).unwrap(), json!("safe"));
        assert_eq!(
            m.coerce("limits", &json!("{\"a\": 1}")).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(m.coerce("shards", &json!([3, 7])).unwrap(), json!([3, 7]));
    }

    #[test]
    fn what_cannot_be_coerced_or_is_out_of_bounds_is_refused() {
        let m = manifest();
        for (name, value) in [
            ("poll_interval_seconds", json!("thirty")),
            ("poll_interval_seconds", json!(2.5)),
            ("poll_interval_seconds", json!(0)),
            ("poll_interval_seconds", json!("3601")),
            ("ratio", json!("NaN")),
            ("dry_run", json!("maybe")),
            ("mode", json!("reckless")),
            ("limits", json!("[1]")),
            ("shards", json!("{}")),
            ("undeclared", json!(1)),
        ] {
            assert!(m.coerce(name, &value).is_err(), "{name} = {value} passed");
        }
    }

    #[test]
    fn a_bad_manifest_is_refused() {
        assert!(Manifest::parse("{}").is_err());
        assert!(Manifest::parse(r#"{"a": {"type": "number"}}"#).is_err());
        assert!(Manifest::parse(r#"{"a": {"type": "str", "min": 1}}"#).is_err());
        assert!(Manifest::parse(r#"{"a": {"type": "int", "allowed": ["x"]}}"#).is_err());
        assert!(Manifest::parse(r#"{"a": {"type": "int", "extra": 1}}"#).is_err());
    }

    #[test]
    fn the_overrides_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("params.json");
        crate::atomic_file::replace(&path, b"{\"a\": 1}\n").unwrap();
        crate::atomic_file::replace(&path, b"{\"a\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\": 2}\n");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
