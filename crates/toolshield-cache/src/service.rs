//! [`Cache`]: the service and its hit / miss / single-flight / stale-if-error paths.

use std::sync::Arc;

use toolshield_core::keys;
use toolshield_core::time;
use toolshield_core::{Digest, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_store::{take_ready, StorePath, StoreService};
use tower_service::Service;

use crate::config::CacheConfig;
use crate::flight::Join;
use crate::future::ResponseFuture;
use crate::handle::Shared;
use crate::layer::CacheLayer;

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
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // The digest in hex on the stack: the key is the only allocation.
    let mut hex = [0u8; 64];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest.as_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    let hex = std::str::from_utf8(&hex).unwrap_or_default();
    keys::storage_key("cache", tool, caller, hex)
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
        // A result that belongs to its caller, for a call that names none, is not
        // cached: it would be served to every other call without a caller.
        Some(req.meta().caller_id.as_deref()?)
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
        S::Error: Into<ToolError> + Send,
        S::Future: Send + 'static,
    {
        if !req.call_kind().is_cacheable() {
            return ResponseFuture::passthrough(inner.call(req));
        }
        let policy = self.config;
        let Some(key) = key_for(&req, &policy) else {
            return ResponseFuture::passthrough(inner.call(req));
        };
        // A fresh hit in a store that answers without I/O is answered here: no future to
        // box, no clone of the service. A stale entry, a miss and a store with I/O take
        // the full path.
        if let Some(found) = self.shared.store.lookup_now(&key) {
            if found.ttl_left > policy.stale_if_error {
                self.shared.counters.hits.bump();
                return ResponseFuture::ready(Ok(hit(found.response)));
            }
        }
        let svc = take_ready(inner);
        ResponseFuture::boxed(Box::pin(run(
            Arc::clone(&self.shared),
            svc,
            req,
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

fn hit(mut resp: ToolResponse) -> ToolResponse {
    resp.provenance.cache_hit = true;
    resp
}

async fn run<S>(
    shared: Arc<Shared>,
    svc: S,
    req: ToolRequest,
    key: String,
    policy: CacheConfig,
) -> Result<ToolResponse, ToolError>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: Into<ToolError>,
{
    let counters = &shared.counters;
    let grace = policy.stale_if_error;
    let mut call = Some((svc, req));
    let mut first = true;
    loop {
        let mut stale: Option<ToolResponse> = None;
        // The first look is made when the future is first polled (an entry stored since
        // `call` is found): at once where the store can answer, with no boxed future; a
        // store whose `lookup_now` answers every key is not asked through `get` on a miss.
        // A look after a leader gave up always asks the store.
        let at_once = if first {
            shared.store.lookup_now(&key)
        } else {
            None
        };
        let looked = match at_once {
            Some(found) => Ok(Some(found)),
            None if first && shared.store.answers_now() => Ok(None),
            None => shared.store.get(&key).await,
        };
        first = false;
        match looked {
            Ok(Some(found)) if found.ttl_left > grace => {
                counters.hits.bump();
                return Ok(hit(found.response));
            }
            Ok(Some(found)) => stale = Some(found.response),
            Ok(None) => {}
            Err(e) => {
                counters.store_errors.bump();
                tracing::warn!(error = %e, "cache store unavailable: calling the tool");
            }
        }
        match shared.flights.join(&key) {
            Join::Follow(follower) => match follower.wait().await {
                Some(result) => {
                    counters.coalesced.bump();
                    return result.map(hit);
                }
                // The leader was dropped or cancelled: look again, and lead if nobody
                // else does.
                None => continue,
            },
            Join::Lead(leader) => {
                let Some((mut svc, req)) = call.take() else {
                    return Err(ToolError::internal("cache called the tool twice"));
                };
                counters.misses.bump();
                let result = svc.call(req).await.map_err(Into::into);
                let result = match result {
                    Ok(mut resp) => {
                        if resp.provenance.fetched_at.is_none() {
                            resp.provenance.fetched_at = Some(time::wall_clock(time::now()).into());
                        }
                        if !resp.is_error() {
                            let ttl = policy.ttl.saturating_add(grace);
                            if let Err(e) = shared.store.put(&key, resp.clone(), ttl).await {
                                counters.store_errors.bump();
                                tracing::warn!(error = %e, "cache store unavailable: result not cached");
                            }
                        }
                        Ok(resp)
                    }
                    Err(e) => match stale {
                        Some(mut old) if !grace.is_zero() && serves_stale(e.kind()) => {
                            counters.stale.bump();
                            tracing::warn!(code = e.code(), "serving a stale cache entry");
                            old.provenance.stale = true;
                            Ok(hit(old))
                        }
                        _ => Err(e),
                    },
                };
                leader.finish(&result);
                return result;
            }
        }
    }
}
