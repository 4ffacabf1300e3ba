//! One real countersign server per fuzzing process: the axum router from
//! `countersign_server::router` over a SQLite store in a temporary directory (on
//! /dev/shm when there is one), with a change feed, the transparency log running, and
//! the fixtures' signing key, so proofs and bundles made by `fixtures` verify here too.
//! Requests go through `tower::ServiceExt::oneshot`, in process, with `Host: localhost`
//! as the host guard wants.
//!
//! It keeps requests in each state for the harnesses to aim at (pending, approved and
//! unused, used, rejected), replacing them when a fuzz input moves one on.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use countersign_core::evidence::Reviewer;
use countersign_server::gate::ReviewerSettings;
use countersign_core::{Channel, DecisionInput, NewRequest, Principal, Role, SystemClock, Verdict};
use countersign_server::{Decider, Gate, HttpConfig, KeyRing, Settings};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use http::{Request, StatusCode};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::fixtures::{ORIGIN, signer};

/// How long one request may take before the harness calls it a hang.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Server {
    pub rt: Runtime,
    pub app: Router,
    pub gate: Arc<Gate>,
    pub agent: String,
    pub approver: String,
    pub admin: String,
    agent_principal: Principal,
    approver_principal: Principal,
    pools: Mutex<Pools>,
    _shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

/// A request id in each state.
#[derive(Clone, Debug)]
pub struct Pools {
    pub pending: String,
    pub approved: String,
    pub used: String,
    pub rejected: String,
}

/// Which kind of request a harness wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pending,
    Approved,
    Used,
    Rejected,
}

pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(Server::start)
}

impl Server {
    fn start() -> Server {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let base = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm")
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        let shutdown = CancellationToken::new();
        let (gate, app) = rt.block_on(async {
            let store: Arc<dyn Store> =
                Arc::new(SqliteStore::open(&base.path().join("countersign.db")).unwrap());
            // The agent is the reviewer, so the review route is fuzzed past its checks.
            let settings = Settings {
                reviewer: Some(ReviewerSettings {
                    principal: "token:deploy-bot".into(),
                    label: Some(Reviewer {
                        id: "reviewer:qa".into(),
                        display_name: "QA".into(),
                    }),
                }),
                raw_payload_export: true,
                ..Settings::default()
            };
            let gate = Gate::builder(store, KeyRing::from_signer(signer()))
                .log_origin(ORIGIN)
                .settings(settings)
                .build()
                .await
                .unwrap();
            tokio::spawn(
                gate.log()
                    .clone()
                    .run(gate.feed().clone(), shutdown.clone()),
            );
            let config = HttpConfig {
                operator_tools: true,
                ..HttpConfig::default()
            };
            let app = countersign_server::router(gate.clone(), &config, shutdown.clone());
            (gate, app)
        });
        let setup = Principal::local_user("fuzz-setup", Role::Admin);
        let token = |name: &str, role| {
            rt.block_on(gate.create_token(name, role, &setup))
                .unwrap()
                .1
        };
        let agent = token("deploy-bot", Role::Agent);
        let approver = token("alice", Role::Approver);
        let admin = token("root", Role::Admin);
        let agent_principal = rt.block_on(gate.authenticate(&agent)).unwrap();
        let approver_principal = rt.block_on(gate.authenticate(&approver)).unwrap();
        let mut server = Server {
            rt,
            app,
            gate,
            agent,
            approver,
            admin,
            agent_principal,
            approver_principal,
            pools: Mutex::new(Pools {
                pending: String::new(),
                approved: String::new(),
                used: String::new(),
                rejected: String::new(),
            }),
            _shutdown: shutdown,
            _dir: base,
        };
        let pools = Pools {
            pending: server.make(Kind::Pending),
            approved: server.make(Kind::Approved),
            used: server.make(Kind::Used),
            rejected: server.make(Kind::Rejected),
        };
        server.pools = Mutex::new(pools);
        server
    }

