//! The budget layer on a plain `http::Request` service (feature `http`): the run and
//! caller a call charges are those of the `CallIds` extension the application inserts;
//! headers the caller sends never name them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use toolshield_budget::{BudgetLayer, BudgetLedger, Scope, WithoutRun};
use toolshield_core::{BoxError, CallIds, ErrorKind, ToolError};
use tower::{service_fn, Layer, Service, ServiceExt};

type Req = http::Request<String>;
type Res = http::Response<String>;

fn get(ids: Option<CallIds>) -> Req {
    let mut req = http::Request::get("http://search.example.com/q")
        .body(String::new())
        .expect("a valid request");
    if let Some(ids) = ids {
        req.extensions_mut().insert(ids);
    }
    req
}

/// An HTTP service answering 200, counting its calls.
fn web(
    calls: Arc<AtomicUsize>,
) -> impl Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone + Send + 'static {
    service_fn(move |_req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(http::Response::new(String::from("ok"))) }
    })
}

async fn outcomes<S>(svc: &S, ids: &CallIds, n: usize) -> Vec<Result<(), ErrorKind>>
where
    S: Service<Req, Response = Res, Error = ToolError> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        let r = svc.clone().oneshot(get(Some(ids.clone()))).await;
        out.push(r.map(|_| ()).map_err(|e| e.kind()));
    }
    out
}

#[tokio::test]
async fn an_http_run_gets_its_budget_and_another_run_its_own() {
    let ledger = BudgetLedger::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BudgetLayer::new(&ledger, "search.example.com", Some(2)).layer(web(calls.clone()));
    let run_a = CallIds::new().run_id("run-a");
    let run_b = CallIds::new().run_id("run-b");
    assert_eq!(
        outcomes(&svc, &run_a, 3).await,
        [Ok(()), Ok(()), Err(ErrorKind::BudgetExhausted)]
    );
    assert_eq!(outcomes(&svc, &run_b, 2).await, [Ok(()), Ok(())]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the refused call never reached the service"
    );
}

#[tokio::test]
async fn a_caller_scoped_budget_reads_the_caller_of_the_extension() {
    let ledger = BudgetLedger::new().scope(Scope::Caller);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BudgetLayer::new(&ledger, "search.example.com", Some(1)).layer(web(calls.clone()));
    let agent = CallIds::new().caller("agent-1");
    // Two runs of one caller share the caller's budget.
    assert_eq!(
        outcomes(&svc, &agent.clone().run_id("r1"), 1).await,
        [Ok(())]
    );
    assert_eq!(
        outcomes(&svc, &agent.run_id("r2"), 1).await,
        [Err(ErrorKind::BudgetExhausted)]
    );
}

#[tokio::test]
async fn a_request_without_ids_is_handled_as_a_call_without_a_run() {
    let calls = Arc::new(AtomicUsize::new(0));
    let rejecting = BudgetLedger::new().without_run(WithoutRun::Reject);
    let svc = BudgetLayer::new(&rejecting, "search.example.com", Some(5)).layer(web(calls.clone()));
    // A header naming a run is the caller's word, not the application's: not read.
    let mut req = get(None);
    req.headers_mut()
        .insert("x-run-id", http::HeaderValue::from_static("run-a"));
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let allowing = BudgetLedger::new().without_run(WithoutRun::Allow);
    let svc = BudgetLayer::new(&allowing, "search.example.com", Some(1)).layer(web(calls.clone()));
    for _ in 0..3 {
        svc.clone().oneshot(get(None)).await.unwrap();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "no run, no budget: every call passes"
    );
}
