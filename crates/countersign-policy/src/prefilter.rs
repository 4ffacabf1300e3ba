//! The leading tests of a policy that countersign can settle without Cedar: a policy
//! one of them proves false is left out of the set Cedar evaluates, which changes no
//! answer.
//!
//! Cedar evaluates a policy as its scope, then its first condition's conjuncts, left to
//! right, stopping at the first `false`. The scope cannot fail; neither can `has` on the
//! context's records. So walking a policy's scope and first `when` in that order, a test
//! that is surely false proves the policy false without an error, as long as every test
//! before it either held or cannot fail. The walk stops at the first test it cannot
//! settle that could fail: from there on, only Cedar knows.
//!
//! The tests settled here are the ones policies start with: the principal's group or name
//! (`principal in Group::"sre"`), the resource, `has`, equality with a literal, and
//! comparisons with a number (`context.number.amount > 500`, `context.time.hour < 6`,
//! `context.decimal.amount.lessThan(decimal("100.0"))`).

use cedar_policy::{EntityUid, PrincipalConstraint, ResourceConstraint};
use serde_json::Value;

use crate::index::{Guard, Literal};

/// What a request is, as far as the tests here need it (eval.rs implements it from the
/// same input it builds Cedar's request from, so the two agree).
pub(crate) trait Facts {
    /// The value at `context.<path>`, when it is a string, a whole number or a boolean.
    fn value(&self, path: &[String]) -> Option<Literal>;
    /// `context.<path> has <key>` (`path` empty: `context has <key>`), where known.
    fn has(&self, path: &[String], key: &str) -> Option<bool>;
    /// `context.decimal.<key>`, as Cedar's decimal (ten-thousandths).
    fn decimal(&self, key: &str) -> Option<i64>;
    fn agent(&self) -> &str;
    fn in_group(&self, group: &str) -> bool;
    fn resource(&self) -> &str;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compare {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Compare {
    fn holds(self, left: i64, right: i64) -> bool {
        match self {
            Compare::Less => left < right,
            Compare::LessOrEqual => left <= right,
            Compare::Greater => left > right,
            Compare::GreaterOrEqual => left >= right,
        }
    }

    /// `a < b` is `b > a`.
    fn flipped(self) -> Self {
        match self {
            Compare::Less => Compare::Greater,
            Compare::LessOrEqual => Compare::GreaterOrEqual,
            Compare::Greater => Compare::Less,
            Compare::GreaterOrEqual => Compare::LessOrEqual,
        }
    }
}

/// One test a policy starts with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Test {
    /// `principal in <type>::"<id>"` (`is_in`) or `principal == <type>::"<id>"`.
    Principal { ty: String, id: String, is_in: bool },
    /// `resource in / == Server::"<id>"`.
    Resource { ty: String, id: String },
    /// `context.<path> has <key>`.
    Has { path: Vec<String>, key: String },
    /// `context.<path> == <literal>`.
    Equals { path: Vec<String>, literal: Literal },
    /// `context.<path> <compare> <whole number>`.
    Number {
        path: Vec<String>,
        compare: Compare,
        bound: i64,
    },
    /// `context.decimal.<key>.lessThan(decimal("..."))` and its kin.
    Decimal {
        key: String,
        compare: Compare,
        bound: i64,
    },
}

/// A test, and whether Cedar could fail evaluating it (a missing attribute, a type).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    pub test: Test,
    pub cannot_fail: bool,
}

impl Test {
    /// Whether the request passes the test, where that is certain.
    fn holds(&self, facts: &impl Facts) -> Option<bool> {
        match self {
            Test::Principal { ty, id, is_in } => match ty.as_str() {
                "Agent" => Some(facts.agent() == id),
                // The agent's only ancestors are its groups; it is never one.
                "Group" => Some(*is_in && facts.in_group(id)),
                _ => None,
            },
            Test::Resource { ty, id } => (ty == "Server").then(|| facts.resource() == id),
            Test::Has { path, key } => facts.has(path, key),
            Test::Equals { path, literal } => facts.value(path).map(|value| value == *literal),
            Test::Number {
                path,
                compare,
                bound,
            } => match facts.value(path)? {
                Literal::Long(value) => Some(compare.holds(value, *bound)),
                _ => None,
            },
            Test::Decimal {
                key,
                compare,
                bound,
            } => facts.decimal(key).map(|value| compare.holds(value, *bound)),
        }
    }
}

