//! countersign's rules: Cedar policies that approve the safe, refuse the forbidden and
//! send the rest to people, and say which policy text decided.
//!
//! The mapping follows Cedar's own MCP work (`cedar-policy/cedar-for-agents`): each tool
//! is a Cedar action, its arguments are `context.input`, the caller is the principal.
//! Here the principal is the requesting agent (`Agent::"<token name>"`, in the groups the
//! config gives it), the action is the tool the request is about (`Action::"request"`
//! when it names none), and the resource is the server it reaches (`Server::"countersign"`
//! for a request made with `request_approval`). docs/policies.md is the user's guide;
//! [`schema`] is the published schema.
//!
//! Pure, like countersign-core: the caller passes the time, the counts and the files'
//! text; this crate reads nothing and writes nothing.

mod error;
mod eval;
mod index;
mod prefilter;
mod request;
mod requirements;
mod schema;
mod set;

pub use error::PolicyError;
pub use eval::{Evaluation, Input, Outcome};
pub use requirements::{OnTimeout, Requirements};
pub use schema::{BASE_SCHEMA, RESOURCE, base_schema};
pub use set::{PolicyFile, PolicyInfo, PolicySet};

/// The action of a request that names no tool.
pub const DEFAULT_ACTION: &str = "request";
