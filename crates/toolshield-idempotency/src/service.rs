//! [`Idempotency`]: the service and the claim / call / record lifecycle.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use toolshield_core::{CallKind, Digest, ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower_service::Service;

use crate::config::{OnPending, OnStoreError};
use crate::future::ResponseFuture;
use crate::handle::{bump, Shared};
use crate::key::{resolve, storage_key, ResolvedKey};
use crate::store::{ClaimOutcome, IdempotencyRecord, RecordStatus};

/// The idempotency service: see [`IdempotencyLayer`](crate::IdempotencyLayer).
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Idempotency { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<ToolRequest> for Idempotency<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Error: Into<ToolError> + Send,
    S::Future: Send + 'static,
{
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        if req.call_kind() == CallKind::ReadOnly {
            return ResponseFuture::passthrough(self.inner.call(req));
        }
        let c = &self.shared.config;
        let key = match resolve(&req, c.derive_keys, c.key_window, c.scope_keys_by_caller) {
            Ok(Some(key)) => key,
            Ok(None) => return ResponseFuture::passthrough(self.inner.call(req)),
            Err(e) => return ResponseFuture::ready(Err(e)),
        };
        // The ready service goes into the future; this one keeps an unready clone.
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::guarded(Box::pin(run(Arc::clone(&self.shared), svc, req, key)))
    }
}

/// Whether a failure frees the key (the tool gave no verdict that should be replayed):
/// retriable errors, cancellations, and toolshield's own rejections.
fn releases_key(kind: ErrorKind) -> bool {
    kind.is_retriable()
        || matches!(
            kind,
            ErrorKind::Cancelled
                | ErrorKind::CircuitOpen
                | ErrorKind::InProgress
                | ErrorKind::StoreUnavailable
                | ErrorKind::IdempotencyKeyReused
                | ErrorKind::Internal
        )
}

/// What the claim guard does if the call is dropped before its record is written.
enum OnDrop {
    /// Nothing ran (or the result is retriable): free the key.
    Release,
    /// Write this record (the final one, or `OUTCOME_UNKNOWN` for a mutation in flight).
    Write(Box<IdempotencyRecord>, Duration),
    /// The record is written.
    Nothing,
}

/// Holds a claim: if the call is dropped (cancelled) before it finishes, a task is spawned
/// to release the key, or, for a mutation that was already sent, to record
/// `OUTCOME_UNKNOWN`. Without a runtime to spawn on, the lease simply expires.
struct ClaimGuard {
    shared: Arc<Shared>,
    key: String,
    owner: String,
    on_drop: OnDrop,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let action = std::mem::replace(&mut self.on_drop, OnDrop::Nothing);
        if matches!(action, OnDrop::Nothing) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.shared.store);
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        rt.spawn(async move {
            let r = match action {
                OnDrop::Release => store.release(&key, &owner).await,
                OnDrop::Write(rec, ttl) if rec.status == RecordStatus::Completed => {
                    store.complete(&key, &owner, *rec, ttl).await
                }
                OnDrop::Write(rec, ttl) => store.fail(&key, &owner, *rec, ttl).await,
                OnDrop::Nothing => Ok(true),
            };
            if let Err(e) = r {
                tracing::warn!(error = %e, "idempotency: could not clean up a dropped claim; its lease will expire");
            }
        });
    }
}

fn reused(tool: &str) -> ToolError {
    ToolError::new(
        ErrorKind::IdempotencyKeyReused,
        format!("idempotency key for `{tool}` was used with another payload"),
    )
}

fn in_progress(tool: &str) -> ToolError {
    ToolError::new(
        ErrorKind::InProgress,
        format!("a call of `{tool}` with the same idempotency key is still running"),
    )
}