/// A policy's leading tests, and whether they are the whole policy (its scope and its
/// one condition, every conjunct a test): then settling them all settles the policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tests {
    pub steps: Vec<Step>,
    pub complete: bool,
}

/// What the tests say of a policy for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// It cannot match (and Cedar would report no error for it).
    False,
    /// It matches, without an error: every test of a complete policy held.
    True,
    /// Only Cedar knows.
    Open,
}

impl Tests {
    /// `False` only when a test is surely false and every one before it held or cannot
    /// fail; `True` only when the policy is complete and every test held.
    pub fn settle(&self, facts: &impl Facts) -> Settled {
        let mut all_held = true;
        for step in &self.steps {
            match step.test.holds(facts) {
                Some(true) => {}
                Some(false) => return Settled::False,
                None if step.cannot_fail => all_held = false,
                None => return Settled::Open,
            }
        }
        if all_held && self.complete {
            Settled::True
        } else {
            Settled::Open
        }
    }
}

impl Tests {
    /// The equality the index files the policy under (index.rs): the first test that
    /// could fail, when it is `context.<path> == <literal>` (every test before it
    /// cannot fail, so a request with another value there cannot match).
    pub fn guard(&self) -> Option<Guard> {
        match &self.steps.iter().find(|step| !step.cannot_fail)?.test {
            Test::Equals { path, literal } => Some(Guard {
                path: path.clone(),
                literal: literal.clone(),
            }),
            _ => None,
        }
    }
}

/// The tests of a policy: its principal and resource scope, then its first `when`'s
/// conjuncts, up to the first one that is not a test above.
pub(crate) fn tests_of(policy: &cedar_policy::Policy, est: &Value) -> Tests {
    let mut steps = Vec::new();
    let mut complete = true;
    let scope = |test: Test| Step {
        test,
        cannot_fail: true,
    };
    let named = |uid: &EntityUid| {
        (
            uid.type_name().to_string(),
            uid.id().unescaped().to_string(),
        )
    };
    let principal = match policy.principal_constraint() {
        PrincipalConstraint::In(uid) => Some((uid, true)),
        PrincipalConstraint::Eq(uid) => Some((uid, false)),
        PrincipalConstraint::IsIn(_, uid) => {
            // The `is` part is left to Cedar.
            complete = false;
            Some((uid, true))
        }
        PrincipalConstraint::Is(_) => {
            complete = false;
            None
        }
        PrincipalConstraint::Any => None,
    };
    if let Some((uid, is_in)) = principal {
        let (ty, id) = named(&uid);
        steps.push(scope(Test::Principal { ty, id, is_in }));
    }
    match policy.resource_constraint() {
        ResourceConstraint::In(uid) | ResourceConstraint::Eq(uid) => {
            let (ty, id) = named(&uid);
            steps.push(scope(Test::Resource { ty, id }));
        }
        ResourceConstraint::Is(_) | ResourceConstraint::IsIn(..) => complete = false,
        ResourceConstraint::Any => {}
    }
    let conditions = est
        .get("conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(first) = conditions.first() else {
        return Tests { steps, complete };
    };
    complete &= conditions.len() == 1;
    let body = match (first.get("kind").and_then(Value::as_str), first.get("body")) {
        (Some("when"), Some(body)) => body,
        _ => {
            return Tests {
                steps,
                complete: false,
            };
        }
    };
    let mut conjuncts = Vec::new();
    flatten_and(body, &mut conjuncts);
    for conjunct in conjuncts {
        match step_of(conjunct) {
            Some(step) => steps.push(step),
            None => {
                complete = false;
                break;
            }
        }
    }
    Tests { steps, complete }
}

/// The context's records that every request has: `has` on them cannot fail (on
/// `context.room`, a string, it could).
const RECORDS: [&str; 5] = ["input", "number", "decimal", "time", "agent"];

