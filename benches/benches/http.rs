//! The HTTP path, first attempt succeeds: a bare in-memory HTTP service (200, empty body)
//! as the baseline, then the toolshield-http stack around it (buffer > retry > breaker >
//! attempt timeout > error mapping), and the buffer layer alone (the body collected
//! once into `Full<Bytes>`). Each entry builds one request per call.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use toolshield_breaker::{BreakerLayer, BreakerRegistry};
use toolshield_http::{BufferBodyLayer, HttpErrorLayer};
use toolshield_retry::RetryLayer;
use toolshield_test::call_blocking;
use toolshield_timeout::TimeoutLayer;
use tower::{Service, ServiceBuilder};

/// An HTTP "client" that answers 200 with an empty body at once.
#[derive(Clone, Copy)]
struct BareHttp;

impl Service<Request<Full<Bytes>>> for BareHttp {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Full<Bytes>>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::new()))))
    }
}

fn request(body: &Bytes) -> Request<Full<Bytes>> {
    Request::get("http://api.example.com/users/7")
        .body(Full::new(body.clone()))
        .unwrap()
}

fn call<S>(svc: &mut S, req: Request<Full<Bytes>>)
where
    S: Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    let res = call_blocking(svc, req);
    assert_eq!(black_box(res).unwrap().status(), StatusCode::OK);
}

fn http_stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let body = Bytes::from_static(&[b'x'; 200]);

    let mut group = c.benchmark_group("http_first_attempt_success");
    let mut bare = BareHttp;
    group.bench_function("bare", |b| b.iter(|| call(&mut bare, request(&body))));

    let mut buffered = ServiceBuilder::new()
        .layer(BufferBodyLayer::default())
        .service(BareHttp);
    group.bench_function("buffer", |b| b.iter(|| call(&mut buffered, request(&body))));

    let mut stack = ServiceBuilder::new()
        .layer(BufferBodyLayer::default())
        .layer(RetryLayer::from_config(&Default::default()).unwrap())
        .layer(BreakerLayer::new(BreakerRegistry::default()))
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .layer(HttpErrorLayer::new())
        .service(BareHttp);
    group.bench_function("buffer_retry_breaker_timeout_errors", |b| {
        b.iter(|| call(&mut stack, request(&body)))
    });
    group.finish();
}

criterion_group!(benches, http_stack);
criterion_main!(benches);
