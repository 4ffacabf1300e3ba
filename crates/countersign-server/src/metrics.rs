//! What `/metrics` shows, in the Prometheus text format (docs/deployment.md#metrics).
//!
//! Two kinds of series. Counters and histograms count what this process did: requests
//! created and closed, decisions, deliveries, HTTP calls, how long requests waited for a
//! decision and how soon a waiting agent heard of it. Each is an atomic add on the path
//! it measures (no lock, no lookup: the label sets a decision can have are made once, at
//! start), and Prometheus sums them over instances. Gauges of what the database holds
//! (pending requests, the outbox's depth, the log's size, its last checkpoint's age) are
//! read from the store at each scrape, a few index reads, so that every instance of a
//! deployment reports the same truth.
//!
//! The registry and the text encoding are prometheus-client's; the histograms are
//! written here (`Buckets`) because its own takes a mutex on every observation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use countersign_core::{ApprovalRequest, AuthorizationType, Channel, Status, Timestamp, Verdict};
use countersign_store::{Store, kinds};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::error::GateError;

/// The `Content-Type` of what [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of a wait for a decision: a policy's instant answer to a
/// person's answer the next day.
const WAIT_BOUNDS: &[f64] = &[
    0.01, 0.1, 1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 604800.0,
];
/// Upper bounds (seconds) of a wake-up: milliseconds when it works, a second when only
/// the feed's poll caught the change.
const WAKEUP_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Upper bounds (seconds) of an HTTP call, to its response's headers; long polls hold
/// up to 300 s.
const HTTP_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// A histogram of fixed buckets, each an atomic counter; the sum is kept in nanoseconds.
#[derive(Debug, Clone)]
pub struct Buckets(Arc<BucketsInner>);

#[derive(Debug)]
struct BucketsInner {
    bounds: &'static [f64],
    /// One per bound, then one for +Inf; each counts the observations in its bucket only.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(BucketsInner {
            bounds,
            counts,
            sum_nanos: AtomicU64::new(0),
        }))
    }

    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = self
            .0
            .bounds
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(self.0.bounds.len());
        if let Some(count) = self.0.counts.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl TypedMetric for Buckets {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Buckets {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let bounds = self.0.bounds.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds
            .zip(self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' total, so that +Inf and _count agree even when an
        // observation lands while this is read.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    channel: &'static str,
    authorization_type: &'static str,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthorizationLabel {
    authorization_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    channel: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabel {
    channel: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: &'static str,
}

type BucketsFamily<S> = Family<S, Buckets, fn() -> Buckets>;

const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Approved,
    Status::Rejected,
    Status::TimedOut,
    Status::Cancelled,
];
const CHANNELS: [Channel; 6] = [
    Channel::Api,
    Channel::Mcp,
    Channel::Cli,
    Channel::Dashboard,
    Channel::Slack,
    Channel::Email,
];
const AUTHORIZATIONS: [AuthorizationType; 4] = [
    AuthorizationType::Human,
    AuthorizationType::Policy,
    AuthorizationType::Fallback,
    AuthorizationType::Grant,
];
const VERDICTS: [Verdict; 2] = [Verdict::Approved, Verdict::Rejected];
/// Where a delivery goes, as its metrics name it.
pub const DELIVERY_CHANNELS: [&str; 3] = ["webhook", "slack", "email"];
/// How a delivery finished.
#[derive(Debug, Clone, Copy)]
pub enum DeliveryOutcome {
    Sent,
    Skipped,
    Failed,
}

fn authorization(kind: AuthorizationType) -> &'static str {
    match kind {
        AuthorizationType::Human => "human",
        AuthorizationType::Policy => "policy",
        AuthorizationType::Fallback => "fallback",
        AuthorizationType::Grant => "grant",
    }
}

/// The channel a decision is counted under: the last approver's (who completed it), or
/// `none` for a rule's decision, which no person made.
fn decision_channel(request: &ApprovalRequest) -> &'static str {
    request
        .decision
        .as_ref()
        .and_then(|d| d.approvers.last())
        .map_or("none", |a| a.channel.as_str())
}

/// Everything `/metrics` shows; one per gate.
pub struct Metrics {
    registry: Registry,
    requests: Vec<(Status, Counter)>,
    decisions: Family<DecisionLabels, Counter>,
    /// The label sets a decision can have, made at start: a decision's count is then
    /// one atomic add.
    decision_counters: Vec<(DecisionLabels, Counter)>,
    waits: Vec<(AuthorizationType, Buckets)>,
    wakeups: Buckets,
    deliveries: Family<DeliveryLabels, Counter>,
    delivery_failures: Family<ChannelLabel, Counter>,
    http_requests: Family<HttpLabels, Counter>,
    http_durations: BucketsFamily<RouteLabels>,
    pending: Gauge,
    outbox_depth: Gauge,
    log_entries: Gauge,
    checkpoint_size: Gauge,
    checkpoint_age: Gauge<f64, AtomicU64>,
    /// One scrape at a time: each sets the gauges, then encodes them.
    scrape: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("countersign");
        let build = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
        build
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        registry.register("build_info", "The running countersign's version", build);

