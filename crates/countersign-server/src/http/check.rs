//! A middleware that checks a request without waiting for anything and then answers it
//! or hands it on, adding no future of its own.
//!
//! `axum::middleware::from_fn` boxes a future per request that holds the request, the
//! next service and the middleware's state for as long as the request is answered: about
//! 1.3 KiB a layer, kept for the whole of a long poll. With 10,000 agents waiting that
//! was 13 MB a layer (`countersign-bench waiters`, docs/benchmarks.md). The host/origin
//! guard and the scope check need nothing asynchronous, so they run here instead: the
//! future a request is answered with is the inner service's own.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use futures_util::future::{Either, Ready, ready};
use tower::{Layer, Service};

/// What a check does: `None` hands the request on (possibly with extensions added),
/// `Some` is the answer that refuses it.
pub trait Check: Clone + Send + Sync + 'static {
    fn refusal(&self, request: &mut Request) -> Option<Response>;
}

/// Layers [`Checked`] with `C` over every route.
#[derive(Clone)]
pub struct CheckLayer<C>(pub C);

impl<S, C: Check> Layer<S> for CheckLayer<C> {
    type Service = Checked<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Checked {
            inner,
            check: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Checked<S, C> {
    inner: S,
    check: C,
}

impl<S, C> Service<Request> for Checked<S, C>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    C: Check,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        match self.check.refusal(&mut request) {
            None => Either::Right(self.inner.call(request)),
            Some(answer) => Either::Left(ready(Ok(answer))),
        }
    }
}
