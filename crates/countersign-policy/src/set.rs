//! A loaded policy set: the files' text, each policy's id, effect and requirements, the
//! schema it was validated against, and the digest that names this exact version.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cedar_policy::{ActionConstraint, Effect, PolicyId, ValidationMode, Validator};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::PolicyError;
use crate::index::{Indexed, SetCache};
use crate::prefilter::{Tests, tests_of};
use crate::requirements::Requirements;
use crate::schema;

/// One policy file as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyFile {
    /// How the file is named in ids and messages (its file name).
    pub name: String,
    pub text: String,
}

/// What countersign knows of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyInfo {
    pub id: String,
    pub file: String,
    /// `permit` or `forbid`.
    pub effect: &'static str,
    /// `@reason("...")`, shown to approvers and in `policy test`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Requirements::is_empty")]
    pub requirements: Requirements,
    /// The policy as written in its file, annotations included (shown to approvers).
    pub text: String,
}

/// A validated set of policies, ready to evaluate.
#[derive(Debug, Clone)]
pub struct PolicySet {
    files: Vec<PolicyFile>,
    digest: String,
    schema_text: String,
    pub(crate) info: HashMap<String, PolicyInfo>,
    /// Per action name: the policies that may apply to it (those that name it and those
    /// that name no action), indexed by their guards (`index.rs`). Evaluating only these
    /// keeps a large set fast.
    pub(crate) by_action: HashMap<String, Indexed>,
    /// The policies that name no action: all that may apply to an action no policy names.
    pub(crate) any_action: Indexed,
    /// Every policy by its number (what the index lists), with Cedar's ids.
    pub(crate) policies: Arc<Vec<cedar_policy::Policy>>,
    /// Each policy's leading tests, settled without Cedar (`prefilter.rs`).
    pub(crate) tests: Arc<Vec<Tests>>,
    pub(crate) sets: Arc<SetCache>,
    /// Whether a policy reads `context.agent` (the caller then counts the agent's
    /// requests; otherwise it need not).
    reads_agent: bool,
}

impl PolicySet {
    /// No policies: every request goes to a person.
    pub fn empty() -> Self {
        Self {
            files: Vec::new(),
            digest: digest(&[]),
            schema_text: schema::base_schema(),
            info: HashMap::new(),
            by_action: HashMap::new(),
            any_action: Indexed::default(),
            policies: Arc::default(),
            tests: Arc::default(),
            sets: Arc::default(),
            reads_agent: false,
        }
    }