async fn run<S>(
    shared: Arc<Shared>,
    mut svc: S,
    mut req: ToolRequest,
    key: ResolvedKey,
) -> Result<ToolResponse, ToolError>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: Into<ToolError> + Send,
{
    let cfg = &shared.config;
    let counters = &shared.counters;
    let payload_hash: Digest = req.payload_digest()?;
    if key.derived {
        req.set_idempotency_key(Some(key.key.as_str().into()));
    }
    let tool: Arc<str> = Arc::clone(req.tool_arc());
    let skey = storage_key(&tool, &key.key);
    let execution_id = req.execution_id();
    let owner = execution_id.to_string();
    let wait_until = Instant::now() + cfg.wait_timeout;
    let mut waited = false;
    // A waiting duplicate polls the store with a growing interval (doubling from
    // `poll_interval` up to `max_poll_interval`): prompt for short calls, light on the
    // store for long ones.
    let mut interval = cfg.poll_interval;

    // ----- claim, replay, wait -----
    loop {
        let pending = IdempotencyRecord::pending(payload_hash, owner.clone(), cfg.lease);
        match shared.store.claim(&skey, pending, cfg.lease).await {
            Err(e) => {
                bump(&counters.store_errors);
                return match cfg.on_store_error {
                    OnStoreError::FailClosed => Err(ToolError::new(
                        ErrorKind::StoreUnavailable,
                        format!("idempotency store unavailable for `{tool}`"),
                    )
                    .with_source(e)),
                    OnStoreError::FailOpen => {
                        tracing::warn!(tool = %tool, error = %e, "idempotency store unavailable: running without dedupe");
                        bump(&counters.executions);
                        svc.call(req).await.map_err(Into::into)
                    }
                };
            }
            Ok(ClaimOutcome::Claimed) => break,
            Ok(ClaimOutcome::Existing(rec)) => {
                if rec.payload_hash != payload_hash {
                    bump(&counters.conflicts);
                    return Err(reused(&tool));
                }
                match rec.status {
                    RecordStatus::Completed => {
                        bump(&counters.replays);
                        let Some(mut resp) = rec.result else {
                            return Err(ToolError::internal(
                                "completed idempotency record without a result",
                            ));
                        };
                        resp.provenance.replayed = true;
                        return Ok(resp);
                    }
                    RecordStatus::Failed => {
                        bump(&counters.replays);
                        return Err(match rec.error {
                            Some(e) => e.to_error(),
                            None => {
                                ToolError::internal("failed idempotency record without an error")
                            }
                        });
                    }
                    RecordStatus::Pending => match cfg.on_pending {
                        OnPending::FailFast => {
                            bump(&counters.in_progress);
                            return Err(in_progress(&tool));
                        }
                        OnPending::Wait => {
                            if !waited {
                                waited = true;
                                bump(&counters.waits);
                            }
                            let now = Instant::now();
                            if now >= wait_until {
                                bump(&counters.in_progress);
                                return Err(in_progress(&tool));
                            }
                            tokio::time::sleep(interval.min(wait_until - now)).await;
                            interval = interval
                                .saturating_mul(2)
                                .min(cfg.max_poll_interval.max(cfg.poll_interval));
                        }
                    },
                }
            }
        }
    }

    // ----- we own the key: call, renewing the lease -----
    let mutating = req.call_kind() == CallKind::Mutating;
    let mut guard = ClaimGuard {
        shared: Arc::clone(&shared),
        key: skey.clone(),
        owner: owner.clone(),
        on_drop: OnDrop::Release,
    };
    bump(&counters.executions);
    if mutating {
        // From here on the call may take effect: a drop leaves OUTCOME_UNKNOWN.
        let err = outcome_unknown(&tool, "was cancelled after it was sent");
        guard.on_drop = OnDrop::Write(
            Box::new(IdempotencyRecord::failed(
                payload_hash,
                owner.clone(),
                &err,
                cfg.record_ttl,
            )),
            cfg.record_ttl,
        );
    }
    let fut = svc.call(req);
    tokio::pin!(fut);
    let every = (cfg.lease / 3).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    let result: Result<ToolResponse, ToolError> = loop {
        tokio::select! {
            biased;
            r = &mut fut => break r.map_err(Into::into),
            _ = tick.tick() => match shared.store.renew(&skey, &owner, cfg.lease).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(tool = %tool, "idempotency: lease lost while the call ran"),
                Err(e) => {
                    bump(&counters.store_errors);
                    tracing::warn!(tool = %tool, error = %e, "idempotency: could not renew the lease");
                }
            },
        }
    };

    // ----- record the outcome -----
    match result {
        Ok(mut resp) => {
            if resp.provenance.fetched_at.is_none() {
                resp.provenance.fetched_at = Some(Utc::now());
            }
            if resp.provenance.execution_id.is_none() {
                resp.provenance.execution_id = Some(execution_id);
            }
            let rec = IdempotencyRecord::completed(
                payload_hash,
                owner.clone(),
                resp.clone(),
                cfg.record_ttl,
            );
            guard.on_drop = OnDrop::Write(Box::new(rec.clone()), cfg.record_ttl);
            let w = shared
                .store
                .complete(&skey, &owner, rec, cfg.record_ttl)
                .await;
            guard.on_drop = OnDrop::Nothing;
            log_write(&shared, &tool, w);
            Ok(resp)
        }
        Err(e)
            if mutating && matches!(e.kind(), ErrorKind::Timeout | ErrorKind::OutcomeUnknown) =>
        {
            bump(&counters.outcome_unknown);
            let err = outcome_unknown(&tool, "timed out after it was sent").with_source(e);
            let rec = IdempotencyRecord::failed(payload_hash, owner.clone(), &err, cfg.record_ttl);
            guard.on_drop = OnDrop::Write(Box::new(rec.clone()), cfg.record_ttl);
            let w = shared.store.fail(&skey, &owner, rec, cfg.record_ttl).await;
            guard.on_drop = OnDrop::Nothing;
            log_write(&shared, &tool, w);
            Err(err)
        }
        Err(e) if releases_key(e.kind()) => {
            guard.on_drop = OnDrop::Release;
            let w = shared.store.release(&skey, &owner).await;
            guard.on_drop = OnDrop::Nothing;
            log_write(&shared, &tool, w);
            Err(e)
        }
        Err(e) => {
            let rec = IdempotencyRecord::failed(payload_hash, owner.clone(), &e, cfg.failed_ttl);
            guard.on_drop = OnDrop::Write(Box::new(rec.clone()), cfg.failed_ttl);
            let w = shared.store.fail(&skey, &owner, rec, cfg.failed_ttl).await;
            guard.on_drop = OnDrop::Nothing;
            log_write(&shared, &tool, w);
            Err(e)
        }
    }
}

fn outcome_unknown(tool: &str, what: &str) -> ToolError {
    ToolError::new(
        ErrorKind::OutcomeUnknown,
        format!("call of `{tool}` {what}; its outcome is unknown and its idempotency record is kept for reconciliation"),
    )
}

fn log_write(shared: &Shared, tool: &str, w: Result<bool, crate::store::StoreError>) {
    match w {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(tool = %tool, "idempotency: claim lost before the outcome was recorded")
        }
        Err(e) => {
            bump(&shared.counters.store_errors);
            tracing::warn!(tool = %tool, error = %e, "idempotency: could not record the outcome");
        }
    }
}
