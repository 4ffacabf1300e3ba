//! The crash harness for countersign: a server built with the SQLite writer's fail
//! points ([`server`]) and the loop that crashes, restarts and checks it ([`harness`]).

pub mod harness;
pub mod server;
