//! The annotations a `permit` carries to say how people must decide, and how the
//! requirements of several matching policies combine (the strictest wins).
//!
//! An unknown annotation is refused at load rather than ignored: `@aprovals("2")` must
//! not silently become "one person is enough".

use serde::Serialize;

/// Annotations that only name or describe a policy.
const DESCRIPTIVE: &[&str] = &["id", "reason"];
/// Annotations that send a matching request to people under conditions.
pub(crate) const REQUIREMENT: &[&str] = &["approvals", "approvers", "timeout_hours", "on_timeout"];
/// The most approvals a policy may require (countersign-core's `MAX_APPROVALS`: a bound
/// so that no request is made that nobody could approve in practice).
pub const MAX_APPROVALS: u32 = 10;
/// The longest a request may wait for people (as for a request's own timeout).
const MAX_TIMEOUT_HOURS: f64 = 168.0;

/// What a timeout becomes for the requests a policy covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// A signed rejection (`authorization_type: "fallback"`).
    Reject,
    /// A signed approval (`authorization_type: "fallback"`): only where a policy says so.
    Approve,
}

/// How people must decide a request, combined over every matching `permit` that
/// carries requirement annotations.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Requirements {
    /// `@approvals`: how many distinct accounts must approve (the largest of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals: Option<u32>,
    /// `@approvers`: the groups (`[groups]`) the deciders must come from. Policies that
    /// match together and name different groups cannot all be met (one request, one
    /// group), which the server treats as a refusal; see `conflicting_groups`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// `@timeout_hours`: the shortest of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_hours: Option<f64>,
    /// `@on_timeout`: `approve` only when every matching policy with requirements says
    /// approve; `reject` when any says reject; otherwise none (the request times out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

