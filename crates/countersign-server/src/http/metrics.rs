//! `/metrics` (crate::metrics has the series), and the layers that count every HTTP
//! request by the route it matched.
//!
//! The route is read where axum knows it, on the matched route (`mark_route`, a route
//! layer), and carried out on the response to the outermost layer (`count`), which also
//! sees what never reaches a route: the Host guard's refusals and paths that match
//! nothing, counted as `unmatched` so that a scanner cannot add a series per path.

use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::time::Instant;

use super::auth::{Admin, Caller};
use super::error::ApiError;
use crate::gate::Gate;

/// The route template a response answered, put on it by [`mark_route`].
#[derive(Clone)]
struct Route(MatchedPath);

/// A route layer: remembers on the response which route template answered.
pub(super) async fn mark_route(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(Route(route));
    }
    response
}

/// The outermost layer: counts every request by route, method and status, and times it
/// to its response's headers (a stream, SSE or MCP, goes on after that).
pub(super) async fn count(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = request.method().clone();
    let response = next.run(request).await;
    let route = response
        .extensions()
        .get::<Route>()
        .map_or("unmatched", |r| r.0.as_str());
    gate.metrics()
        .http(route, &method, response.status().as_u16(), start.elapsed());
    response
}

/// `GET /metrics` with an admin's token.
pub(super) async fn scrape(Admin(Caller { gate, .. }): Admin) -> Result<Response, ApiError> {
    Ok(render(&gate).await?)
}

async fn render(gate: &Gate) -> Result<Response, crate::GateError> {
    let text = gate.metrics().render(&**gate.store(), gate.now()).await?;
    Ok((
        [(http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        text,
    )
        .into_response())
}

/// What `[server] metrics_listen` serves: `/metrics` with no credential, for a scraper
/// on a private network (docs/deployment.md#metrics). Nothing else is on it.
pub fn metrics_only(gate: Arc<Gate>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(gate): State<Arc<Gate>>| async move {
                render(&gate).await.map_err(ApiError)
            }),
        )
        .with_state(gate)
}
