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
/// Annotations that need quorum and separation of duties, which this version lacks.
const NEEDS_QUORUM: &[&str] = &["approvals", "approvers"];
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
            if NEEDS_QUORUM.contains(&key) {
                return Err(format!(
                    "@{key} needs quorum and separation of duties, which this version of \
                     countersign does not have yet; remove it (one person decides)"
                ));
            }
            match key {
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
        self.timeout_hours.is_none() && self.on_timeout.is_none()
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
        Self {
            timeout_hours,
            on_timeout,
        }
    }
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
    fn quorum_annotations_are_refused_until_quorum_exists() {
        for key in ["approvals", "approvers"] {
            let err = of(&[(key, "2")], true).err().unwrap_or_default();
            assert!(err.contains("needs quorum"), "{key}: {err}");
        }
    }

    #[test]
    fn the_strictest_requirements_win() {
        let a = Requirements {
            timeout_hours: Some(4.0),
            on_timeout: Some(OnTimeout::Approve),
        };
        let b = Requirements {
            timeout_hours: Some(1.0),
            on_timeout: Some(OnTimeout::Reject),
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