impl Requirements {
    /// The requirements one policy's annotations state, or why they are refused.
    pub(crate) fn of<'a>(
        annotations: impl Iterator<Item = (&'a str, &'a str)>,
        is_permit: bool,
    ) -> Result<Self, String> {
        let mut req = Self::default();
        for (key, value) in annotations {
            if DESCRIPTIVE.contains(&key) {
                continue;
            }
            if !REQUIREMENT.contains(&key) {
                return Err(format!(
                    "unknown annotation @{key} (known: {})",
                    DESCRIPTIVE
                        .iter()
                        .chain(REQUIREMENT)
                        .map(|k| format!("@{k}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if !is_permit {
                return Err(format!(
                    "@{key} is for permit policies: a forbid rejects at once"
                ));
            }
            match key {
                "approvals" => {
                    let n: u32 = value.trim().parse().map_err(|_| {
                        format!("@approvals({value:?}) is not a whole number of approvals")
                    })?;
                    if !(1..=MAX_APPROVALS).contains(&n) {
                        return Err(format!(
                            "@approvals({value:?}) must be 1 to {MAX_APPROVALS}"
                        ));
                    }
                    req.approvals = Some(n);
                }
                "approvers" => {
                    let group = value.trim();
                    if !is_group_name(group) {
                        return Err(format!(
                            "@approvers({value:?}) is not a group name (1 to 64 of a-z, 0-9, - _ .)"
                        ));
                    }
                    req.approvers = vec![group.to_string()];
                }
                "timeout_hours" => {
                    let hours: f64 = value.trim().parse().map_err(|_| {
                        format!("@timeout_hours({value:?}) is not a number of hours")
                    })?;
                    if !(hours > 0.0 && hours <= MAX_TIMEOUT_HOURS) {
                        return Err(format!(
                            "@timeout_hours({value:?}) must be more than 0 and at most {MAX_TIMEOUT_HOURS}"
                        ));
                    }
                    req.timeout_hours = Some(hours);
                }
                "on_timeout" => {
                    req.on_timeout = Some(match value.trim() {
                        "reject" => OnTimeout::Reject,
                        "approve" => OnTimeout::Approve,
                        other => {
                            return Err(format!(
                                "@on_timeout({other:?}) must be \"reject\" or \"approve\""
                            ));
                        }
                    });
                }
                _ => {}
            }
        }
        Ok(req)
    }

    /// Whether any requirement annotation was given.
    pub fn is_empty(&self) -> bool {
        self.approvals.is_none()
            && self.approvers.is_empty()
            && self.timeout_hours.is_none()
            && self.on_timeout.is_none()
    }

    /// The groups named when there is more than one: no approver can be asked to come
    /// from two groups at once, so such a request cannot be decided as every policy says.
    pub fn conflicting_groups(&self) -> Option<&[String]> {
        (self.approvers.len() > 1).then_some(self.approvers.as_slice())
    }

    /// The strictest of two sets of requirements.
    pub fn strictest(self, other: &Self) -> Self {
        let timeout_hours = match (self.timeout_hours, other.timeout_hours) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Approve only when both say approve; an explicit reject beats silence, and
        // silence (the request simply times out) beats approve.
        let on_timeout = match (self.on_timeout, other.on_timeout) {
            (Some(OnTimeout::Approve), Some(OnTimeout::Approve)) => Some(OnTimeout::Approve),
            (Some(OnTimeout::Reject), _) | (_, Some(OnTimeout::Reject)) => Some(OnTimeout::Reject),
            _ => None,
        };
        let approvals = match (self.approvals, other.approvals) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let mut approvers = self.approvers;
        for group in &other.approvers {
            if !approvers.contains(group) {
                approvers.push(group.clone());
            }
        }
        approvers.sort();
        Self {
            approvals,
            approvers,
            timeout_hours,
            on_timeout,
        }
    }
}

/// A group name as `[groups]` takes it (countersign-core's rule).
fn is_group_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)], permit: bool) -> Result<Requirements, String> {
        Requirements::of(pairs.iter().copied(), permit)
    }

    #[test]
    fn known_annotations_parse_and_unknown_ones_are_refused() {
        let req = of(
            &[
                ("id", "x"),
                ("timeout_hours", "4"),
                ("on_timeout", "approve"),
            ],
            true,
        )
        .unwrap_or_default();
        assert_eq!(req.timeout_hours, Some(4.0));
        assert_eq!(req.on_timeout, Some(OnTimeout::Approve));
        let err = of(&[("aprovals", "2")], true).err().unwrap_or_default();
        assert!(err.contains("unknown annotation @aprovals"), "{err}");
        let err = of(&[("timeout_hours", "0")], true)
            .err()
            .unwrap_or_default();
        assert!(err.contains("more than 0"), "{err}");
        let err = of(&[("timeout_hours", "soon")], true)
            .err()
            .unwrap_or_default();
        assert!(err.contains("not a number"), "{err}");
        let err = of(&[("on_timeout", "maybe")], true)
            .err()
            .unwrap_or_default();
        assert!(err.contains("\"reject\" or \"approve\""), "{err}");
        let err = of(&[("on_timeout", "approve")], false)
            .err()
            .unwrap_or_default();
        assert!(err.contains("for permit policies"), "{err}");
    }

    #[test]
    fn quorum_annotations_parse_and_bad_ones_are_refused() {
        let req = of(&[("approvals", "2"), ("approvers", "sre")], true).unwrap_or_default();
        assert_eq!(req.approvals, Some(2));
        assert_eq!(req.approvers, vec!["sre".to_string()]);
        assert!(!req.is_empty());
        for (key, value, says) in [
            ("approvals", "0", "1 to 10"),
            ("approvals", "11", "1 to 10"),
            ("approvals", "two", "whole number"),
            ("approvers", "SRE team", "not a group name"),
            ("approvers", "", "not a group name"),
        ] {
            let err = of(&[(key, value)], true).err().unwrap_or_default();
            assert!(err.contains(says), "{key}({value}): {err}");
        }
        let err = of(&[("approvals", "2")], false).err().unwrap_or_default();
        assert!(err.contains("for permit policies"), "{err}");
    }

    #[test]
    fn the_largest_quorum_wins_and_two_groups_conflict() {
        let two = of(&[("approvals", "2"), ("approvers", "sre")], true).unwrap_or_default();
        let three = of(&[("approvals", "3")], true).unwrap_or_default();
        let both = two.clone().strictest(&three);
        assert_eq!(both.approvals, Some(3));
        assert_eq!(both.approvers, vec!["sre".to_string()]);
        assert_eq!(both.conflicting_groups(), None);
        let finance = of(&[("approvers", "finance")], true).unwrap_or_default();
        let clash = two.strictest(&finance);
        assert_eq!(
            clash.conflicting_groups(),
            Some(&["finance".to_string(), "sre".to_string()][..])
        );
    }

    #[test]
    fn the_strictest_requirements_win() {
        let a = Requirements {
            timeout_hours: Some(4.0),
            on_timeout: Some(OnTimeout::Approve),
            ..Requirements::default()
        };
        let b = Requirements {
            timeout_hours: Some(1.0),
            on_timeout: Some(OnTimeout::Reject),
            ..Requirements::default()
        };
        let c = a.clone().strictest(&b);
        assert_eq!(c.timeout_hours, Some(1.0));
        assert_eq!(c.on_timeout, Some(OnTimeout::Reject));
        // A policy that says nothing about timeouts keeps its requests from being
        // approved by one: they time out, as without policies.
        let d = a.clone().strictest(&Requirements::default());
        assert_eq!(d.timeout_hours, Some(4.0));
        assert_eq!(d.on_timeout, None);
        assert_eq!(a.clone().strictest(&a).on_timeout, Some(OnTimeout::Approve));
    }
}