    /// A new request in the state `kind`, made through the gate.
    fn make(&self, kind: Kind) -> String {
        self.rt.block_on(async {
            let new = NewRequest {
                description: "Pay invoice INV-7".into(),
                details: [("amount".to_string(), "120.00".to_string())].into(),
                requested_fields: vec!["po_number".into()],
                ..NewRequest::default()
            };
            let id = self
                .gate
                .request_approval(&self.agent_principal, new)
                .await
                .unwrap()
                .request
                .id;
            let decider = Decider::new(self.approver_principal.clone()).unwrap();
            let verdict = match kind {
                Kind::Pending => return id,
                Kind::Approved | Kind::Used => Verdict::Approved,
                Kind::Rejected => Verdict::Rejected,
            };
            let input = DecisionInput {
                comment: Some("ok".into()),
                fields: [("po_number".to_string(), "PO-1".to_string())].into(),
            };
            self.gate
                .decide(&decider, &id, verdict, input, Channel::Api)
                .await
                .unwrap();
            if kind == Kind::Used {
                self.gate
                    .record_action(&self.agent_principal, &id, "pay".into(), Default::default())
                    .await
                    .unwrap();
            }
            id
        })
    }

    pub fn id(&self, kind: Kind) -> String {
        let pools = self.pools.lock().unwrap();
        match kind {
            Kind::Pending => pools.pending.clone(),
            Kind::Approved => pools.approved.clone(),
            Kind::Used => pools.used.clone(),
            Kind::Rejected => pools.rejected.clone(),
        }
    }

    /// Replaces the pending and approved requests if an input moved them on.
    pub fn refresh(&self) {
        let (pending, approved, rejected) = {
            let pools = self.pools.lock().unwrap();
            (
                pools.pending.clone(),
                pools.approved.clone(),
                pools.rejected.clone(),
            )
        };
        // Still in its state, and (for an approval) usable for another minute.
        let soon = countersign_core::Clock::now(&SystemClock).plus_seconds(60);
        let status = |id: &str| {
            self.rt
                .block_on(self.gate.store().get_request(id))
                .unwrap()
                .filter(|r| r.decision.as_ref().is_none_or(|d| d.valid_until > soon))
                .map(|r| (r.status, r.action_record.is_some()))
        };
        if status(&pending) != Some((countersign_core::Status::Pending, false)) {
            let id = self.make(Kind::Pending);
            self.pools.lock().unwrap().pending = id;
        }
        if status(&approved) != Some((countersign_core::Status::Approved, false)) {
            let id = self.make(Kind::Approved);
            self.pools.lock().unwrap().approved = id;
        }
        // Reviews accumulate on a request (there is no limit), and every one rewrites
        // it: start over now and then, so runs keep their speed.
        let reviews = self
            .rt
            .block_on(self.gate.store().get_request(&rejected))
            .unwrap()
            .map_or(0, |r| r.reviews.len());
        if reviews >= 16 {
            let id = self.make(Kind::Rejected);
            self.pools.lock().unwrap().rejected = id;
        }
    }

    /// Sends one request through the router; returns the status, content type and body.
    pub fn send(&self, request: Request<Body>) -> (StatusCode, String, Vec<u8>) {
        let describe = format!("{} {}", request.method(), request.uri());
        self.rt.block_on(async {
            let exchange = async {
                let response = self.app.clone().oneshot(request).await.unwrap();
                let status = response.status();
                let content_type = response
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = axum::body::to_bytes(response.into_body(), 16 * 1024 * 1024)
                    .await
                    .unwrap_or_else(|e| panic!("{describe}: the body could not be read: {e}"));
                (status, content_type, body.to_vec())
            };
            match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
                Ok(result) => {
                    if std::env::var_os("FUZZ_DEBUG").is_some() {
                        let text = String::from_utf8_lossy(&result.2);
                        let end = text.char_indices().nth(400).map_or(text.len(), |(i, _)| i);
                        eprintln!("{describe} -> {} {}: {}", result.0, result.1, &text[..end]);
                    }
                    result
                }
                Err(_) => panic!("{describe} did not answer within {REQUEST_TIMEOUT:?}"),
            }
        })
    }
}

/// A request with the headers every harness sends.
pub fn request(method: &str, uri: &str, token: Option<&str>) -> http::request::Builder {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::HOST, "localhost");
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    builder
}

/// The server's answer must never be a 5xx other than 503 (busy), nor a panic.
pub fn check_status(what: &str, status: StatusCode, body: &[u8]) {
    assert!(
        !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
        "{what}: {status}: {}",
        String::from_utf8_lossy(body)
    );
}