    /// Parses, names and validates the files. An empty list is a valid, empty set (every
    /// request then goes to a person, as without policies).
    pub fn load(files: Vec<PolicyFile>) -> Result<Self, PolicyError> {
        let mut policies = Vec::new();
        let mut info = HashMap::new();
        for file in &files {
            let parsed: cedar_policy::PolicySet =
                file.text
                    .parse()
                    .map_err(|e: cedar_policy::ParseErrors| PolicyError::Parse {
                        file: file.name.clone(),
                        message: one_line(&e.to_string()),
                    })?;
            if parsed.templates().next().is_some() {
                return Err(PolicyError::Unsupported {
                    file: file.name.clone(),
                    message: "templates (policies with ?principal or ?resource) are not \
                              supported; write static policies"
                        .into(),
                });
            }
            // Cedar names parsed policies policy0, policy1, ... in source order; keep
            // that order so that "the file's third policy" is stable.
            let mut in_file: Vec<_> = parsed.policies().cloned().collect();
            in_file.sort_by_key(|p| {
                p.id()
                    .to_string()
                    .trim_start_matches("policy")
                    .parse::<usize>()
                    .unwrap_or(usize::MAX)
            });
            for (n, policy) in in_file.into_iter().enumerate() {
                let id = match policy.annotation("id") {
                    Some(id) if !id.trim().is_empty() => id.trim().to_string(),
                    _ => format!("{}#{}", file.name, n + 1),
                };
                // A fallback decision names the policies that held its request joined
                // by commas (in the signed statement): an id with a comma would make
                // that ambiguous.
                if id.contains(',') {
                    return Err(PolicyError::Annotation {
                        file: file.name.clone(),
                        id: id.clone(),
                        message: match policy.annotation("id") {
                            Some(_) => "an @id may not contain a comma (a fallback decision \
                                        lists the ids of its policies joined by commas)"
                                .into(),
                            None => "this policy has no @id, and its file's name, which \
                                     would make its id, contains a comma: give it an @id \
                                     without one, or rename the file"
                                .into(),
                        },
                    });
                }
                if info.contains_key(&id) {
                    return Err(PolicyError::DuplicateId {
                        file: file.name.clone(),
                        id,
                    });
                }
                let is_permit = policy.effect() == Effect::Permit;
                let requirements =
                    Requirements::of(policy.annotations(), is_permit).map_err(|message| {
                        PolicyError::Annotation {
                            file: file.name.clone(),
                            id: id.clone(),
                            message,
                        }
                    })?;
                info.insert(
                    id.clone(),
                    PolicyInfo {
                        id: id.clone(),
                        file: file.name.clone(),
                        effect: if is_permit { "permit" } else { "forbid" },
                        reason: policy.annotation("reason").map(str::to_string),
                        requirements,
                        // Cedar keeps a parsed policy's own source text.
                        text: policy.to_string(),
                    },
                );
                policies.push(policy.new_id(PolicyId::new(id)));
            }
        }

        let mut actions = BTreeSet::from([crate::DEFAULT_ACTION.to_string()]);
        let mut keys = BTreeSet::new();
        let mut reads_agent = false;
        let mut tests = Vec::with_capacity(policies.len());
        for policy in &policies {
            for uid in action_names(&policy.action_constraint()) {
                actions.insert(uid);
            }
            let est = policy
                .to_json()
                .map_err(|e| PolicyError::Schema(e.to_string()))?;
            detail_keys(&est, &mut keys);
            reads_agent |= reads_context(&est, "agent");
            tests.push(tests_of(policy, &est));
        }
        let schema_text = schema::generate(&actions, &keys);
        let (schema, _) = cedar_policy::Schema::from_cedarschema_str(&schema_text)
            .map_err(|e| PolicyError::Schema(one_line(&e.to_string())))?;

        let mut all = cedar_policy::PolicySet::new();
        let mut any_action = Indexed::default();
        let mut by_action: HashMap<String, Indexed> = HashMap::new();
        for action in &actions {
            by_action.insert(action.clone(), Indexed::default());
        }
        let invalid = |e: String| PolicyError::Validation(one_line(&e));
        for (n, (policy, policy_tests)) in policies.iter().zip(&tests).enumerate() {
            all.add(policy.clone())
                .map_err(|e| invalid(e.to_string()))?;
            let n = u32::try_from(n).map_err(|_| invalid("too many policies".into()))?;
            let guard = policy_tests.guard();
            let guard = guard.as_ref();
            let named = action_names(&policy.action_constraint());
            if matches!(policy.action_constraint(), ActionConstraint::Any) {
                any_action.add(n, guard);
                for set in by_action.values_mut() {
                    set.add(n, guard);
                }
            } else {
                for action in named {
                    if let Some(set) = by_action.get_mut(&action) {
                        set.add(n, guard);
                    }
                }
            }
        }

        let result = Validator::new(schema).validate(&all, ValidationMode::Strict);
        if !result.validation_passed() {
            let errors: Vec<String> = result
                .validation_errors()
                .map(|e| {
                    let file = info
                        .get(e.policy_id().to_string().as_str())
                        .map(|i| i.file.as_str())
                        .unwrap_or("?");
                    format!(
                        "{file}: policy {:?}: {}",
                        e.policy_id().to_string(),
                        one_line(&e.to_string())
                    )
                })
                .collect();
            return Err(PolicyError::Validation(errors.join("; ")));
        }

        let digest = digest(&files);
        Ok(Self {
            files,
            digest,
            schema_text,
            info,
            by_action,
            any_action,
            policies: Arc::new(policies),
            tests: Arc::new(tests),
            sets: Arc::default(),
            reads_agent,
        })
    }

