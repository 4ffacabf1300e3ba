//! A middleware that checks a request without waiting for anything and then answers it
//! or hands it on, adding no future of its own.
//!
//! `axum::middleware::from_fn` boxes a future per request that holds the request, the
//! next service and the middleware's state for as long as the request is answered: about
//! 1.3 KiB a layer, kept for the whole of a long poll. With 10,000 agents waiting that
//! was 13 MB a layer (`countersign-bench waiters`, docs/benchmarks.md). The host/origin
//! guard and the scope check need nothing asynchronous, so they run here instead: the
//! future a request is answered with is the inner service's own.
//!
//! Authentication does wait (it reads the store), so [`AsyncCheckLayer`] runs its check
//! as a boxed future of its own, dropped as soon as it is done; the request is then
//! answered with the inner service's future, held in place of the check's.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready as ready_poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::future::{BoxFuture, Either, Ready, ready};
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

/// A check that waits for something (authentication reads the store): `Ok` hands the
/// request on (possibly with extensions added), `Err` is the answer that refuses it.
pub trait AsyncCheck: Clone + Send + Sync + 'static {
    fn check(&self, request: Request) -> BoxFuture<'static, Result<Request, Response>>;
}

/// Layers [`AsyncChecked`] with `C` over every route.
#[derive(Clone)]
pub struct AsyncCheckLayer<C>(pub C);

impl<S, C: AsyncCheck> Layer<S> for AsyncCheckLayer<C> {
    type Service = AsyncChecked<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AsyncChecked {
            inner,
            check: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AsyncChecked<S, C> {
    inner: S,
    check: C,
}

impl<S, C> Service<Request> for AsyncChecked<S, C>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
    C: AsyncCheck,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Checking<S>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The inner service is made ready when the check has passed (it is called
        // later, from the future).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        Checking::Checking {
            check: self.check.check(request),
            checked: None,
            inner: Some(self.inner.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The check's future, then the inner service's in its place.
    #[project = CheckingProj]
    pub enum Checking<S: Service<Request>> {
        Checking {
            check: BoxFuture<'static, Result<Request, Response>>,
            // The request once checked, while the inner service gets ready.
            checked: Option<Request>,
            inner: Option<S>,
        },
        Answering {
            #[pin]
            future: S::Future,
        },
    }
}

impl<S> Future for Checking<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                CheckingProj::Checking {
                    check,
                    checked,
                    inner,
                } => {
                    if checked.is_none() {
                        match ready_poll!(check.as_mut().poll(cx)) {
                            Ok(request) => *checked = Some(request),
                            Err(answer) => return Poll::Ready(Ok(answer)),
                        }
                    }
                    if let Some(service) = inner.as_mut() {
                        ready_poll!(service.poll_ready(cx))?;
                    }
                    let (Some(mut service), Some(request)) = (inner.take(), checked.take()) else {
                        // Polled again after it was handed on: cannot happen.
                        return Poll::Ready(Ok(
                            http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
                        ));
                    };
                    let future = service.call(request);
                    self.set(Checking::Answering { future });
                }
                CheckingProj::Answering { future } => return future.poll(cx),
            }
        }
    }
}
