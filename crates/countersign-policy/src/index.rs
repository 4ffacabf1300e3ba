//! An index that lets a large set skip the policies that cannot match a request,
//! without changing any answer.
//!
//! Cedar evaluates every policy of the set it is given. A policy that names no action
//! (`forbid(principal, action, resource) when { context.room == "payments" }`) is in
//! the set of every request, so a thousand of those made every evaluation walk a
//! thousand conditions. Many policies start with a test for one value:
//! `context.room == "payments"`, `context.input.env == "production"`. Such a policy
//! cannot match a request whose value there is another one, and skipping it is exact
//! when nothing evaluated before that test can fail (Cedar's `&&` stops at the first
//! `false`, so an error after it is never reached).
//!
//! A policy has a [`Guard`] when the first of its leading tests that could fail is
//! `<context path> == <literal>` (or the literal first): before it, only its scope and
//! `has` tests on the context's records, which cannot fail. prefilter.rs reads those
//! tests (`Tests::guard`). Anything else is evaluated as always.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A literal a guard compares with, as the request's context holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Literal {
    Str(String),
    Long(i64),
    Bool(bool),
}

impl Literal {
    pub fn expression(self) -> cedar_policy::RestrictedExpression {
        match self {
            Literal::Str(s) => cedar_policy::RestrictedExpression::new_string(s),
            Literal::Long(n) => cedar_policy::RestrictedExpression::new_long(n),
            Literal::Bool(b) => cedar_policy::RestrictedExpression::new_bool(b),
        }
    }
}

/// `context.<path> == <literal>`, which the policy needs to be true.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Guard {
    pub path: Vec<String>,
    pub literal: Literal,
}

/// Policies (by their number in the set) split by guards: those that may apply to every
/// request, and per guarded path, those for each literal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Indexed {
    pub always: Vec<u32>,
    pub guarded: Vec<GuardedPath>,
}

#[derive(Debug, Clone)]
pub(crate) struct GuardedPath {
    pub path: Vec<String>,
    pub by_literal: HashMap<Literal, Vec<u32>>,
    /// All of them: for a request that has no value at the path (Cedar then fails or
    /// skips them as it would without the index).
    pub all: Vec<u32>,
}

impl Indexed {
    pub fn is_empty(&self) -> bool {
        self.always.is_empty() && self.guarded.is_empty()
    }

    /// Adds a policy, under its guard if it has one. Policies are added in the order of
    /// their numbers, so every list stays sorted.
    pub fn add(&mut self, policy: u32, guard: Option<&Guard>) {
        let Some(guard) = guard else {
            self.always.push(policy);
            return;
        };
        let at = match self.guarded.iter().position(|g| g.path == guard.path) {
            Some(at) => at,
            None => {
                self.guarded.push(GuardedPath {
                    path: guard.path.clone(),
                    by_literal: HashMap::new(),
                    all: Vec::new(),
                });
                self.guarded.len() - 1
            }
        };
        let path = &mut self.guarded[at];
        path.all.push(policy);
        path.by_literal
            .entry(guard.literal.clone())
            .or_default()
            .push(policy);
    }

    /// Every policy, unindexed (what the tests hold the index to), in order.
    pub fn every(&self) -> Vec<u32> {
        let mut every = self.always.clone();
        for path in &self.guarded {
            every.extend(&path.all);
        }
        every.sort_unstable();
        every.dedup();
        every
    }