    /// Whether any policy reads `context.agent` (the agent's request counts).
    pub fn reads_agent_counts(&self) -> bool {
        self.reads_agent
    }

    /// `sha256:<hex>` of the RFC 8785 canonical JSON of `[{"name", "text"}, ...]`, in the
    /// order of the config: the name of this exact version of the rules.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The files, as loaded (what the log records for this version).
    pub fn files(&self) -> &[PolicyFile] {
        &self.files
    }

    /// The schema the set was validated against (`countersign policy schema`).
    pub fn schema(&self) -> &str {
        &self.schema_text
    }

    /// Every policy, in id order.
    pub fn policies(&self) -> Vec<&PolicyInfo> {
        let mut all: Vec<_> = self.info.values().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// The policy with this id.
    pub fn policy(&self, id: &str) -> Option<&PolicyInfo> {
        self.info.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }
}

fn digest(files: &[PolicyFile]) -> String {
    let bytes = serde_json_canonicalizer::to_vec(&files).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
}

/// The action names (ids of `Action::"..."`) a scope constraint mentions.
fn action_names(constraint: &ActionConstraint) -> Vec<String> {
    let uids = match constraint {
        ActionConstraint::Any => return Vec::new(),
        ActionConstraint::Eq(uid) => vec![uid.clone()],
        ActionConstraint::In(uids) => uids.clone(),
    };
    // `action in [Action::"a", Action::"a"]` names one action.
    let names: BTreeSet<String> = uids
        .iter()
        .map(|uid| uid.id().unescaped().to_string())
        .collect();
    names.into_iter().collect()
}

/// Collects the keys read from `context.input`, `context.number` or `context.decimal`
/// (as `.key`, `["key"]` or `has key`) in a policy's JSON form.
fn detail_keys(est: &serde_json::Value, keys: &mut BTreeSet<String>) {
    match est {
        serde_json::Value::Object(map) => {
            for op in [".", "has"] {
                if let Some(inner) = map.get(op)
                    && is_detail_record(inner.get("left"))
                    && let Some(attr) = inner.get("attr").and_then(|a| a.as_str())
                {
                    keys.insert(attr.to_string());
                }
            }
            for value in map.values() {
                detail_keys(value, keys);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                detail_keys(item, keys);
            }
        }
        _ => {}
    }
}

/// Whether `context.<attr>` appears anywhere in a policy's JSON form.
fn reads_context(est: &serde_json::Value, attr: &str) -> bool {
    match est {
        serde_json::Value::Object(map) => {
            for op in [".", "has"] {
                if let Some(inner) = map.get(op)
                    && inner
                        .get("left")
                        .and_then(|l| l.get("Var"))
                        .and_then(|v| v.as_str())
                        == Some("context")
                    && inner.get("attr").and_then(|a| a.as_str()) == Some(attr)
                {
                    return true;
                }
            }
            map.values().any(|v| reads_context(v, attr))
        }
        serde_json::Value::Array(items) => items.iter().any(|v| reads_context(v, attr)),
        _ => false,
    }
}

fn is_detail_record(left: Option<&serde_json::Value>) -> bool {
    let Some(access) = left.and_then(|l| l.get(".")) else {
        return false;
    };
    let on_context = access
        .get("left")
        .and_then(|l| l.get("Var"))
        .and_then(|v| v.as_str())
        == Some("context");
    let record = access.get("attr").and_then(|a| a.as_str());
    on_context && matches!(record, Some("input" | "number" | "decimal"))
}

/// Cedar's messages span lines; a log line and `doctor` want one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> PolicyFile {
        PolicyFile {
            name: name.into(),
            text: text.into(),
        }
    }

    #[test]
    fn policies_are_named_by_id_or_by_file_and_position() {
        let set = PolicySet::load(vec![file(
            "refunds.cedar",
            r#"permit(principal, action == Action::"refund", resource);
               @id("no-deletes") forbid(principal, action == Action::"delete", resource);"#,
        )])
        .map_err(|e| e.to_string());
        let set = match set {
            Ok(set) => set,
            Err(e) => panic!("{e}"),
        };
        let ids: Vec<_> = set.policies().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, ["no-deletes", "refunds.cedar#1"]);
        assert!(set.schema().contains("action \"refund\""));
        assert!(set.schema().contains("action \"delete\""));
        assert!(set.digest().starts_with("sha256:") && set.digest().len() == 71);
    }

    #[test]
    fn each_policy_keeps_its_own_text() {
        let second = "@id(\"no-deletes\")\n@reason(\"never\")\nforbid(principal, action == Action::\"delete\", resource)\nwhen { context.input has env // <b>production</b>\n && context.input.env == \"production\" };";
        let text =
            format!("permit(principal, action == Action::\"refund\", resource);\n\n{second}\n");
        let set = PolicySet::load(vec![file("p.cedar", &text)]).unwrap();
        assert_eq!(
            set.policy("no-deletes").map(|p| p.text.as_str()),
            Some(second)
        );
        assert_eq!(
            set.policy("p.cedar#1").map(|p| p.text.as_str()),
            Some("permit(principal, action == Action::\"refund\", resource);")
        );
        assert!(set.policy("p.cedar#2").is_none());
    }

    #[test]
    fn the_digest_names_the_exact_text() {
        let a = PolicySet::load(vec![file(
            "a.cedar",
            "permit(principal, action, resource);",
        )]);
        let b = PolicySet::load(vec![file(
            "a.cedar",
            "permit(principal, action, resource); ",
        )]);
        let (Ok(a), Ok(b)) = (a, b) else {
            panic!("both load")
        };
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn bad_sets_are_refused_with_the_file_and_policy_named() {
        let cases = [
            ("permit(principal, action, resource", "not valid Cedar"),
            (
                r#"@id("x") permit(principal, action, resource); @id("x") forbid(principal, action, resource);"#,
                "used twice",
            ),
            (
                r#"@aprovals("2") permit(principal, action, resource);"#,
                "unknown annotation @aprovals",
            ),
            (
                // Reads a detail without testing that it is there.
                r#"permit(principal, action, resource) when { context.number.amount < 100 };"#,
                "do not match countersign's schema",
            ),
            (
                r#"permit(principal, action, resource) when { context.nothing == 1 };"#,
                "do not match countersign's schema",
            ),
            (
                r#"permit(principal == ?principal, action, resource);"#,
                "templates",
            ),
            (
                r#"@id("refunds,small") permit(principal, action, resource);"#,
                "an @id may not contain a comma",
            ),
        ];
        for (text, expected) in cases {
            let err = PolicySet::load(vec![file("bad.cedar", text)])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(
                err.contains("bad.cedar") || expected.contains("schema"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_id_made_from_a_file_name_with_a_comma_is_refused() {
        let text = "permit(principal, action, resource);";
        let err = PolicySet::load(vec![file("refunds,v2.cedar", text)])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("its file's name") && err.contains("refunds,v2.cedar"),
            "{err}"
        );
        // With an @id of its own the file's name does not matter.
        let named = format!("@id(\"refunds\") {text}");
        assert!(PolicySet::load(vec![file("refunds,v2.cedar", &named)]).is_ok());
    }

    #[test]
    fn detail_keys_read_by_policies_are_declared() {
        let set = PolicySet::load(vec![file(
            "p.cedar",
            r#"permit(principal, action, resource) when {
                 context.number has amount && context.number.amount < 100 &&
                 context.input has "env name" && context.input["env name"] == "staging" &&
                 context.decimal has rate && context.decimal.rate.lessThan(decimal("1.5"))
               };"#,
        )]);
        let set = match set {
            Ok(set) => set,
            Err(e) => panic!("{e}"),
        };
        assert!(
            set.schema().contains("\"amount\"?: Long"),
            "{}",
            set.schema()
        );
        assert!(set.schema().contains("\"env name\"?: String"));
        assert!(set.schema().contains("\"rate\"?: decimal"));
        assert!(!set.reads_agent_counts());
        let counts = PolicySet::load(vec![file(
            "c.cedar",
            "forbid(principal, action, resource) when { context.agent.recent > 50 };",
        )])
        .unwrap();
        assert!(counts.reads_agent_counts());
    }
}
