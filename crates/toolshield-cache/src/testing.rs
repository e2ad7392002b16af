//! Test support for store implementations (feature `testing`).

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