    /// The policies whose guard a request meets, whose context value at a path is
    /// `value_at`, in order.
    pub fn candidates(&self, value_at: impl Fn(&[String]) -> Option<Literal>) -> Vec<u32> {
        let mut candidates = self.always.clone();
        for path in &self.guarded {
            match value_at(&path.path) {
                Some(value) => {
                    if let Some(policies) = path.by_literal.get(&value) {
                        candidates.extend(policies);
                    }
                }
                None => candidates.extend(&path.all),
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        candidates
    }
}

/// The Cedar sets made of the policies requests selected, kept for the next request that
/// selects the same ones (requests of one kind select the same few). Bounded by sets and
/// by the policies they hold together (each holds its own copy of its policies' text):
/// emptied when full.
#[derive(Debug, Default)]
pub(crate) struct SetCache(Mutex<Sets>);

#[derive(Debug, Default)]
struct Sets {
    by_selection: HashMap<Vec<u32>, Arc<cedar_policy::PolicySet>>,
    /// The policies the sets hold, together.
    held: usize,
}

impl SetCache {
    const MOST_SETS: usize = 4096;
    const MOST_POLICIES: usize = 65_536;

    /// The set of these policies (numbers into `policies`).
    pub fn get(
        &self,
        selected: &[u32],
        policies: &[cedar_policy::Policy],
    ) -> Result<Arc<cedar_policy::PolicySet>, String> {
        let lock = || self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(set) = lock().by_selection.get(selected) {
            return Ok(set.clone());
        }
        let mut set = cedar_policy::PolicySet::new();
        for &n in selected {
            let policy = policies
                .get(n as usize)
                .ok_or_else(|| format!("no policy number {n}"))?;
            set.add(policy.clone()).map_err(|e| e.to_string())?;
        }
        let set = Arc::new(set);
        let emptied = {
            let mut sets = lock();
            let full = sets.by_selection.len() >= Self::MOST_SETS
                || sets.held + selected.len() > Self::MOST_POLICIES;
            let emptied = if full {
                std::mem::take(&mut *sets)
            } else {
                Sets::default()
            };
            sets.held += selected.len();
            sets.by_selection.insert(selected.to_vec(), set.clone());
            emptied
        };
        // Freed outside the lock: thousands of sets take a while to drop.
        drop(emptied);
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(text: &str) -> Option<Guard> {
        let policy: cedar_policy::Policy = text.parse().unwrap();
        crate::prefilter::tests_of(&policy, &policy.to_json().unwrap()).guard()
    }

    fn on(path: &[&str], literal: Literal) -> Option<Guard> {
        Some(Guard {
            path: path.iter().map(|s| s.to_string()).collect(),
            literal,
        })
    }

    #[test]
    fn the_set_cache_stays_bounded_and_gives_the_selected_policies() {
        let policies: Vec<cedar_policy::Policy> = (0..13)
            .map(|n| {
                let text = format!(
                    "permit(principal, action, resource) when {{ context.number.n == {n} }};"
                );
                let policy: cedar_policy::Policy = text.parse().unwrap();
                policy.new_id(cedar_policy::PolicyId::new(format!("p{n}")))
            })
            .collect();
        let cache = SetCache::default();
        for mask in 1u32..5000 {
            let selected: Vec<u32> = (0..13).filter(|bit| mask & (1 << bit) != 0).collect();
            let set = cache.get(&selected, &policies).unwrap();
            let mut ids: Vec<String> = set.policies().map(|p| p.id().to_string()).collect();
            ids.sort_by_key(|id| id[1..].parse::<u32>().unwrap());
            let want: Vec<String> = selected.iter().map(|n| format!("p{n}")).collect();
            assert_eq!(ids, want);
            let sets = cache.0.lock().unwrap();
            assert!(sets.by_selection.len() <= SetCache::MOST_SETS);
            assert!(sets.held <= SetCache::MOST_POLICIES);
            assert_eq!(
                sets.held,
                sets.by_selection.keys().map(Vec::len).sum::<usize>()
            );
        }
        // The second time, the same set comes from the cache.
        let again = cache.get(&[4999 % 13], &policies).unwrap();
        assert!(Arc::ptr_eq(
            &again,
            &cache.get(&[4999 % 13], &policies).unwrap()
        ));
        assert!(cache.get(&[13], &policies).is_err(), "no policy 13");
    }

    #[test]
    fn a_first_equality_after_has_tests_is_a_guard() {
        assert_eq!(
            guard(
                r#"forbid(principal, action, resource) when { context has room && context.room == "payments" };"#
            ),
            on(&["room"], Literal::Str("payments".into()))
        );
        assert_eq!(
            guard(
                r#"permit(principal, action, resource) when { context.input has env && "prod" == context.input.env && context.number.count > 3 };"#
            ),
            on(&["input", "env"], Literal::Str("prod".into()))
        );
        assert_eq!(
            guard(r#"permit(principal, action, resource) when { context.gateway == true };"#),
            on(&["gateway"], Literal::Bool(true))
        );
        assert_eq!(
            guard(r#"permit(principal, action, resource) when { context.time.hour == 3 };"#),
            on(&["time", "hour"], Literal::Long(3))
        );
    }

    #[test]
    fn anything_that_could_fail_first_or_is_not_a_plain_equality_is_no_guard() {
        for text in [
            // A comparison before the equality could fail (a missing key).
            r#"forbid(principal, action, resource) when { context.number.count > 3 && context.room == "a" };"#,
            // `context.room has x` fails when there is no room.
            r#"forbid(principal, action, resource) when { context.room has x && context.input.env == "a" };"#,
            // An `unless` first, a disjunction, no condition, an inequality.
            r#"forbid(principal, action, resource) unless { context.room == "a" };"#,
            r#"forbid(principal, action, resource) when { context.room == "a" || context.room == "b" };"#,
            r#"forbid(principal, action, resource);"#,
            r#"forbid(principal, action, resource) when { context.room != "a" };"#,
            // Not the context, or two paths.
            r#"forbid(principal, action, resource) when { principal.name == "a" };"#,
            r#"forbid(principal, action, resource) when { context.input.a == context.input.b };"#,
        ] {
            assert_eq!(guard(text), None, "{text}");
        }
    }
}
