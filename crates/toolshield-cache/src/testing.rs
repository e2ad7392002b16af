//! Test support for store implementations (feature `testing`): the store contract suite
//! ([`contract`]) and a fault-injecting wrapper ([`FaultyCacheStore`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use toolshield_core::faults::{Fault, FaultPlan};
use toolshield_core::ToolResponse;

use crate::store::{CacheLookup, CacheStore, StoreError, StoreFuture};

/// The operation names [`FaultyCacheStore`] asks its [`FaultPlan`] about: the
/// [`CacheStore`] method names.
pub const OPS: [&str; 3] = ["get", "put", "remove"];

/// A [`CacheStore`] wrapper that injects the faults of a [`FaultPlan`], so any store
/// (the in-memory one, Redis, a third party's) can be tested against a store that fails.
///
/// Each operation asks the plan once, with its method name (`"get"`, `"put"`,
/// `"remove"`: [`OPS`]), and then:
///
/// | fault | the real operation | the caller gets |
/// |---|---|---|
/// | none | performed | its result |
/// | [`Fault::Fail`] | not performed | a [`StoreError`] |
/// | [`Fault::Delay`] | performed after the delay (tokio time) | its result |
/// | [`Fault::ApplyThenFail`] | performed | a [`StoreError`] (the reply was lost) |
/// | [`Fault::ApplyLater`] | performed after the delay, in a task spawned on the tokio runtime (at once when there is none) | a [`StoreError`] at once |
/// | [`Fault::Hang`] | not performed | nothing, ever (until the caller gives up) |
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use serde_json::json;
/// use toolshield_cache::testing::FaultyCacheStore;
/// use toolshield_cache::{CacheStore, InMemoryCacheStore};
/// use toolshield_core::faults::{Fault, FaultPlan};
/// use toolshield_core::ToolResponse;
///
/// let plan = FaultPlan::new();
/// plan.once("put", Fault::ApplyThenFail);
/// let store = FaultyCacheStore::new(InMemoryCacheStore::new(), plan.clone());
/// let ttl = Duration::from_secs(60);
/// assert!(store.put("k", ToolResponse::new(json!(1)), ttl).await.is_err());
/// assert!(store.get("k").await.unwrap().is_some(), "applied all the same");
/// assert_eq!(plan.injected(), 1);
/// # }
/// ```
pub struct FaultyCacheStore<S> {
    inner: Arc<S>,
    plan: FaultPlan,
}

impl<S> Clone for FaultyCacheStore<S> {
    fn clone(&self) -> Self {
        FaultyCacheStore {
            inner: Arc::clone(&self.inner),
            plan: self.plan.clone(),
        }
    }
}

impl<S> std::fmt::Debug for FaultyCacheStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyCacheStore")
            .field("injected", &self.plan.injected())
            .finish_non_exhaustive()
    }
}

impl<S: CacheStore> FaultyCacheStore<S> {
    /// Wraps `inner`; `plan` (shared with its clones) decides the faults.
    pub fn new(inner: S, plan: FaultPlan) -> Self {
        Self::from_arc(Arc::new(inner), plan)
    }

    /// Wraps a store that is shared with other users (read it directly through the `Arc`).
    pub fn from_arc(inner: Arc<S>, plan: FaultPlan) -> Self {
        FaultyCacheStore { inner, plan }
    }

    /// The plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// The wrapped store, reached without faults.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Runs `op` on the wrapped store as `fault` says.
    fn run<'a, T, F, Fut>(
        &self,
        name: &'static str,
        fault: Option<Fault>,
        op: F,
    ) -> StoreFuture<'a, T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let injected =
            move |what: &str| StoreError::new(format!("injected fault: `{name}` {what}"));
        Box::pin(async move {
            match fault {
                None => op(inner).await,
                Some(Fault::Fail) => Err(injected("failed")),
                Some(Fault::Delay(delay)) => {
                    tokio::time::sleep(delay).await;
                    op(inner).await
                }
                Some(Fault::ApplyThenFail) => {
                    let _ = op(inner).await;
                    Err(injected("applied, reply lost"))
                }
                Some(Fault::ApplyLater(delay)) => {
                    match tokio::runtime::Handle::try_current() {
                        Ok(rt) => {
                            rt.spawn(async move {
                                tokio::time::sleep(delay).await;
                                let _ = op(inner).await;
                            });
                        }
                        // No runtime to wait on: it lands now, and the reply is lost.
                        Err(_) => {
                            let _ = op(inner).await;
                        }
                    }
                    Err(injected("failed, applied later"))
                }
                Some(Fault::Hang) => std::future::pending().await,
            }
        })
    }
}

