//! The HTTP server loop: countersign's router on hyper, HTTP/1.1 and HTTP/2 (prior
//! knowledge), with graceful shutdown.
//!
//! Why not `axum::serve`: it tells HTTP/1 from HTTP/2 with hyper-util's `auto` builder,
//! which reads the first 24 bytes of a connection and hands them to hyper's HTTP/1 parser
//! as a read of their own. The parser's buffer, sized for 8 KiB, then grows to 16 KiB to
//! take the rest of the request, on every connection. An agent waiting for a decision
//! holds its connection for minutes, so with 10,000 of them that alone was 80 MB. Here
//! the protocol is chosen by peeking at the socket, and hyper reads the request into its
//! 8 KiB buffer in one go (`countersign-bench waiters`, docs/benchmarks.md).
//!
//! It also bounds what a connection may hold without doing anything: the time to the
//! first bytes and to the end of the headers (`header_timeout`, also the idle time of a
//! keep-alive connection between requests), the time to the end of a request's body
//! (`body_timeout`), and how many connections are open at once (`max_connections`). A
//! request that is being answered (a long poll, the dashboard's event stream) is not
//! idle, however long it lasts.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::extract::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The start of the HTTP/2 connection preface (RFC 9113 section 3.4). No HTTP/1 method
/// starts with these three bytes.
const H2_PREFACE_START: &[u8; 3] = b"PRI";

/// What a connection may take and hold; `HttpConfig` holds the configured values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// To the first bytes, to the end of a request's headers, and between requests.
    pub header_timeout: Duration,
    /// From the end of a request's headers to the end of its body.
    pub body_timeout: Duration,
    /// Connections open at once; more are refused (and the first refusal logged).
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            // Above the 10,000 agents waiting at once that docs/benchmarks.md measures.
            max_connections: 16_384,
        }
    }
}

/// How long an idle connection told to close may take to do so.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// What a client refused at the connection limit reads, if it reads at all.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 89\r\n\r\n{\"error\":{\"code\":\"unavailable\",\"message\":\"too many open connections; retry in a moment\"}}";

/// Serves `app` on `listener` with the default [`ConnectionLimits`]; see [`serve_with`].
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    serve_with(listener, app, shutdown, ConnectionLimits::default()).await
}

/// Serves `app` on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// every open connection finish its in-flight requests, and returns when all are closed.
/// Handlers see the client's address as `ConnectInfo<SocketAddr>`.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    limits: ConnectionLimits,
) {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    // Refused since the limit was last reached: logged once per burst, not per refusal.
    let mut refused: u64 = 0;
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors or memory, or a connection reset before it
                    // was accepted: none is fatal. Back off a moment so a full descriptor
                    // table does not turn this loop into a busy one.
                    tracing::warn!("accepting a connection failed: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if refused == 0 {
                tracing::warn!(
                    "connection limit reached: {max} connections are open (max_connections); refusing new ones until some close"
                );
            }
            refused += 1;
            // Best effort, without waiting: the client may be gone or not reading.
            let _ = stream.try_write(BUSY);
            continue;
        };
        if refused > 0 {
            tracing::warn!(
                "accepting connections again; {refused} were refused at the limit of {max} (max_connections)"
            );
            refused = 0;
        }
        let connection = serve_connection(stream, remote, app.clone(), limits, shutdown.clone());
        tokio::spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    // Every connection holds a slot until it is closed.
    let _ = slots
        .acquire_many(u32::try_from(max).unwrap_or(u32::MAX))
        .await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// Which protocol the client speaks, from its first three bytes (without reading them);
