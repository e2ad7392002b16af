//! [`Cache`]: the service and its hit / miss / single-flight / stale-if-error paths.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;
use toolshield_core::config::deadline_after;
use toolshield_core::keys;
use toolshield_core::time;
use toolshield_core::IntoToolError;
use toolshield_core::{Digest, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_store::{take_ready, StorePath, StoreService};
use tower_service::Service;

use crate::config::CacheConfig;
use crate::flight::{self, Flights, FlightsRef, Follower, Join, Leader};
use crate::future::ResponseFuture;
use crate::handle::Shared;
use crate::layer::CacheLayer;
use crate::store::{CacheLookup, StoreError};

/// Marks a request whose result belongs to its caller: its cache key is namespaced by
/// the caller id whatever the tool's configuration (`req.extension(PerUser)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerUser;

/// The storage key of a cached result, in the one injective encoding every store uses
/// ([`toolshield_core::keys::storage_key`]): `cache:{tool}:-:<digest>` for a result
/// shared by every caller, `cache:{tool}:s<len>:<caller>:<digest>` for one namespaced by
/// `caller`. The tool is escaped and the caller length-prefixed, so no tool name or
/// caller id can reach another's entry; the braces are a Redis Cluster hash tag.
///
/// ```
/// use toolshield_core::Digest;
/// let d = Digest::of_bytes(b"{}");
/// let k = toolshield_cache::storage_key("weather", Some("agent-7"), &d);
/// assert_eq!(k, format!("cache:{{weather}}:s7:agent-7:{d}"));
/// assert_eq!(toolshield_cache::storage_key("weather", None, &d), format!("cache:{{weather}}:-:{d}"));
/// // A tool name and a caller that would once have spelled the same key do not.
/// assert_ne!(
///     toolshield_cache::storage_key("a", Some("b}:c"), &d),
///     toolshield_cache::storage_key("a}:b", Some("c"), &d),
/// );
/// ```
pub fn storage_key(tool: &str, caller: Option<&str>, digest: &Digest) -> String {
    // The digest in hex on the stack: the key is the only allocation.
    keys::storage_key("cache", tool, caller, digest.hex().as_str())
}

/// The cache service: see [`CacheLayer`]. A [`StoreService`] whose [`StorePath`] is the
/// layer's (below).
pub type Cache<S> = StoreService<S, CacheLayer>;

/// The storage key of `req` under `policy`, or `None` when the request is not cached.
pub(crate) fn key_for(req: &ToolRequest, policy: &CacheConfig) -> Option<String> {
    if !req.call_kind().is_cacheable() || policy.ttl.is_zero() {
        return None;
    }
    // A payload RFC 8785 cannot represent is not cached; the tool decides what it means.
    let digest = req.payload_digest().ok()?;
    let caller = if policy.per_user || req.extensions().get::<PerUser>().is_some() {
        // A result that belongs to its caller, for a call that names none (or a blank
        // one), is not cached: it would be served to every other call without a caller.
        Some(
            req.meta()
                .caller_id
                .as_deref()
                .filter(|c| !c.trim().is_empty())?,
        )
    } else {
        None
    };
    Some(storage_key(req.tool(), caller, &digest))
}

impl StorePath<ToolRequest> for CacheLayer {
    type Response = ToolResponse;

    fn call<S>(&self, inner: &mut S, req: ToolRequest) -> ResponseFuture<S::Future>
    where
        S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
        S::Error: IntoToolError + Send,
        S::Future: Send + 'static,
    {
        if !req.call_kind().is_cacheable() {
            return ResponseFuture::passthrough(inner.call(req));
        }
        // The grace cut to what the store can keep past the TTL (see `CacheConfig::kept`).
        let policy = self.config.kept();
        let Some(key) = key_for(&req, &policy) else {
            return ResponseFuture::passthrough(inner.call(req));
        };
        // A store that answers without I/O is asked here. A fresh hit is answered at once:
        // no future to box, no clone of the service. A miss joins the key's flight at
        // once; its leader calls the tool from here, with the service it was given (no
        // clone of it, no second look). A follower, a stale entry and a store with I/O
        // take the full path.
        match self.shared.store.lookup_now(&key) {
            Some(found) if found.ttl_left > policy.stale_if_error => {
                self.shared.counters.hits.bump();
                return ResponseFuture::ready(Ok(hit(found.response)));
            }
            None if self.shared.store.answers_now() => {
                let caller = req.meta().caller_id.as_ref();
                if let Join::Lead(leader) =
                    flight::join(Held(Arc::clone(&self.shared)), &key, caller)
                {
                    let deadline = req.deadline_at();
                    let called = inner.call(req);
                    return ResponseFuture::boxed(Box::pin(lead(
                        leader, called, key, policy, deadline,
                    )));
                }
            }
            _ => {}
        }
        let svc = take_ready(inner);
        ResponseFuture::boxed(Box::pin(run(
            Arc::clone(&self.shared),
            Some((svc, req)),
            key,
            policy,
        )))
    }
}

/// Whether a failure may be answered with a stale entry: the tool is unavailable (a
/// retriable error, an execution failure, an open circuit), not wrong input or access.
fn serves_stale(kind: ErrorKind) -> bool {
    kind.is_retriable() || matches!(kind, ErrorKind::ExecutionFailed | ErrorKind::CircuitOpen)
}

/// A stale entry kept by a leader in case its tool fails, and when its grace ends.
struct Stale {
    response: ToolResponse,
    until: Instant,
}

/// Marks an answer the cache served (a fresh hit, a stale entry, a follower's share of a
/// flight). The caller did not wait for the tool, so the slow-call mark of the call that
/// fetched the data is not this call's: kept, every hit of a slow result would show
/// `provenance.slow` and count again in `tool_slow_calls_total`.
fn hit(mut resp: ToolResponse) -> ToolResponse {
    resp.provenance.cache_hit = true;
    resp.clear_slow();
    resp
}

/// The full path: a miss, a stale entry, or a store with I/O.
///
/// Written for a small future, as the layer boxes it on every miss: an async block, the
/// call's service and request in one `Option` that nothing else copies, the service
/// dropped before the tool's future is awaited, no value of a look kept past it, the
/// answer stored from where it lies, and a stale entry, which few calls have, boxed.
// Not an async fn: it kept each argument twice (the argument and the body's binding).
#[allow(clippy::manual_async_fn)]
fn run<S>(
    shared: Arc<Shared>,
    mut call: Option<(S, ToolRequest)>,
    key: String,
    policy: CacheConfig,
) -> impl Future<Output = Result<ToolResponse, ToolError>>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: IntoToolError,
{
    async move {
        let mut first = true;
        let (leader, stale) = loop {
            let stale = match look(&shared, &key, first).await {
                Ok(Some(found)) if found.ttl_left > policy.stale_if_error => {
                    shared.counters.hits.bump();
                    return Ok(hit(found.response));
                }
                // The grace is judged when the tool has failed, against when it ends.
                Ok(Some(found)) => Some(Box::new(Stale {
                    until: deadline_after(time::now(), found.ttl_left),
                    response: found.response,
                })),
                Ok(None) => None,
                Err(e) => {
                    shared.counters.store_errors.bump();
                    tracing::warn!(error = %e, "cache store unavailable: calling the tool");
                    None
                }
            };
            first = false;
            let caller = call.as_ref().and_then(|(_, r)| r.meta().caller_id.as_ref());
            match flight::join(&*shared, &key, caller) {
                Join::Lead(leader) => break (leader, stale),
                Join::Follow(follower) => match follow(follower, &call).await? {
                    Some(result) => {
                        shared.counters.coalesced.bump();
                        return result.map(hit);
                    }
                    // The leader was dropped or cancelled: look again, and lead if
                    // nobody else does.
                    None => continue,
                },
            }
        };
        let Some((deadline, called)) = call
            .take()
            .map(|(mut svc, req)| (req.deadline_at(), svc.call(req)))
        else {
            return Err(ToolError::internal("cache called the tool twice"));
        };
        settle(leader, called, &key, policy, stale, deadline).await
    }
}

/// What a follower's wait ends with: the leader's result, `None` when the follower looks
/// again (its leader gave up), or the follower's own `TIMEOUT` at its deadline.
type Followed = Result<Option<Result<ToolResponse, ToolError>>, ToolError>;

/// A follower's wait for its leader, bounded by the follower's own request deadline: the
/// attempt timeout enforces that deadline on a call that reaches it, and a follower never
/// does, so it leaves here with `TIMEOUT` at its deadline (at once when it has passed)
/// while the leader runs on. Boxed: followers are few, and the full path stays small.
fn follow<S>(
    follower: Follower,
    call: &Option<(S, ToolRequest)>,
) -> Pin<Box<dyn Future<Output = Followed> + Send>> {
    let deadline = call.as_ref().and_then(|(_, req)| req.deadline_at());
    Box::pin(async move {
        match deadline {
            Some(at) => tokio::time::timeout_at(at, follower.wait())
                .await
                .map_err(|_| ToolError::timeout("call reached its deadline")),
            None => Ok(follower.wait().await),
        }
    })
}

/// The layer's state, owned by a flight's leader made in `call`.
struct Held(Arc<Shared>);

/// What a flight's leader holds the layer's state by: borrowed by the full path, which
/// owns it, or owned ([`Held`]) by a miss led from `call`.
trait HoldsShared: FlightsRef {
    fn shared(&self) -> &Shared;
}

impl FlightsRef for Held {
    fn flights(&self) -> &Flights {
        &self.0.flights
    }
}

impl HoldsShared for Held {
    fn shared(&self) -> &Shared {
        &self.0
    }
}

impl FlightsRef for &Shared {
    fn flights(&self) -> &Flights {
        &self.flights
    }
}

impl HoldsShared for &Shared {
    fn shared(&self) -> &Shared {
        self
    }
}

/// A miss led from `call`: the tool's call is already made; it ends as the full path's
/// leader does.
fn lead<F, E>(
    leader: Leader<Held>,
    called: F,
    key: String,
    policy: CacheConfig,
    deadline: Option<Instant>,
) -> impl Future<Output = Result<ToolResponse, ToolError>>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: IntoToolError,
{
    settle(leader, called, key, policy, None, deadline)
}

/// A leader's tool call to its end: counted as a miss, its success stamped with
/// `fetched_at` and stored (unless the output reports an error in-band), its failure
/// answered with the `stale` entry while its grace lasts; the result is handed to the
/// flight's followers, unless it is a `TIMEOUT` at the leader's own `deadline`: that is
/// the leader's budget running out (the attempt timeout inside enforces it), as a dropped
/// leader's is, not an answer for followers with budgets of their own.
// Not an async fn, for the reason `run` is not.
#[allow(clippy::manual_async_fn)]
fn settle<F, E, R, K>(
    leader: Leader<R>,
    called: F,
    key: K,
    policy: CacheConfig,
    stale: Option<Box<Stale>>,
    deadline: Option<Instant>,
) -> impl Future<Output = Result<ToolResponse, ToolError>>
where
    F: Future<Output = Result<ToolResponse, E>>,
    E: IntoToolError,
    R: HoldsShared,
    K: AsRef<str>,
{
    async move {
        let shared = leader.holder().shared();
        shared.counters.misses.bump();
        let mut result = called.await.map_err(IntoToolError::into_tool_error);
        if let Ok(resp) = &mut result {
            if resp.provenance.fetched_at.is_none() {
                resp.provenance.fetched_at = Some(toolshield_core::utc_at(time::now()));
            }
            // An in-band error is not a result to keep, and neither is a fallback tier's
            // answer: served for the whole TTL, it would hide the primary's recovery.
            if !resp.is_error() && resp.provenance.tier.is_none() {
                let key = key.as_ref();
                let ttl = policy.ttl.saturating_add(policy.stale_if_error);
                // At once where the store can (no boxed future), else through `put`.
                if let Err(copy) = shared.store.try_put_now(key, resp.clone(), ttl) {
                    // Followers, and callers coming while the write is under way, are
                    // answered now: none of them waits for the store.
                    leader.publish(resp);
                    if let Err(e) = shared.store.put(key, copy, ttl).await {
                        shared.counters.store_errors.bump();
                        tracing::warn!(error = %e, "cache store unavailable: result not cached");
                    }
                }
            }
        }
        // The tool's failure, kept past a stale answer: it decides what followers get.
        let failed = result.as_ref().err().map(ToolError::kind);
        if let (Err(e), Some(old)) = (&result, stale) {
            if !policy.stale_if_error.is_zero() && serves_stale(e.kind()) && time::now() < old.until
            {
                shared.counters.stale.bump();
                tracing::warn!(code = e.code(), "serving a stale cache entry");
                let mut old = old.response;
                old.provenance.stale = true;
                result = Ok(hit(old));
            }
        }
        match failed {
            // Dropped: the flight ends without a result (nor the stale entry that answered
            // the leader) and a follower leads a new one.
            Some(ErrorKind::Timeout) if deadline.is_some_and(|at| time::now() >= at) => {
                drop(leader);
            }
            _ => {
                leader.finish(&result, failed.is_some_and(flight::callers_own));
            }
        }
        result
    }
}

/// A look at the store: at once where it can answer, with no boxed future; a store whose
/// `lookup_now` answers every key is not asked through `get` on a miss. The first look is
/// made when the full path is first polled (an entry stored since `call` is found); a look
/// after a leader gave up always asks the store.
async fn look(shared: &Shared, key: &str, first: bool) -> Result<Option<CacheLookup>, StoreError> {
    if first {
        if let found @ Some(_) = shared.store.lookup_now(key) {
            return Ok(found);
        }
        if shared.store.answers_now() {
            return Ok(None);
        }
    }
    shared.store.get(key).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryCacheStore;
    use tower::util::BoxCloneService;

    /// The futures of a miss are boxed: a led miss (the common one) on every miss of an
    /// in-memory store, the full path for a follower, a stale entry or a store with I/O.
    /// Each holds its values once (an async fn's arguments kept beside their copies, a
    /// look's value kept past it, the tool's answer kept twice across the store write
    /// made the full path 1,440 bytes for this service).
    #[test]
    fn the_futures_of_a_miss_stay_small() {
        let shared = Arc::new(Shared {
            store: Arc::new(InMemoryCacheStore::new()),
            flights: Default::default(),
            counters: Default::default(),
        });
        let mut svc: BoxCloneService<ToolRequest, ToolResponse, ToolError> =
            BoxCloneService::new(tower::service_fn(|_req: ToolRequest| async {
                Ok::<_, ToolError>(ToolResponse::new(serde_json::json!(1)))
            }));
        let req = ToolRequest::new("weather", serde_json::json!({}));
        let Join::Lead(leader) = flight::join(Held(Arc::clone(&shared)), "k", None) else {
            panic!("the first caller leads");
        };
        let led = lead(
            leader,
            tower::Service::call(&mut svc, req.clone()),
            "k".to_owned(),
            CacheConfig::default(),
            None,
        );
        let led_size = std::mem::size_of_val(&led);
        let full = run(
            shared,
            Some((svc, req)),
            "k".to_owned(),
            CacheConfig::default(),
        );
        let full_size = std::mem::size_of_val(&full);
        eprintln!("led miss: {led_size} bytes, full path: {full_size} bytes");
        // 256 and 456 bytes, the leader's deadline included. Before misses were led from
        // `call`, every miss took the full path, at 360 bytes (584 with the 232-byte `Result` of before the provenance
        // record was boxed).
        assert!(led_size <= 288, "a led miss's future is {led_size} bytes");
        assert!(
            full_size <= 480,
            "the full path's future is {full_size} bytes"
        );
    }
}
