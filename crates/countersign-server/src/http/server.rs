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

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The start of the HTTP/2 connection preface (RFC 9113 section 3.4). No HTTP/1 method
/// starts with these three bytes.
const H2_PREFACE_START: &[u8; 3] = b"PRI";

/// Serves `app` on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// every open connection finish its in-flight requests, and returns when all are closed.
/// Handlers see the client's address as `ConnectInfo<SocketAddr>`.
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let graceful = GracefulShutdown::new();
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
        let connection = serve_connection(
            stream,
            remote,
            app.clone(),
            graceful.watcher(),
            shutdown.clone(),
        );
        tokio::spawn(connection);
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    watcher: Watcher,
    shutdown: CancellationToken,
) {
    // Answers are written whole; there is nothing to gain from Nagle's delay.
    let _ = stream.set_nodelay(true);
    let mut head = [0u8; 3];
    let peeked = tokio::select! {
        peeked = stream.peek(&mut head) => peeked,
        // A connection that has sent nothing yet has nothing in flight.
        _ = shutdown.cancelled() => return,
    };
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(axum::body::Body::new);
        request.extensions_mut().insert(ConnectInfo(remote));
        app.clone().oneshot(request)
    });
    let io = TokioIo::new(stream);
    let outcome = match peeked {
        // The client closed without a word, or the socket failed.
        Ok(0) | Err(_) => return,
        Ok(n) if n >= H2_PREFACE_START.len() && &head == H2_PREFACE_START => {
            let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            let served = watcher.watch(builder.serve_connection(io, service)).await;
            served.map_err(|err| err.to_string())
        }
        Ok(n) if n >= H2_PREFACE_START.len() => {
            let builder = hyper::server::conn::http1::Builder::new();
            let served = watcher.watch(builder.serve_connection(io, service)).await;
            served.map_err(|err| err.to_string())
        }
        // Fewer than three bytes so far: let hyper-util read until it can tell.
        Ok(_) => {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let served = watcher.watch(builder.serve_connection(io, service)).await;
            served.map_err(|err| err.to_string())
        }
    };
    if let Err(err) = outcome {
        tracing::debug!("connection from {remote} ended with an error: {err}");
    }
}
