//! Running what was approved: the restart, the command, the parameter change. A failure
//! is the operation's outcome, not an error: it was claimed, and what it gave is recorded.

use super::*;

impl Operations {
    /// Runs what was approved; a failure is an outcome, not an error (it was claimed).
    pub(super) async fn execute(&self, op: &Resolved) -> Executed {
        let started = std::time::Instant::now();
        let ran = |ran: Result<ssh::Ran, GateError>, bounds: Bounds| match ran {
            Ok(ran) => {
                let output = cut(&ran.combined(), OUTCOME_OUTPUT_BYTES);
                Executed {
                    status: if ran.succeeded() {
                        OutcomeStatus::Succeeded
                    } else {
                        OutcomeStatus::Failed
                    },
                    summary: format!(
                        "{} after {:.1} s",
                        ran.ending(&bounds),
                        started.elapsed().as_secs_f64()
                    ),
                    exit_code: ran.exit_code,
                    output: Some(output),
                    before: None,
                    after: None,
                }
            }
            Err(err) => failed(err),
        };
        match op {
            Resolved::Restart(i) => {
                let p = &self.config.processes[*i];
                ran(
                    p.restart().await,
                    Bounds {
                        timeout: process::RESTART_BOUND,
                        max_output_bytes: 0,
                    },
                )
            }
            Resolved::Run(i, command) => {
                let p = &self.config.processes[*i];
                ran(p.run_command(command).await, p.run)
            }
            Resolved::Set(name, value) => match self.change_param(name, Some(value)).await {
                Ok(before) => Executed {
                    status: OutcomeStatus::Succeeded,
                    summary: format!("{name}: {} -> {value}", show(&before)),
                    exit_code: None,
                    output: None,
                    before: Some(before),
                    after: Some(value.clone()),
                },
                Err(err) => failed(err),
            },
            Resolved::Clear(Some(name)) => match self.change_param(name, None).await {
                Ok(before) => Executed {
                    status: OutcomeStatus::Succeeded,
                    summary: format!("{name}: {} -> cleared", show(&before)),
                    exit_code: None,
                    output: None,
                    before: Some(before),
                    after: Some(Value::Null),
                },
                Err(err) => failed(err),
            },
            Resolved::Clear(None) => match self.clear_all().await {
                Ok(before) => Executed {
                    status: OutcomeStatus::Succeeded,
                    summary: format!("every override cleared ({} were set)", before.len()),
                    exit_code: None,
                    output: None,
                    before: Some(Value::Object(before)),
                    after: Some(Value::Object(Default::default())),
                },
                Err(err) => failed(err),
            },
        }
    }

    /// Sets (or with `None` removes) one override; its value before (`null`: none).
    pub(super) async fn change_param(
        &self,
        name: &str,
        value: Option<&Value>,
    ) -> Result<Value, GateError> {
        let params = self.params()?;
        let _one_at_a_time = self.params_lock.lock().await;
        let mut overrides = params.read().await?;
        let before = match value {
            Some(v) => overrides.insert(name.to_string(), v.clone()),
            None => overrides.remove(name),
        };
        params.write(&overrides).await?;
        Ok(before.unwrap_or(Value::Null))
    }

    pub(super) async fn clear_all(&self) -> Result<serde_json::Map<String, Value>, GateError> {
        let params = self.params()?;
        let _one_at_a_time = self.params_lock.lock().await;
        let before = params.read().await?;
        params.write(&serde_json::Map::new()).await?;
        Ok(before)
    }
}
