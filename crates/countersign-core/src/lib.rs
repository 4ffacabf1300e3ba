//! countersign's domain, with no I/O: approval requests and their state machine,
//! decisions, the action digest, signed proofs (DSSE envelopes over Ed25519) and their
//! verification, and the events every state change emits.
//!
//! Auditors can use this crate as a library to verify proofs offline: it needs nothing
//! but the proof, the published keys (JWKS) and, optionally, the action.

pub mod accounts;
pub mod action;
pub mod anchor;
pub mod arguments;
pub mod audit;
pub mod bundle;
pub mod checkpoint;
pub mod decision;
pub mod error;
pub mod event;
pub mod evidence;
pub mod grant;
pub mod groups;
pub mod jcs;
pub mod keys;
pub mod logcheck;
pub mod merkle;
pub mod principal;
pub mod proof;
pub mod quorum;
pub mod redeem;
pub mod request;
pub mod rooms;
pub mod scope;
pub mod time;
pub mod token;

pub use action::{Action, ActionDigest};
pub use decision::{ActionRecord, Decision, DecisionInput, Verdict};
pub use error::{CoreError, NotCounted};
pub use event::{Event, EventKind, LogEntry, PayloadOpening, SealedEvent};
pub use grant::{Grant, GrantRef, NewGrant};
pub use groups::{Groups, Identities};
pub use keys::{Jwk, Jwks, Signer};
pub use principal::{Approver, AuthMethod, Channel, Decider, Principal, Role};
pub use proof::{
    AuthorizationType, Envelope, PolicyRef, Problem, ProblemCode, Statement, VerifyOptions,
    VerifyReport,
};
pub use quorum::{DecisionAccounts, Quorum, RecordedApproval};
pub use request::{
    ApprovalRequest, Limits, NewRequest, PolicyHold, RequestId, SealedTransition, Status,
    Transition,
};
pub use scope::{Scope, Scopes};
pub use time::{Clock, FixedClock, SystemClock, Timestamp};
pub use token::TokenRecord;

#[cfg(test)]
mod testutil;