/// `None` if it closed first.
async fn sniff(stream: &TcpStream) -> Option<Protocol> {
    let mut head = [0u8; 3];
    loop {
        match stream.peek(&mut head).await {
            Ok(0) | Err(_) => return None,
            Ok(n) if n >= head.len() => {
                return Some(if &head == H2_PREFACE_START {
                    Protocol::Http2
                } else {
                    Protocol::Http1
                });
            }
            // A peek returns at once while any byte is there: look again shortly.
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    // Answers are written whole; there is nothing to gain from Nagle's delay.
    let _ = stream.set_nodelay(true);
    // The sniffing is boxed (its timers are gone once it is done), so that the task
    // that serves a connection for as long as it stays open does not keep room for it.
    let sniffing = Box::pin(tokio::time::timeout(limits.header_timeout, sniff(&stream)));
    let protocol = tokio::select! {
        sniffed = sniffing => match sniffed {
            Ok(Some(protocol)) => protocol,
            // The client closed without a word, or the socket failed.
            Ok(None) => return,
            Err(_) => {
                tracing::debug!("connection from {remote} sent nothing within {:?}; closed", limits.header_timeout);
                return;
            }
        },
        // A connection that has sent nothing yet has nothing in flight.
        _ = shutdown.cancelled() => return,
    };
    let (open, _) = watch::channel(0usize);
    let open = Arc::new(open);
    let requests = open.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let answering = Answering::new(&requests);
        let mut request = request.map(|body| Body::new(Deadline::new(body, limits.body_timeout)));
        request.extensions_mut().insert(ConnectInfo(remote));
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(Answered {
                    body,
                    _answering: answering,
                })
            }))
        }
    });
    let io = TokioIo::new(stream);
    let idle = limits.header_timeout;
    let outcome = match protocol {
        Protocol::Http2 => {
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder.timer(TokioTimer::new());
            // Boxed, each protocol's connection on its own: the task then holds a
            // pointer, not room for the larger of the two (an HTTP/2 connection's state
            // is several KiB, and nearly every connection is HTTP/1).
            Box::pin(drive(
                builder.serve_connection(io, service),
                &open,
                idle,
                &shutdown,
            ))
            .await
        }
        Protocol::Http1 => {
            let mut builder = hyper::server::conn::http1::Builder::new();
            // Also bounds the wait for the next request on a keep-alive connection.
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            Box::pin(drive(
                builder.serve_connection(io, service),
                &open,
                idle,
                &shutdown,
            ))
            .await
        }
    };
    if let Err(err) = outcome {
        tracing::debug!("connection from {remote} ended with an error: {err}");
    }
}

/// Runs a connection to its end, closing it gracefully (in-flight requests finish) on
/// shutdown or once it has had no request open for `idle`.
async fn drive<C>(
    connection: C,
    open: &watch::Sender<usize>,
    idle: Duration,
    shutdown: &CancellationToken,
) -> Result<(), String>
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    tokio::pin!(connection);
    let mut closing = false;
    // An idle connection closed gracefully that is still open a moment later (an
    // HTTP/2 client that never finished its preface) is dropped: nothing is in flight.
    // Boxed, and only while it runs, like the idle timer: an open connection keeps no
    // room for timers it is not running.
    let mut drop_at: Option<Pin<Box<Sleep>>> = None;
    loop {
        tokio::select! {
            served = connection.as_mut() => return served.map_err(|e| e.to_string()),
            _ = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = idle_for(open.subscribe(), idle), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
                drop_at = Some(Box::pin(tokio::time::sleep(IDLE_GRACE)));
            }
            _ = until(&mut drop_at), if drop_at.is_some() => {
                if *open.borrow() == 0 {
                    return Err(format!("idle for {idle:?}; closed"));
                }
                drop_at = None;
            }
        }
    }
}

/// Returns when `sleep` ends; never if there is none.
async fn until(sleep: &mut Option<Pin<Box<Sleep>>>) {
    match sleep {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Returns once no request has been open for `idle`.
async fn idle_for(mut open: watch::Receiver<usize>, idle: Duration) {
    loop {
        if open.wait_for(|n| *n == 0).await.is_err() {
            return;
        }
        // Boxed: while a request is open (a long poll) this future keeps no timer.
        tokio::select! {
            _ = Box::pin(tokio::time::sleep(idle)) => {
                if *open.borrow() == 0 {
                    return;
                }
            }
            changed = open.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// A request being answered, from its headers to the end of its answer's body.
struct Answering(Arc<watch::Sender<usize>>);

impl Answering {
    fn new(open: &Arc<watch::Sender<usize>>) -> Self {
        open.send_modify(|n| *n += 1);
        Self(open.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// An answer's body, holding its request open until it is sent (or dropped).
struct Answered {
    body: Body,
    _answering: Answering,
}

impl HttpBody for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that must arrive whole by a deadline (`body_timeout` after its
/// headers). The timer starts only if a handler reads the body and it is not all there.
struct Deadline {
    body: Incoming,
    by: Instant,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Deadline {
    fn new(body: Incoming, timeout: Duration) -> Self {
        Self {
            body,
            by: Instant::now() + timeout,
            timeout,
            timer: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} (body_timeout)")]
struct BodyTimeout(Duration);

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let by = this.by;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(by)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimeout(this.timeout).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