impl<S: CacheStore> CacheStore for FaultyCacheStore<S> {
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<CacheLookup>> {
        let key = key.to_owned();
        self.run("get", self.plan.next("get"), move |s| async move {
            s.get(&key).await
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        response: ToolResponse,
        ttl: Duration,
    ) -> StoreFuture<'a, ()> {
        let key = key.to_owned();
        self.run("put", self.plan.next("put"), move |s| async move {
            s.put(&key, response, ttl).await
        })
    }

    fn remove<'a>(&'a self, key: &'a str) -> StoreFuture<'a, bool> {
        let key = key.to_owned();
        self.run("remove", self.plan.next("remove"), move |s| async move {
            s.remove(&key).await
        })
    }
}

/// The contract every [`CacheStore`](crate::CacheStore) must pass.
///
/// Each check panics with a message naming the broken rule. Waits are
/// `tokio::time::sleep` on the short TTLs the checks pass to the store, so the suite runs
/// under a paused tokio clock for the in-memory store and in real time against Redis.
///
/// ```no_run
/// # async fn demo() {
/// use toolshield_cache::{testing::contract, InMemoryCacheStore};
/// contract::run_all(InMemoryCacheStore::new).await;
/// # }
/// ```
pub mod contract {
    use std::time::Duration;

    use serde_json::json;
    use tokio::time::sleep;
    use toolshield_core::ToolResponse;

    use crate::store::{CacheStore, StoreError};

    /// The TTL the checks use.
    pub const TTL: Duration = Duration::from_millis(300);

    fn key(name: &str) -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        format!(
            "cache:{{contract}}:{name}-{t}-{}",
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn ok<T>(r: Result<T, StoreError>, what: &str) -> T {
        match r {
            Ok(v) => v,
            Err(e) => panic!("{what} failed: {e}"),
        }
    }

    fn response() -> ToolResponse {
        let mut r = ToolResponse::new(json!({"temp": 21.5, "city": "Paris", "list": [1, 2, 3]}));
        r.provenance.fetched_at = Some(chrono::Utc::now());
        r
    }

    /// Runs every check, each on a fresh store from `make`.
    pub async fn run_all<S, F>(make: F)
    where
        S: CacheStore,
        F: Fn() -> S,
    {
        put_then_get(&make()).await;
        missing_is_none(&make()).await;
        entries_expire(&make()).await;
        ttl_left_counts_down(&make()).await;
        put_replaces(&make()).await;
        zero_ttl_stores_nothing(&make()).await;
        remove_deletes(&make()).await;
        lookup_now_agrees_with_get(&make()).await;
        try_put_now_agrees_with_put(&make()).await;
    }

    /// `try_put_now`, where the store takes it, does what `put` does: the entry reads
    /// back unchanged through `get`, replaces an older one, expires after its TTL, and a
    /// zero TTL stores nothing. A store that declines hands the response back unchanged.
    pub async fn try_put_now_agrees_with_put<S: CacheStore + ?Sized>(s: &S) {
        let k = key("put-now");
        let r = response();
        if let Err(back) = s.try_put_now(&k, r.clone(), TTL) {
            assert_eq!(back, r, "a declined response must come back unchanged");
            return;
        }
        let got = ok(s.get(&k).await, "get").expect("an entry stored at once must be found");
        assert_eq!(
            got.response, r,
            "what was stored at once must read back unchanged"
        );
        assert!(
            got.ttl_left <= TTL && got.ttl_left > TTL / 2,
            "ttl_left {:?} must be close to {TTL:?}",
            got.ttl_left
        );
        let mut newer = response();
        newer.output = json!({"temp": 3});
        assert!(s.try_put_now(&k, newer.clone(), TTL).is_ok());
        let got = ok(s.get(&k).await, "get").expect("the newer entry");
        assert_eq!(
            got.response, newer,
            "a second write at once must replace the first"
        );
        let zero = key("put-now-zero");
        assert!(s.try_put_now(&zero, response(), Duration::ZERO).is_ok());
        assert!(
            ok(s.get(&zero).await, "get").is_none(),
            "a zero TTL stores nothing"
        );
        sleep(TTL + TTL / 2).await;
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "an entry stored at once must expire after its TTL"
        );
    }