        let by_status = Family::<StatusLabel, Counter>::default();
        let requests = STATUSES
            .iter()
            .map(|s| {
                let labels = StatusLabel { status: s.as_str() };
                (*s, by_status.get_or_create_owned(&labels))
            })
            .collect();
        registry.register(
            "requests",
            "Requests that reached each status through this process (pending: created)",
            by_status,
        );

        let decisions = Family::<DecisionLabels, Counter>::default();
        let mut decision_counters = Vec::new();
        for kind in AUTHORIZATIONS {
            let channels: Vec<&'static str> = match kind {
                AuthorizationType::Human => CHANNELS.iter().map(Channel::as_str).collect(),
                _ => vec!["none"],
            };
            for channel in channels {
                for verdict in VERDICTS {
                    let labels = DecisionLabels {
                        channel,
                        authorization_type: authorization(kind),
                        decision: verdict.as_str(),
                    };
                    let counter = decisions.get_or_create_owned(&labels);
                    decision_counters.push((labels, counter));
                }
            }
        }
        registry.register(
            "decisions",
            "Final decisions made through this process, by channel and authorization type",
            decisions.clone(),
        );

        let wait_family: BucketsFamily<AuthorizationLabel> =
            Family::new_with_constructor(|| Buckets::new(WAIT_BOUNDS));
        let waits = AUTHORIZATIONS
            .iter()
            .map(|kind| {
                let labels = AuthorizationLabel {
                    authorization_type: authorization(*kind),
                };
                (*kind, wait_family.get_or_create_owned(&labels))
            })
            .collect();
        registry.register(
            "request_wait_seconds",
            "From a request's creation to its decision (decisions made through this process)",
            wait_family,
        );

        let wakeups = Buckets::new(WAKEUP_BOUNDS);
        registry.register(
            "wakeup_seconds",
            "From a decision (its decided_at, millisecond precision) to the answer of a call waiting for it on this process",
            wakeups.clone(),
        );

        let deliveries = Family::<DeliveryLabels, Counter>::default();
        let delivery_failures = Family::<ChannelLabel, Counter>::default();
        for channel in DELIVERY_CHANNELS {
            for outcome in ["sent", "skipped", "failed"] {
                deliveries.get_or_create_owned(&DeliveryLabels { channel, outcome });
            }
            delivery_failures.get_or_create_owned(&ChannelLabel { channel });
        }
        registry.register(
            "deliveries",
            "Notifications finished by this process: sent, skipped (nothing left to say) or failed (given up)",
            deliveries.clone(),
        );
        registry.register(
            "delivery_failures",
            "Failed delivery attempts by this process, including those retried later",
            delivery_failures.clone(),
        );

        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status",
            http_requests.clone(),
        );
        let http_durations: BucketsFamily<RouteLabels> =
            Family::new_with_constructor(|| Buckets::new(HTTP_BOUNDS));
        registry.register(
            "http_request_duration_seconds",
            "Time to an HTTP response's headers, by route template and method",
            http_durations.clone(),
        );

        let pending = Gauge::default();
        registry.register(
            "requests_pending",
            "Requests pending in the database now",
            pending.clone(),
        );
        let outbox_depth = Gauge::default();
        registry.register(
            "outbox_depth",
            "Notifications waiting to be sent or retried, in the database now",
            outbox_depth.clone(),
        );
        let log_entries = Gauge::default();
        registry.register(
            "log_entries",
            "Entries in the transparency log",
            log_entries.clone(),
        );
        let checkpoint_size = Gauge::default();
        registry.register(
            "log_checkpoint_size",
            "Entries covered by the latest signed checkpoint",
            checkpoint_size.clone(),
        );
        let checkpoint_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "log_checkpoint_age_seconds",
            "Time since the latest signed checkpoint was made (NaN before the first)",
            checkpoint_age.clone(),
        );

        Self {
            registry,
            requests,
            decisions,
            decision_counters,
            waits,
            wakeups,
            deliveries,
            delivery_failures,
            http_requests,
            http_durations,
            pending,
            outbox_depth,
            log_entries,
            checkpoint_size,
            checkpoint_age,
            scrape: tokio::sync::Mutex::new(()),
        }
    }

    fn reached(&self, status: Status) {
        if let Some((_, counter)) = self.requests.iter().find(|(s, _)| *s == status) {
            counter.inc();
        }
    }

    /// A request was stored.
    pub fn created(&self) {
        self.reached(Status::Pending);
    }

    /// A pending request was closed by this process (decided, timed out, cancelled).
    pub fn closed(&self, request: &ApprovalRequest) {
        self.reached(request.status);
        let Some(decision) = &request.decision else {
            return;
        };
        let labels = DecisionLabels {
            channel: decision_channel(request),
            authorization_type: authorization(decision.authorization_type),
            decision: decision.decision.as_str(),
        };
        match self.decision_counters.iter().find(|(l, _)| *l == labels) {
            Some((_, counter)) => {
                counter.inc();
            }
            // A combination not made at start (none is expected): counted all the same.
            None => {
                self.decisions.get_or_create(&labels).inc();
            }
        }
        let waited = request.requested_at.millis_until(decision.decided_at);
        if let Some((_, buckets)) = self
            .waits
            .iter()
            .find(|(k, _)| *k == decision.authorization_type)
        {
            buckets.observe(Duration::from_millis(waited.max(0).unsigned_abs()));
        }
    }

    /// A call that waited for `request` answers with its decision at `now`.
    pub fn woke(&self, request: &ApprovalRequest, now: Timestamp) {
        if let Some(decision) = &request.decision {
            let late = decision.decided_at.millis_until(now).max(0).unsigned_abs();
            self.wakeups.observe(Duration::from_millis(late));
        }
    }

    /// A delivery over `channel` (one of [`DELIVERY_CHANNELS`]) finished.
    pub fn delivered(&self, channel: &'static str, outcome: DeliveryOutcome) {
        let outcome = match outcome {
            DeliveryOutcome::Sent => "sent",
            DeliveryOutcome::Skipped => "skipped",
            DeliveryOutcome::Failed => "failed",
        };
        self.deliveries
            .get_or_create(&DeliveryLabels { channel, outcome })
            .inc();
    }

    /// An attempt to deliver over `channel` failed (it may be retried).
    pub fn delivery_failed(&self, channel: &'static str) {
        self.delivery_failures
            .get_or_create(&ChannelLabel { channel })
            .inc();
    }

    /// An HTTP request to `route` (a route template, or `unmatched`) was answered.
    pub fn http(&self, route: &str, method: &http::Method, status: u16, took: Duration) {
        let method = method_label(method);
        self.http_requests
            .get_or_create(&HttpLabels {
                route: route.to_string(),
                method,
                status,
            })
            .inc();
        self.http_durations
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                method,
            })
            .observe(took);
    }

    /// Reads the database's gauges and writes every series in the Prometheus text format.
    pub async fn render(&self, store: &dyn Store, now: Timestamp) -> Result<String, GateError> {
        let _one = self.scrape.lock().await;
        let pending = store.count_requests(Status::Pending).await?;
        let outbox = store.doc_count(kinds::DELIVERY_PENDING).await?;
        let entries = store.last_event_seq().await?;
        let checkpoint = store.checkpoint(None).await?;
        self.pending.set(gauge(pending));
        self.outbox_depth.set(gauge(outbox));
        self.log_entries.set(gauge(entries));
        match checkpoint {
            Some(checkpoint) => {
                self.checkpoint_size.set(gauge(checkpoint.size));
                let age = checkpoint.created_at.millis_until(now).max(0);
                self.checkpoint_age.set(age as f64 / 1000.0);
            }
            None => {
                self.checkpoint_size.set(0);
                self.checkpoint_age.set(f64::NAN);
            }
        }
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .map_err(|e| GateError::internal("could not write the metrics", e))?;
        Ok(text)
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The method as a label: the standard ones by name, anything else as `other`, so that
/// a client cannot add series by inventing methods.
fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::PATCH => "PATCH",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn encoded(metric: Buckets) -> String {
        let mut registry = Registry::default();
        registry.register("h_seconds", "a histogram", metric);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn buckets_are_cumulative_and_sum_in_seconds() {
        let h = Buckets::new(&[0.01, 1.0]);
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(10));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(3));
        let text = encoded(h);
        assert!(text.contains("h_seconds_bucket{le=\"0.01\"} 2\n"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"1\"} 3\n"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("h_seconds_count 4\n"), "{text}");
        assert!(text.contains("h_seconds_sum 3.515\n"), "{text}");
    }

    #[test]
    fn every_decision_a_person_can_make_has_its_counter_from_the_start() {
        let metrics = Metrics::new();
        // 6 channels x 2 verdicts for people, 3 rule kinds x 2 verdicts.
        assert_eq!(metrics.decision_counters.len(), 12 + 6);
        let labels: std::collections::HashSet<_> =
            metrics.decision_counters.iter().map(|(l, _)| l).collect();
        assert_eq!(labels.len(), 18, "no label set twice");
    }
}
