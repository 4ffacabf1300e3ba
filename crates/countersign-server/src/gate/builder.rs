//! Assembling a gate: the store, the clock, the signing keys (published in the store so
//! every instance serves them), the change feed and the transparency log. The binary,
//! the crash harness and the tests all build their gate here, so none of them can wire
//! it differently.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{Clock, SystemClock};
use countersign_store::{ChangeFeed, Store};
use tokio_util::sync::CancellationToken;

use super::{Gate, Settings};
use crate::accounts::Accounts;
use crate::error::GateError;
use crate::keyring::KeyRing;
use crate::log::TransparencyLog;
use crate::rooms::Rooms;

/// How often the change feed looks for other processes' writes, unless told otherwise.
pub const DEFAULT_FEED_POLL: Duration = Duration::from_millis(50);

/// Where a gate's signing keys come from.
pub enum Keys {
    /// A directory (created on first use, with a new key).
    Dir(PathBuf),
    /// A key ring already loaded (fixed keys, in tests and fuzzing).
    Ring(KeyRing),
}

impl From<PathBuf> for Keys {
    fn from(dir: PathBuf) -> Self {
        Keys::Dir(dir)
    }
}

impl From<KeyRing> for Keys {
    fn from(ring: KeyRing) -> Self {
        Keys::Ring(ring)
    }
}

/// Builds a [`Gate`]; see [`Gate::builder`].
pub struct GateBuilder {
    store: Arc<dyn Store>,
    keys: Keys,
    clock: Arc<dyn Clock>,
    feed_poll: Duration,
    log_origin: Option<String>,
    settings: Settings,
}

impl GateBuilder {
    pub(super) fn new(store: Arc<dyn Store>, keys: Keys) -> Self {
        Self {
            store,
            keys,
            clock: Arc::new(SystemClock),
            feed_poll: DEFAULT_FEED_POLL,
            log_origin: None,
            settings: Settings::default(),
        }
    }

    /// Where the time comes from (a `FixedClock` in tests); the system clock by default.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How often the change feed polls for other processes' writes.
    pub fn feed_poll(mut self, every: Duration) -> Self {
        self.feed_poll = every;
        self
    }

    /// The transparency log's origin, used when the log is first created (an existing
    /// log keeps its own). By default `countersign/<12 random hex digits>`.
    pub fn log_origin(mut self, origin: impl Into<String>) -> Self {
        self.log_origin = Some(origin.into());
        self
    }

    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    pub async fn build(self) -> Result<Arc<Gate>, GateError> {
        let GateBuilder {
            store,
            keys,
            clock,
            feed_poll,
            log_origin,
            settings,
        } = self;
        settings.validate().map_err(GateError::BadInput)?;
        let keys = match keys {
            Keys::Ring(ring) => ring,
            Keys::Dir(dir) => KeyRing::open_or_create(&dir, clock.now())
                .map_err(|e| GateError::internal("could not load the signing key", e))?,
        };
        // Before this process publishes its own key: which keys were published before
        // keys were anchored (fixed once per database), for key files that have not had
        // their first anchored start yet.
        let legacy = if keys.anchored() {
            Vec::new()
        } else {
            super::keys::legacy_keys(&*store).await?
        };
        crate::keyring::publish(&*store, &keys)
            .await
            .map_err(|e| GateError::internal("could not publish the signing key", e))?;
        let keys = Arc::new(keys);
        let feed = ChangeFeed::start(store.clone(), feed_poll)
            .await
            .map_err(|e| GateError::internal("could not read the event log", e))?;
        let origin = match log_origin {
            Some(origin) => origin,
            None => crate::ids::log_origin()?,
        };
        let log = TransparencyLog::open(store.clone(), keys.clone(), clock.clone(), &origin)
            .await
            .map_err(|e| GateError::internal("could not open the transparency log", e))?;
        let log = Arc::new(log);
        let stopping = CancellationToken::new();
        let gate = Arc::new(Gate {
            accounts: Accounts::new(
                store.clone(),
                clock.clone(),
                settings.session_seconds,
                settings.max_sessions_per_account,
            )?,
            rooms: Rooms::new(
                store.clone(),
                feed.clone(),
                clock.clone(),
                settings.backup_dir.clone(),
                stopping.clone(),
                settings.groups.clone(),
                settings.room_messages_per_minute,
            ),
            store,
            feed,
            keys,
            clock,
            log,
            admission: super::Admission::new(&settings),
            settings,
            stopping,
            requester_locks: super::KeyedLocks::default(),
            policies: super::policy::Policies::default(),
            metrics: crate::metrics::Metrics::new(),
        });
        match gate.anchor_existing_keys(&legacy).await {
            Ok(endorsed) if !endorsed.is_empty() => {
                tracing::info!(?endorsed, "endorsed the existing keys in the log");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "could not endorse the existing keys"),
        }
        // Policies that do not load keep the gate from starting: better no server than
        // one that decides by rules nobody checked.
        if gate.settings.policy.is_some() {
            gate.reload_policies().await?;
        }
        Ok(gate)
    }
}
