//! What an operation will do, checked, as the request's description and details: the
//! process, its host and directory, the command, the parameter's value before and after.

use super::*;

impl Operations {
    /// What `op` will do, checked, as a request's description and details.
    pub(super) async fn bind(&self, who: &Principal, op: &Operation) -> Result<Bound, GateError> {
        person(who)?;
        if !who.may(Scope::Request) {
            return Err(GateError::Forbidden(format!(
                "{} may not ask for operations: that needs the request scope",
                who.id
            )));
        }
        let mut details = BTreeMap::new();
        let tool = match op {
            Operation::Restart { .. } => RESTART,
            Operation::Run { .. } => RUN,
            Operation::SetParam { .. } => SET_PARAM,
            Operation::ClearParam { .. } => CLEAR_PARAM,
        };
        details.insert("upstream".to_string(), UPSTREAM.to_string());
        details.insert("tool".to_string(), tool.to_string());
        let mut put = |k: &str, v: String| {
            details.insert(k.to_string(), v);
        };
        let (description, resolved) = match op {
            Operation::Restart { process } => {
                let (i, p) = self.process(process)?;
                put("process", p.name.clone());
                put("host", p.target.describe());
                put("dir", p.dir.clone());
                put("start", p.start.clone());
                put("pattern", p.pattern.clone());
                (
                    format!("restart process {} on {}", p.name, p.target.describe()),
                    Resolved::Restart(i),
                )
            }
            Operation::Run { process, command } => {
                let (i, p) = self.process(process)?;
                if command.trim().is_empty() {
                    return Err(GateError::BadInput("cmd: give a command to run".into()));
                }
                put("process", p.name.clone());
                put("host", p.target.describe());
                put("dir", p.dir.clone());
                put("cmd", command.clone());
                (
                    format!("run `{command}` in {} on {}", p.dir, p.target.describe()),
                    Resolved::Run(i, command.clone()),
                )
            }
            Operation::SetParam { name, value } => {
                let params = self.params()?;
                let value = params.manifest.coerce(name, value)?;
                let before = params
                    .read()
                    .await?
                    .get(name)
                    .cloned()
                    .unwrap_or(Value::Null);
                put("name", name.clone());
                put("value", value.to_string());
                put("before", before.to_string());
                put("file", params.overrides.clone());
                put("host", params.target.describe());
                (
                    format!("set parameter {name} to {value} (now {})", show(&before)),
                    Resolved::Set(name.clone(), value),
                )
            }
            Operation::ClearParam { name } => {
                let params = self.params()?;
                let current = params.read().await?;
                put("file", params.overrides.clone());
                put("host", params.target.describe());
                match name {
                    Some(name) => {
                        let Some(before) = current.get(name) else {
                            return Err(GateError::BadInput(format!(
                                "{name} has no override to clear (set: {})",
                                names(current.keys().map(String::as_str))
                            )));
                        };
                        put("name", name.clone());
                        put("before", before.to_string());
                        (
                            format!("clear the override of parameter {name} (now {before})"),
                            Resolved::Clear(Some(name.clone())),
                        )
                    }
                    None => {
                        put("all", "true".into());
                        put("before", Value::Object(current.clone()).to_string());
                        (
                            format!("clear every parameter override ({} set)", current.len()),
                            Resolved::Clear(None),
                        )
                    }
                }
            }
        };
        Ok(Bound {
            tool,
            description,
            details,
            op: resolved,
        })
    }
}