    /// `lookup_now`, where the store answers it, answers what `get` does: the entry and
    /// about its time left, a miss for a key never written, removed or expired.
    pub async fn lookup_now_agrees_with_get<S: CacheStore + ?Sized>(s: &S) {
        let k = key("now");
        let r = response();
        ok(s.put(&k, r.clone(), TTL).await, "put");
        let got = ok(s.get(&k).await, "get").expect("a stored entry must be found");
        if let Some(now) = s.lookup_now(&k) {
            assert_eq!(now.response, got.response, "lookup_now and get disagree");
            assert!(
                now.ttl_left <= TTL && now.ttl_left > TTL / 2,
                "ttl_left {:?} must be close to {TTL:?}",
                now.ttl_left
            );
        }
        if s.answers_now() {
            // Its `None` is a miss: an entry `get` finds must be found at once too.
            assert!(
                s.lookup_now(&k).is_some(),
                "a store that answers every key at once must find a stored entry"
            );
        }
        assert!(s.lookup_now(&key("never")).is_none(), "a key never written");
        ok(s.remove(&k).await, "remove");
        assert!(s.lookup_now(&k).is_none(), "a removed key");
        ok(s.put(&k, r, TTL).await, "put");
        sleep(TTL + TTL / 2).await;
        assert!(s.lookup_now(&k).is_none(), "an expired key");
    }

    /// What was put reads back unchanged, with time left at most the TTL.
    pub async fn put_then_get<S: CacheStore + ?Sized>(s: &S) {
        let k = key("put");
        let r = response();
        ok(s.put(&k, r.clone(), TTL).await, "put");
        let got = ok(s.get(&k).await, "get").expect("a stored entry must be found");
        assert_eq!(
            got.response, r,
            "output and provenance must read back unchanged"
        );
        assert!(
            got.ttl_left <= TTL && got.ttl_left > TTL / 2,
            "ttl_left {:?} must be close to {TTL:?}",
            got.ttl_left
        );
    }

    /// A key never written is a miss.
    pub async fn missing_is_none<S: CacheStore + ?Sized>(s: &S) {
        assert!(ok(s.get(&key("missing")).await, "get").is_none());
    }

    /// An entry is gone after its TTL.
    pub async fn entries_expire<S: CacheStore + ?Sized>(s: &S) {
        let k = key("expire");
        ok(s.put(&k, response(), TTL).await, "put");
        sleep(TTL + TTL / 2).await;
        assert!(
            ok(s.get(&k).await, "get").is_none(),
            "an entry must expire after its TTL"
        );
    }

    /// The time left shrinks as time passes.
    pub async fn ttl_left_counts_down<S: CacheStore + ?Sized>(s: &S) {
        let k = key("countdown");
        ok(s.put(&k, response(), TTL).await, "put");
        sleep(TTL / 2).await;
        let got = ok(s.get(&k).await, "get").expect("entry within its TTL");
        assert!(
            got.ttl_left <= TTL / 2 + Duration::from_millis(20),
            "ttl_left {:?} must count down",
            got.ttl_left
        );
    }

    /// A second put replaces the entry and its TTL.
    pub async fn put_replaces<S: CacheStore + ?Sized>(s: &S) {
        let k = key("replace");
        ok(s.put(&k, response(), TTL).await, "put");
        let newer = ToolResponse::new(json!({"temp": 9}));
        ok(s.put(&k, newer.clone(), TTL * 3).await, "put");
        sleep(TTL + TTL / 2).await;
        let got = ok(s.get(&k).await, "get").expect("the replaced entry has the new TTL");
        assert_eq!(got.response.output, newer.output);
    }

    /// A zero TTL stores nothing.
    pub async fn zero_ttl_stores_nothing<S: CacheStore + ?Sized>(s: &S) {
        let k = key("zero");
        ok(s.put(&k, response(), Duration::ZERO).await, "put");
        assert!(ok(s.get(&k).await, "get").is_none());
    }

    /// `remove` deletes an entry and reports whether one was there.
    pub async fn remove_deletes<S: CacheStore + ?Sized>(s: &S) {
        let k = key("remove");
        assert!(!ok(s.remove(&k).await, "remove"));
        ok(s.put(&k, response(), TTL).await, "put");
        assert!(ok(s.remove(&k).await, "remove"));
        assert!(ok(s.get(&k).await, "get").is_none());
    }
}
