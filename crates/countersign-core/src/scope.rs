//! Scopes: what a credential may reach, within what its role allows. A role states the
//! most its credentials may do ([`crate::Role::scopes`]); a token may be narrowed to a
//! subset (an agent that may only ask for approvals, or only use rooms). Every REST
//! route and MCP tool names the one scope it needs, so the set is small and each scope
//! reads as a job.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Ask for approvals and follow them through: request, check, wait, cancel, record
    /// the action and its outcome.
    Request,
    /// Rooms: post, read, wait, join, leave, presence, the soft and hard gates.
    Rooms,
    /// Evidence: record autonomous decisions and reviews, export and verify bundles,
    /// read the transparency log.
    Evidence,
    /// Verify a proof (`verify_proof`).
    Verify,
    /// Redeem a proof: consume an approval for exactly its action (`redeem_proof`).
    Redeem,
    /// Speak for a gateway in the agent's path (`countersign proxy`, `hook`, `exec`
    /// against a remote `serve`): classify the calls it holds (policies see
    /// `context.gateway`; a trusted upstream's read-only tool may pass unasked), claim an
    /// approved call for its one forward and record what came of it. Never part of a
    /// token unless named: an agent's own token must not pass itself off as the gateway
    /// that stands in its path.
    Gateway,
    /// Decide requests and list them; answer room questions, resolve blockers, run rooms.
    Decide,
    /// Manage tokens and read the delivery history.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 8] = [
        Scope::Request,
        Scope::Rooms,
        Scope::Evidence,
        Scope::Verify,
        Scope::Redeem,
        Scope::Gateway,
        Scope::Decide,
        Scope::Admin,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Request => "request",
            Scope::Rooms => "rooms",
            Scope::Evidence => "evidence",
            Scope::Verify => "verify",
            Scope::Redeem => "redeem",
            Scope::Gateway => "gateway",
            Scope::Decide => "decide",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown scope {s:?}: scopes are {}",
                    Scopes::of(Scope::ALL).to_text()
                )
            })
    }
}

/// A set of scopes, listed in a fixed order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Scopes(BTreeSet<Scope>);

impl Scopes {
    pub fn of(scopes: impl IntoIterator<Item = Scope>) -> Self {
        Self(scopes.into_iter().collect())
    }

    pub fn contains(&self, scope: Scope) -> bool {
        self.0.contains(&scope)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn is_subset(&self, of: &Scopes) -> bool {
        self.0.is_subset(&of.0)
    }

    /// The scopes in both sets.
    pub fn intersection(&self, other: &Scopes) -> Scopes {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = Scope> + '_ {
        self.0.iter().copied()
    }

    /// A comma-separated list, e.g. `request,verify`: how tokens store and show them.
    pub fn to_text(&self) -> String {
        self.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses a comma-separated list (spaces around names are ignored). An empty list is
    /// refused: a credential that may reach nothing is a mistake.
    pub fn parse_list(text: &str) -> Result<Self, String> {
        let scopes = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<Scopes, String>>()?;
        if scopes.is_empty() {
            return Err("give at least one scope".into());
        }
        Ok(scopes)
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<T: IntoIterator<Item = Scope>>(iter: T) -> Self {
        Self::of(iter)
    }
}

impl std::fmt::Display for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_in_any_order_and_print_in_one() {
        let scopes = Scopes::parse_list(" verify, request ,verify").unwrap();
        assert_eq!(scopes.to_text(), "request,verify");
        assert_eq!(Scopes::parse_list(&scopes.to_text()).unwrap(), scopes);
        let err = Scopes::parse_list("request,deploy").unwrap_err();
        assert!(
            err.contains("\"deploy\"") && err.contains("request,rooms"),
            "{err}"
        );
        assert!(Scopes::parse_list(" , ").is_err());
    }

    #[test]
    fn sets_compare() {
        let small = Scopes::of([Scope::Verify]);
        let big = Scopes::of([Scope::Verify, Scope::Redeem]);
        assert!(small.is_subset(&big) && !big.is_subset(&small));
        assert_eq!(big.intersection(&small), small);
        assert_eq!(
            serde_json::to_value(&big).unwrap(),
            serde_json::json!(["verify", "redeem"])
        );
    }
}