fn step_of(expr: &Value) -> Option<Step> {
    if let Some(has) = expr.get("has") {
        let path = path_of(has.get("left"))?;
        let key = has.get("attr")?.as_str()?.to_string();
        let cannot_fail =
            path.is_empty() || (path.len() == 1 && RECORDS.contains(&path[0].as_str()));
        // A `has` that could fail is not settled here.
        return cannot_fail.then_some(Step {
            test: Test::Has { path, key },
            cannot_fail,
        });
    }
    let test = if let Some(eq) = expr.get("==") {
        let (left, right) = (eq.get("left")?, eq.get("right")?);
        let (path, literal) = match (path_of(Some(left)), literal_of(right)) {
            (Some(path), Some(literal)) => (path, literal),
            _ => (path_of(Some(right))?, literal_of(left)?),
        };
        if path.is_empty() {
            return None;
        }
        Test::Equals { path, literal }
    } else if let Some((compare, operands)) = [
        ("<", Compare::Less),
        ("<=", Compare::LessOrEqual),
        (">", Compare::Greater),
        (">=", Compare::GreaterOrEqual),
    ]
    .into_iter()
    .find_map(|(op, compare)| expr.get(op).map(|o| (compare, o)))
    {
        let (left, right) = (operands.get("left")?, operands.get("right")?);
        let long = |v: &Value| match literal_of(v) {
            Some(Literal::Long(n)) => Some(n),
            _ => None,
        };
        let (path, compare, bound) = match (path_of(Some(left)), long(right)) {
            (Some(path), Some(bound)) => (path, compare, bound),
            _ => (path_of(Some(right))?, compare.flipped(), long(left)?),
        };
        if path.is_empty() {
            return None;
        }
        Test::Number {
            path,
            compare,
            bound,
        }
    } else {
        let (compare, args) = [
            ("lessThan", Compare::Less),
            ("lessThanOrEqual", Compare::LessOrEqual),
            ("greaterThan", Compare::Greater),
            ("greaterThanOrEqual", Compare::GreaterOrEqual),
        ]
        .into_iter()
        .find_map(|(method, compare)| expr.get(method).map(|a| (compare, a)))?;
        let [receiver, argument] = args.as_array()?.as_slice() else {
            return None;
        };
        let path = path_of(Some(receiver))?;
        let [record, key] = path.as_slice() else {
            return None;
        };
        let [literal] = argument.get("decimal")?.as_array()?.as_slice() else {
            return None;
        };
        let bound = scaled(literal.get("Value")?.as_str()?)?;
        if record != "decimal" {
            return None;
        }
        Test::Decimal {
            key: key.clone(),
            compare,
            bound,
        }
    };
    // Equality and comparisons fail on a missing attribute or a wrong type, which the
    // facts then cannot settle either.
    Some(Step {
        test,
        cannot_fail: false,
    })
}

/// `a && b && c`, parsed as `(a && b) && c`, in the order Cedar evaluates them.
fn flatten_and<'a>(expr: &'a Value, out: &mut Vec<&'a Value>) {
    match expr.get("&&") {
        Some(and) => match (and.get("left"), and.get("right")) {
            (Some(left), Some(right)) => {
                flatten_and(left, out);
                flatten_and(right, out);
            }
            _ => out.push(expr),
        },
        None => out.push(expr),
    }
}

/// The attribute path of `context.a.b` (empty for `context` itself).
fn path_of(expr: Option<&Value>) -> Option<Vec<String>> {
    let expr = expr?;
    if expr.get("Var").and_then(Value::as_str) == Some("context") {
        return Some(Vec::new());
    }
    let access = expr.get(".")?;
    let mut path = path_of(access.get("left"))?;
    path.push(access.get("attr")?.as_str()?.to_string());
    Some(path)
}

fn literal_of(expr: &Value) -> Option<Literal> {
    match expr.get("Value")? {
        Value::String(s) => Some(Literal::Str(s.clone())),
        Value::Bool(b) => Some(Literal::Bool(*b)),
        Value::Number(n) => n.as_i64().map(Literal::Long),
        _ => None,
    }
}

/// Cedar's decimal as ten-thousandths: `-?digits.digits` with one to four places.
pub(crate) fn scaled(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = digits.split_once('.')?;
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !plain(whole) || !plain(frac) || frac.len() > 4 {
        return None;
    }
    let places = 10i64.pow(4 - frac.len() as u32);
    let whole = whole.parse::<i64>().ok()?.checked_mul(10_000)?;
    let frac = frac.parse::<i64>().ok()?.checked_mul(places)?;
    // Built on the side of its sign, so that Cedar's least value fits too.
    if negative {
        (-whole).checked_sub(frac)
    } else {
        whole.checked_add(frac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Tests {
        let policy: cedar_policy::Policy = text.parse().unwrap();
        tests_of(&policy, &policy.to_json().unwrap())
    }

    fn tests(text: &str) -> Vec<Test> {
        read(text).steps.into_iter().map(|s| s.test).collect()
    }

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_leading_tests_are_read_in_order() {
        assert_eq!(
            tests(
                r#"permit(principal in Group::"sre", action, resource == Server::"gate") when { context.number has amount && 500 < context.number.amount && context.decimal.amount.lessThan(decimal("-0.5")) && context.time.hour <= 6 };"#
            ),
            vec![
                Test::Principal {
                    ty: "Group".into(),
                    id: "sre".into(),
                    is_in: true
                },
                Test::Resource {
                    ty: "Server".into(),
                    id: "gate".into()
                },
                Test::Has {
                    path: path(&["number"]),
                    key: "amount".into()
                },
                Test::Number {
                    path: path(&["number", "amount"]),
                    compare: Compare::Greater,
                    bound: 500
                },
                Test::Decimal {
                    key: "amount".into(),
                    compare: Compare::Less,
                    bound: -5000
                },
                Test::Number {
                    path: path(&["time", "hour"]),
                    compare: Compare::LessOrEqual,
                    bound: 6
                },
            ]
        );
        assert_eq!(
            tests(r#"forbid(principal == Agent::"bot", action, resource);"#),
            vec![Test::Principal {
                ty: "Agent".into(),
                id: "bot".into(),
                is_in: false
            }]
        );
    }

    #[test]
    fn a_policy_is_complete_when_its_tests_are_all_of_it() {
        for (text, complete) in [
            (
                r#"permit(principal in Group::"sre", action, resource) when { context has room && context.room == "ops" };"#,
                true,
            ),
            (
                r#"forbid(principal == Agent::"bot", action, resource);"#,
                true,
            ),
            // Something after the tests, a second condition, an `is` in the scope.
            (
                r#"permit(principal, action, resource) when { context.number has n && context.description like "*x*" };"#,
                false,
            ),
            (
                r#"permit(principal, action, resource) when { context.gateway == true } when { context.gateway == true };"#,
                false,
            ),
            (
                r#"permit(principal is Agent, action, resource) when { context.gateway == true };"#,
                false,
            ),
            (
                r#"permit(principal, action, resource) unless { context.gateway == true };"#,
                false,
            ),
        ] {
            assert_eq!(read(text).complete, complete, "{text}");
        }
    }

    #[test]
    fn the_walk_stops_at_what_it_cannot_read() {
        // A disjunction, then an equality: only Cedar knows past the `||`.
        assert_eq!(
            tests(
                r#"permit(principal, action, resource) when { (context.room == "a" || context.gateway) && context.number.n > 3 };"#
            ),
            vec![]
        );
        // `has` on a string could fail; an `unless` is not read.
        assert_eq!(
            tests(
                r#"permit(principal, action, resource) when { context.room has x && context.number.n > 3 };"#
            ),
            vec![]
        );
        assert_eq!(
            tests(r#"permit(principal, action, resource) unless { context.number.n > 3 };"#),
            vec![]
        );
        // Two paths compared, and a decimal compared with a path.
        assert_eq!(
            tests(
                r#"permit(principal, action, resource) when { context.number.a < context.number.b };"#
            ),
            vec![]
        );
    }

    #[test]
    fn decimals_scale_as_cedar_reads_them() {
        assert_eq!(scaled("100.0"), Some(1_000_000));
        assert_eq!(scaled("0.0001"), Some(1));
        assert_eq!(scaled("-0.5"), Some(-5000));
        assert_eq!(scaled("12.25"), Some(122_500));
        assert_eq!(scaled("-922337203685477.5808"), Some(i64::MIN));
        assert_eq!(scaled("922337203685477.5807"), Some(i64::MAX));
        assert_eq!(scaled("922337203685477.5808"), None);
        for not in [
            "1",
            "1.",
            ".5",
            "1.23456",
            "a.b",
            "922337203685478.0",
            "+1.0",
        ] {
            assert_eq!(scaled(not), None, "{not:?}");
        }
    }
}
