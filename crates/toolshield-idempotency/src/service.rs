//! [`Idempotency`]: the service and the claim / call / record lifecycle.

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use toolshield_core::config::deadline_after;
use toolshield_core::time;
use toolshield_core::IntoToolError;
use toolshield_core::{
    CallKind, CallState, Digest, ErrorKind, Resume, ResumeFuture, ResumeSink, SharedPayload,
    ShieldRequest, ToolError, ToolRequest, ToolResponse,
};
use toolshield_store::{take_ready, StorePath, StoreService};
use tower_service::Service;

use crate::config::{OnPending, OnStoreError};
use crate::future::ResponseFuture;
use crate::handle::Shared;
use crate::key::{fingerprint, resolve};
use crate::layer::IdempotencyLayer;
use crate::store::{
    check_resume_token, ClaimOutcome, IdempotencyRecord, PendingClaim, RecordStatus, StoreFuture,
};

/// The idempotency service: see [`IdempotencyLayer`]. A [`StoreService`] whose
/// [`StorePath`] is the layer's.
pub type Idempotency<S> = StoreService<S, IdempotencyLayer>;

impl StorePath<ToolRequest> for IdempotencyLayer {
    type Response = ToolResponse;

    fn call<S>(&self, inner: &mut S, req: ToolRequest) -> ResponseFuture<S::Future>
    where
        S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
        S::Error: IntoToolError + Send,
        S::Future: Send + 'static,
    {
        if req.call_kind() == CallKind::ReadOnly {
            return ResponseFuture::passthrough(inner.call(req));
        }
        let c = &self.shared.config;
        // The storage key, and the derived key to attach to the request (if derived).
        let (skey, derived) =
            match resolve(&req, c.derive_keys, c.key_window, c.scope_keys_by_caller) {
                Ok(Some(key)) => {
                    let skey = key.storage_key(req.tool());
                    match key.key {
                        Cow::Owned(derived) => (skey, Some(derived)),
                        Cow::Borrowed(_) => (skey, None),
                    }
                }
                Ok(None) if req.call_kind() == CallKind::Mutating => {
                    // No key (none given, none derived): nothing to record, but a mutation
                    // that timed out after it was sent still ends `OUTCOME_UNKNOWN`, as it
                    // does with a key, so no caller takes a `TIMEOUT` as "not done".
                    let tool = Arc::clone(req.tool_arc());
                    let shared = Arc::clone(&self.shared);
                    let fut = inner.call(req);
                    return ResponseFuture::boxed(Box::pin(async move {
                        fut.await.map_err(|e| {
                            let e = unkeyed_outcome(&tool, e.into_tool_error());
                            if e.kind() == ErrorKind::OutcomeUnknown {
                                shared.counters.outcome_unknown.bump();
                            }
                            e
                        })
                    }));
                }
                Ok(None) => return ResponseFuture::passthrough(inner.call(req)),
                Err(e) => return ResponseFuture::ready(Err(e)),
            };
        // A replay from a store that answers at once (in memory): decided here, with no
        // claim and no future to box. The digest is kept on the request for `run`.
        if let Some(rec) = self.shared.store.finished_now(&skey) {
            // An equal payload kept with the record settles it without the digest.
            let same = match &rec.payload {
                Some(kept) if kept.same_as(&req) => Ok(true),
                _ => fingerprint(&req).map(|hash| hash == rec.payload_hash),
            };
            return ResponseFuture::ready(match same {
                Ok(same) => replay(&self.shared, &rec, same, req.tool()),
                Err(e) => Err(e),
            });
        }
        // The ready service goes into the future; the service keeps an unready clone.
        let svc = take_ready(inner);
        let shared = Arc::clone(&self.shared);
        let marks = self.attempt_marks;
        ResponseFuture::boxed(Box::pin(run(shared, svc, req, skey, derived, marks)))
    }
}

/// Whether a failure frees the key (the tool gave no verdict that should be replayed):
/// retriable errors, cancellations, and toolshield's own rejections (a run budget's
/// `BUDGET_EXHAUSTED` is the run's, not the call's: another run may have budget left).
fn releases_key(kind: ErrorKind) -> bool {
    kind.is_retriable()
        || matches!(
            kind,
            ErrorKind::Cancelled
                | ErrorKind::CircuitOpen
                | ErrorKind::InProgress
                | ErrorKind::StoreUnavailable
                | ErrorKind::IdempotencyKeyReused
                | ErrorKind::BudgetExhausted
                | ErrorKind::Internal
        )
}

/// A new owner token, unique to one claim: the process's prefix (122 random bits, a UUID
/// v4 drawn once from the OS's CSPRNG, so two processes sharing a store never mint the
/// same token) and the number of the claim in this process (a 64-bit counter, which does
/// not wrap in practice). 48 hex characters; one allocation, no system call.
fn new_owner_token() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut token = String::with_capacity(prefix.len() + 16);
    token.push_str(prefix);
    for shift in (0..16).rev() {
        let digit = ((n >> (shift * 4)) & 0xf) as u32;
        token.push(char::from_digit(digit, 16).unwrap_or('0'));
    }
    token
}

/// What the claim guard does if the call is dropped before its record is written.
enum OnDrop {
    /// Nothing ran (or the result is retriable): free the key (owner-checked, so it never
    /// frees someone else's claim).
    Release,
    /// A claim that failed or was dropped in flight, and may still land: free the key as
    /// [`Release`](Self::Release) does, unless the claim landed as a takeover of a claim
    /// carrying a resume token (read back first): releasing would drop the token and let
    /// the next claim start that work again, so it is left to lapse and the next claim
    /// takes it over and resumes.
    ReleaseClaim,
    /// Write this record (the final one, or `OUTCOME_UNKNOWN` for a write that failed).
    Write(Box<IdempotencyRecord>, Duration),
    /// A mutation in flight: write `OUTCOME_UNKNOWN` for it, kept for `ttl`, if an attempt
    /// may have reached the tool (`claim`'s marks); else free the key as
    /// [`Release`](Self::Release) does (a claim that took over resumable work is left to
    /// lapse instead, keeping its token). The record is built only if the call is
    /// dropped, not on every call that runs.
    Unknown {
        payload_hash: Digest,
        claim: Arc<ClaimResume>,
        ttl: Duration,
    },
    /// Nothing to clean up.
    Nothing,
}

/// Holds a claim (or a claim request in flight): if the call is dropped (cancelled) before
/// it finishes, a task is spawned to release the key, or, for a mutation that was already
/// sent, to record `OUTCOME_UNKNOWN`. Without a runtime to spawn on, the lease simply
/// expires.
struct ClaimGuard {
    shared: Arc<Shared>,
    key: String,
    owner: String,
    on_drop: OnDrop,
}

impl ClaimGuard {
    /// Runs the drop action now, in the background.
    fn spawn_cleanup(&mut self) {
        let action = std::mem::replace(&mut self.on_drop, OnDrop::Nothing);
        if matches!(action, OnDrop::Nothing) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // The OUTCOME_UNKNOWN record, built only now that there is somewhere to write it.
        let action = match action {
            // Nothing reached the tool: nothing ran.
            OnDrop::Unknown { claim, .. } if !claim.may_have_started() => {
                if claim.from.is_some() {
                    return;
                }
                OnDrop::Release
            }
            OnDrop::Unknown {
                payload_hash,
                claim,
                ttl,
            } => {
                let err = outcome_unknown(&claim.tool, "was cancelled after it was sent");
                let rec = IdempotencyRecord::failed(payload_hash, self.owner.clone(), &err, ttl);
                OnDrop::Write(Box::new(rec), ttl)
            }
            action => action,
        };
        let shared = Arc::clone(&self.shared);
        let key = self.key.clone();
        let owner = self.owner.clone();
        rt.spawn(async move {
            let store = &shared.store;
            match action {
                OnDrop::ReleaseClaim => {
                    // Read after the claim (on Redis, on the same connection): what it left.
                    if let Ok(Some(rec)) = store.get(&key).await {
                        if rec.is_owned_by(&owner) && rec.resume.is_some() {
                            tracing::warn!("idempotency: a claim that took over resumable work failed; it is left to expire so the next call resumes");
                            return;
                        }
                    }
                    if let Err(e) = store.release(&key, &owner).await {
                        tracing::warn!(error = %e, "idempotency: could not release a claim; its lease will expire");
                    }
                }
                OnDrop::Release => {
                    if let Err(e) = store.release(&key, &owner).await {
                        tracing::warn!(error = %e, "idempotency: could not release a claim; its lease will expire");
                    }
                }
                OnDrop::Write(rec, ttl) => {
                    // The record must not be lost to a passing store fault: retry while the
                    // lease can be kept, renewing it between tries.
                    let lease = shared.config.lease;
                    let mut valid_until = deadline_after(time::now(), lease);
                    let mut pause = Duration::from_millis(10);
                    loop {
                        let r = store.finish(&key, &owner, (*rec).clone(), ttl).await;
                        match r {
                            Ok(_) => break,
                            Err(e) => {
                                shared.counters.store_errors.bump();
                                if time::now().checked_add(pause).is_none_or(|t| t >= valid_until) {
                                    tracing::error!(error = %e, "idempotency: could not record the outcome of a dropped call; its lease will expire");
                                    break;
                                }
                                tokio::time::sleep(pause).await;
                                pause = pause.saturating_mul(2).min(Duration::from_millis(500));
                                let sent = time::now();
                                match store.renew(&key, &owner, lease).await {
                                    Ok(true) => valid_until = deadline_after(sent, lease),
                                    Ok(false) => break,
                                    Err(_) => {}
                                }
                            }
                        }
                    }
                }
                // Turned into a `Write` above.
                OnDrop::Unknown { .. } | OnDrop::Nothing => {}
            }
        });
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        self.spawn_cleanup();
    }
}

/// What a call finds in `rec`, a record of its key that another call wrote: the
/// replayed outcome when it is finished and the call's payload is the same
/// (`same_payload`), `IDEMPOTENCY_KEY_REUSED` when the payload differs, `IN_PROGRESS`
/// for a PENDING record the call does not (or no longer) wait on.
fn replay(
    shared: &Shared,
    rec: &IdempotencyRecord,
    same_payload: bool,
    tool: &str,
) -> Result<ToolResponse, ToolError> {
    let counters = &shared.counters;
    if !same_payload {
        counters.conflicts.bump();
        return Err(reused(tool));
    }
    match rec.status {
        RecordStatus::Completed => {
            counters.replays.bump();
            let Some(mut resp) = rec.result.clone() else {
                return Err(ToolError::internal(
                    "completed idempotency record without a result",
                ));
            };
            resp.provenance.replayed = true;
            // Not slow for this caller, who did not wait for the tool.
            resp.clear_slow();
            Ok(resp)
        }
        RecordStatus::Failed => {
            counters.replays.bump();
            Err(match &rec.error {
                Some(e) => e.to_error(),
                None => ToolError::internal("failed idempotency record without an error"),
            })
        }
        RecordStatus::Pending => {
            counters.in_progress.bump();
            Err(in_progress(tool))
        }
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

/// The lease as this process sees it: valid until `valid_until` (measured from when the
/// claim or the last successful renewal was *sent*, so it never outlives the store's).
struct Lease {
    lease: Duration,
    valid_until: Instant,
    last_renewal: Instant,
}

impl Lease {
    fn new(sent: Instant, lease: Duration) -> Self {
        Lease {
            lease,
            valid_until: deadline_after(sent, lease),
            last_renewal: sent,
        }
    }

    fn renewed(&mut self, sent: Instant) {
        self.valid_until = deadline_after(sent, self.lease);
        self.last_renewal = sent;
    }

    /// When a mutation still running gives up: a quarter of the lease before it ends, so
    /// nobody can take the key over while the call still runs.
    fn abort_at(&self) -> Instant {
        self.valid_until
            .checked_sub(self.lease / 4)
            .unwrap_or(self.valid_until)
    }

    fn renewal_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_renewal) >= self.lease / 3
    }
}

/// How writing an outcome record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// The record is in the store.
    Yes,
    /// The owner check failed: the claim was lost (taken over, or forgotten by hand).
    Lost,
    /// The store failed until the retry bound.
    Failed,
}

/// Writes `rec` (COMPLETED or FAILED) for the claim, retrying a failing store with a
/// doubling pause until `record_retry` has passed or the lease is about to end, and
/// renewing the lease meanwhile.
async fn write_outcome(
    shared: &Shared,
    tool: &str,
    skey: &str,
    owner: &str,
    rec: &IdempotencyRecord,
    ttl: Duration,
    lease: &mut Lease,
) -> Written {
    let cfg = &shared.config;
    let start = time::now();
    let until = deadline_after(start, cfg.record_retry).min(lease.abort_at().max(start));
    let mut pause = Duration::from_millis(10);
    let mut tried_before = false;
    loop {
        let r = shared.store.finish(skey, owner, rec.clone(), ttl).await;
        match r {
            Ok(true) => return Written::Yes,
            Ok(false) if tried_before => {
                // An earlier attempt may have been applied with its reply lost: then the
                // record there is ours.
                if let Ok(Some(there)) = shared.store.get(skey).await {
                    if there.owner == owner && there.status == rec.status {
                        return Written::Yes;
                    }
                }
                tracing::error!(tool = %tool, "idempotency: the claim was lost before the outcome was recorded");
                return Written::Lost;
            }
            Ok(false) => {
                tracing::error!(tool = %tool, "idempotency: the claim was lost before the outcome was recorded");
                return Written::Lost;
            }
            Err(e) => {
                tried_before = true;
                shared.counters.store_errors.bump();
                let now = time::now();
                if now.checked_add(pause).is_none_or(|t| t >= until) {
                    tracing::error!(tool = %tool, error = %e, "idempotency: could not record the outcome");
                    return Written::Failed;
                }
                tracing::warn!(tool = %tool, error = %e, "idempotency: recording the outcome failed; retrying");
                tokio::time::sleep(pause).await;
                pause = pause.saturating_mul(2).min(Duration::from_millis(500));
                if lease.renewal_due(time::now()) {
                    let sent = time::now();
                    if let Ok(true) = shared.store.renew(skey, owner, cfg.lease).await {
                        lease.renewed(sent);
                    }
                }
            }
        }
    }
}

async fn run<S>(
    shared: Arc<Shared>,
    mut svc: S,
    mut req: ToolRequest,
    skey: String,
    derived: Option<String>,
    attempt_marks: bool,
) -> Result<ToolResponse, ToolError>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: IntoToolError + Send,
{
    let cfg = &shared.config;
    let counters = &shared.counters;
    let payload_hash: Digest = fingerprint(&req)?;
    if let Some(derived) = derived {
        req.set_idempotency_key(Some(derived.into()));
    }
    let tool: Arc<str> = Arc::clone(req.tool_arc());
    let execution_id = req.execution_id();
    // Set when the first claim is sent: a replay reads the clock once.
    let mut wait_until: Option<Instant> = None;
    let mut waited = false;
    // A waiting duplicate polls the store with a growing interval (doubling from
    // `poll_interval` up to `max_poll_interval`): prompt for short calls, light on the
    // store for long ones.
    let mut interval = cfg.poll_interval;
    // The guard holds the storage key and the fencing token of this claim (never the
    // request's execution id, which every clone of the request shares); the rest of the
    // call borrows them from it.
    let mut guard = ClaimGuard {
        shared: Arc::clone(&shared),
        key: skey,
        owner: new_owner_token(),
        on_drop: OnDrop::Nothing,
    };

    // ----- claim, replay, wait -----
    let (lease, resume) = loop {
        let sent = time::now();
        // A duplicate waits until `wait_timeout`, or until its call's deadline if that
        // comes first: past it nobody waits for the answer.
        let wait_until = *wait_until.get_or_insert_with(|| {
            let bound = deadline_after(sent, cfg.wait_timeout);
            req.deadline_at().map_or(bound, |d| bound.min(d))
        });
        // While the claim is in flight, a drop (or a failure: a claim that timed out may
        // still land) releases it by our token (unless it took over resumable work).
        guard.on_drop = OnDrop::ReleaseClaim;
        // The store builds the PENDING record only if the key is free: a replay builds none.
        let pending = PendingClaim {
            payload_hash,
            owner: &guard.owner,
        };
        let claimed = shared
            .store
            .claim_pending(&guard.key, pending, cfg.lease)
            .await;
        if claimed.is_ok() {
            guard.on_drop = OnDrop::Nothing;
        }
        match claimed {
            Err(e) => {
                counters.store_errors.bump();
                // The claim may have been applied although it failed here: release it now
                // (owner-checked), so the key is not blocked for a whole lease.
                guard.spawn_cleanup();
                if waited && cfg.on_store_error == OnStoreError::FailOpen {
                    // This duplicate has seen the key held by a live claim for its
                    // payload: running without dedupe now would run the call beside that
                    // claim. It waits on (under a new owner token: the release just
                    // spawned must never free a later claim of this call) and answers as
                    // a wait that ran out if the store stays down.
                    tracing::warn!(tool = %tool, error = %e, "idempotency store unavailable while waiting for a running duplicate; waiting on");
                    guard.owner = new_owner_token();
                    let now = time::now();
                    if now >= wait_until {
                        counters.in_progress.bump();
                        return Err(in_progress(&tool));
                    }
                    if !pause(&req, interval.min(wait_until - now)).await {
                        return Err(cancelled_while_waiting(&tool));
                    }
                    interval = interval
                        .saturating_mul(2)
                        .min(cfg.max_poll_interval.max(cfg.poll_interval));
                    continue;
                }
                return match cfg.on_store_error {
                    OnStoreError::FailClosed => Err(ToolError::new(
                        ErrorKind::StoreUnavailable,
                        format!("idempotency store unavailable for `{tool}`"),
                    )
                    .with_source(e)),
                    OnStoreError::FailOpen => {
                        tracing::warn!(tool = %tool, error = %e, "idempotency store unavailable: running without dedupe");
                        counters.executions.bump();
                        svc.call(req).await.map_err(IntoToolError::into_tool_error)
                    }
                };
            }
            Ok(ClaimOutcome::Claimed) => break (Lease::new(sent, cfg.lease), None),
            Ok(ClaimOutcome::TakenOver { resume }) => {
                counters.takeovers.bump();
                // A token read from a shared store is checked like one about to be written:
                // anything else is not resumed from.
                let resume = match resume {
                    Some(token) if check_resume_token(&token).is_err() => {
                        tracing::warn!(tool = %tool, "idempotency: ignored a malformed resume token on a claim taken over");
                        None
                    }
                    other => other,
                };
                if resume.is_some() {
                    tracing::warn!(tool = %tool, "idempotency: took over a claim whose lease expired without an outcome; resuming its recorded work");
                } else {
                    tracing::warn!(tool = %tool, "idempotency: took over a claim whose lease expired without an outcome");
                }
                break (Lease::new(sent, cfg.lease), resume);
            }
            Ok(ClaimOutcome::Existing(rec)) => {
                let same = rec.payload_hash == payload_hash;
                // A finished record, another payload, or a PENDING claim not waited for:
                // answered from the record (a PENDING one is `IN_PROGRESS`).
                if !same || rec.is_finished() || cfg.on_pending == OnPending::FailFast {
                    return replay(&shared, &rec, same, &tool);
                }
                if !waited {
                    waited = true;
                    counters.waits.bump();
                }
                let now = time::now();
                if now >= wait_until {
                    return replay(&shared, &rec, same, &tool);
                }
                if !pause(&req, interval.min(wait_until - now)).await {
                    return Err(cancelled_while_waiting(&tool));
                }
                interval = interval
                    .saturating_mul(2)
                    .min(cfg.max_poll_interval.max(cfg.poll_interval));
            }
        }
    };

    // Boxed: only a first execution pays for the large call-and-record future, so a
    // replay moves and frees a small one.
    let owned = Claimed {
        tool,
        payload_hash,
        execution_id,
        lease,
        guard,
        resume,
        attempt_marks,
    };
    Box::pin(execute(shared, svc, req, owned)).await
}

/// Sleeps `wait` between two reads of a waiting duplicate, unless the caller cancels the
/// call first (its call token): then `false`, at once. A cancelled duplicate must not go
/// on to claim a key that frees meanwhile and call the tool with a cancelled token (a
/// mutation would then be kept `OUTCOME_UNKNOWN` although nothing ran).
async fn pause(req: &ToolRequest, wait: Duration) -> bool {
    tokio::select! {
        biased;
        () = req.call_token().cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

fn cancelled_while_waiting(tool: &str) -> ToolError {
    ToolError::cancelled(format!(
        "call of `{tool}` cancelled while it waited for a duplicate with the same idempotency key"
    ))
}

/// A claim this call owns: what the call-and-record phase needs.
struct Claimed {
    tool: Arc<str>,
    payload_hash: Digest,
    execution_id: uuid::Uuid,
    lease: Lease,
    guard: ClaimGuard,
    /// The resume token of the claim taken over, if it carried one.
    resume: Option<String>,
    /// Whether the stack below marks the attempts that reach the tool.
    attempt_marks: bool,
}

/// The [`ResumeSink`] of a claimed call: records a resume token on the claim's PENDING
/// record, fenced by the claim's owner token, hands out the token of the claim taken
/// over, and learns when an attempt reaches the tool.
struct ClaimResume {
    shared: Arc<Shared>,
    tool: Arc<str>,
    key: String,
    owner: String,
    from: Option<String>,
    /// Whether an attempt may have reached the tool: set by the marks of the stack below
    /// ([`ResumeSink::mark_started`]); `true` from the start when the stack does not mark
    /// its attempts. Written and read by the task that runs the call (a drop is never
    /// concurrent with a poll), so relaxed ordering suffices.
    started: AtomicBool,
    /// Whether the stack marks its attempts (`started` is then the marks' to set).
    marks: bool,
    /// `started` when a retry below began its attempts ([`ResumeSink::retry_begins`]):
    /// what a refused attempt goes back to (`true` until a retry began: a refusal
    /// reported without it undoes nothing).
    before_retry: AtomicBool,
    /// The handle of a claim this call runs under (a shielded stack used as a fallback
    /// tier, or nested in another's tool), told of every start too.
    outer: Option<Resume>,
}

impl ClaimResume {
    fn may_have_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }
}

impl ResumeSink for ClaimResume {
    fn resume_from(&self) -> Option<&str> {
        self.from.as_deref()
    }

    fn mark_started(&self) {
        self.started.store(true, Ordering::Relaxed);
        if let Some(outer) = &self.outer {
            outer.mark_started();
        }
    }

    // Only this claim's own view goes back: an outer claim may have been marked by
    // something this retry knows nothing of (a fallback tier above it).
    fn retry_begins(&self) {
        self.before_retry
            .store(self.started.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    fn attempt_refused(&self) {
        if self.marks {
            self.started
                .store(self.before_retry.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    fn record<'a>(&'a self, token: &'a str) -> ResumeFuture<'a> {
        Box::pin(async move {
            let tool = &self.tool;
            if let Err(e) = check_resume_token(token) {
                return Err(ToolError::invalid_input(format!(
                    "resume token for `{tool}` refused: {e}"
                )));
            }
            let lease = self.shared.config.lease;
            match self
                .shared
                .store
                .mark_resume(&self.key, &self.owner, token, lease)
                .await
            {
                Ok(true) => Ok(true),
                Ok(false) => {
                    tracing::warn!(tool = %tool, "idempotency: the claim was lost before its resume token was recorded");
                    Ok(false)
                }
                Err(e) => {
                    self.shared.counters.store_errors.bump();
                    Err(ToolError::new(
                        ErrorKind::StoreUnavailable,
                        format!("resume token for `{tool}` could not be recorded"),
                    )
                    .with_source(e))
                }
            }
        })
    }
}

/// Runs the call under the claim `c`, renewing the lease, and records its outcome.
///
/// Written for a small future, as it is boxed for every first execution: an async block
/// that uses its captures in place (an async fn keeps each argument twice: the argument
/// and the body's binding).
// Not an async fn: see above.
#[allow(clippy::manual_async_fn)]
fn execute<S>(
    shared: Arc<Shared>,
    mut svc: S,
    mut req: ToolRequest,
    mut c: Claimed,
) -> impl Future<Output = Result<ToolResponse, ToolError>>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: IntoToolError + Send,
{
    async move {
        let cfg = &shared.config;
        let counters = &shared.counters;
        let tool = &c.tool;
        let payload_hash = c.payload_hash;
        let lease = &mut c.lease;
        let guard = &mut c.guard;
        // The inner service may record where its work can be resumed (an MCP task id), and
        // learns what to resume from after a takeover. The handle keeps the copies of the key
        // and the owner token this phase uses (the guard is updated while they are in use).
        let claim = Arc::new(ClaimResume {
            shared: Arc::clone(&shared),
            tool: Arc::clone(tool),
            key: guard.key.clone(),
            owner: guard.owner.clone(),
            from: c.resume.take(),
            started: AtomicBool::new(!c.attempt_marks),
            marks: c.attempt_marks,
            // Until a retry says where its attempts begin, a refusal undoes nothing.
            before_retry: AtomicBool::new(true),
            outer: req.call_state().and_then(CallState::resume).cloned(),
        });
        if let Some(state) = req.call_state_mut() {
            state.set_resume(Some(Resume::new(Arc::clone(&claim) as Arc<dyn ResumeSink>)));
        }
        let skey: &str = &claim.key;
        let owner: &str = &claim.owner;
        // ----- we own the key: call, renewing the lease -----
        let mutating = req.call_kind() == CallKind::Mutating;
        guard.on_drop = OnDrop::Release;
        if mutating && time::now() >= lease.abort_at() {
            // The claim was answered so late that a mutation started now would be abandoned
            // at once (and kept OUTCOME_UNKNOWN although it hardly began): renew first, and
            // start it only with a lease it can keep. A drop meanwhile frees the key, unless
            // the claim took over resumable work (its token must stay for the next claim).
            if claim.from.is_some() {
                guard.on_drop = OnDrop::Nothing;
            }
            let sent = time::now();
            match shared.store.renew(skey, owner, cfg.lease).await {
                Ok(true) => lease.renewed(sent),
                Ok(false) => {}
                Err(e) => {
                    counters.store_errors.bump();
                    tracing::warn!(tool = %tool, error = %e, "idempotency: could not renew a claim answered late");
                }
            }
            if time::now() >= lease.abort_at() {
                tracing::warn!(tool = %tool, "idempotency: the claim could not be kept long enough to start the call; the tool was not called");
                if claim.from.is_none() {
                    // Nothing ran: free the key (owner-checked). A claim that took over
                    // resumable work is left to lapse instead, keeping its token.
                    if shared.store.release(skey, owner).await.is_err() {
                        counters.store_errors.bump();
                    }
                }
                guard.on_drop = OnDrop::Nothing;
                return Err(ToolError::new(
                    ErrorKind::StoreUnavailable,
                    format!("idempotency store too slow to keep the claim of `{tool}`; the call was not started"),
                ));
            }
        }
        counters.executions.bump();
        if mutating {
            // From the first attempt that reaches the tool on, the call may take effect: a
            // drop then leaves OUTCOME_UNKNOWN.
            guard.on_drop = OnDrop::Unknown {
                payload_hash,
                claim: Arc::clone(&claim),
                ttl: cfg.record_ttl,
            };
        }
        let payload = req.shared_payload();
        let result =
            call_under_lease(&shared, &mut svc, req, tool, skey, owner, mutating, lease).await;
        // Whether a mutation may have taken effect: one none of whose attempts reached the
        // tool ran nothing, whatever ended it (told by the stack's marks; assumed without).
        let sent = mutating && claim.may_have_started();
        let unsent = mutating && !sent;

        // ----- record the outcome -----
        match result {
            Ok(mut resp) => {
                if resp.provenance.fetched_at.is_none() {
                    resp.provenance.fetched_at = Some(Utc::now());
                }
                if resp.provenance.execution_id.is_none() {
                    resp.provenance.execution_id = Some(c.execution_id);
                }
                let rec = IdempotencyRecord::completed(
                    payload_hash,
                    owner.to_owned(),
                    resp.clone(),
                    cfg.record_ttl,
                );
                let at = (tool.as_ref(), skey, owner);
                let w = record(&shared, at, rec, cfg.record_ttl, lease, guard, &payload).await;
                if w != Written::Yes {
                    // The tool ran and its result is not recorded: never let the key turn
                    // silently free. Mark the key OUTCOME_UNKNOWN (a duplicate is told so
                    // until an operator forgets it) and say so on the response.
                    counters.unrecorded.bump();
                    resp.provenance.unrecorded = true;
                    if w == Written::Failed {
                        let err =
                            outcome_unknown(tool, "ran, but its result could not be recorded");
                        let unknown = IdempotencyRecord::failed(
                            payload_hash,
                            owner.to_owned(),
                            &err,
                            cfg.record_ttl,
                        );
                        guard.on_drop = OnDrop::Write(Box::new(unknown.clone()), cfg.record_ttl);
                        let r = shared
                            .store
                            .finish(skey, owner, unknown, cfg.record_ttl)
                            .await;
                        if r.is_ok() {
                            guard.on_drop = OnDrop::Nothing;
                        }
                        // Else the guard keeps trying in the background while the lease lasts.
                        return Ok(resp);
                    }
                }
                guard.on_drop = OnDrop::Nothing;
                Ok(resp)
            }
            Err(e) if sent && e.kind().may_have_taken_effect() => {
                counters.outcome_unknown.bump();
                let err = outcome_unknown(tool, &why_unknown(&e)).with_source(e);
                let rec =
                    IdempotencyRecord::failed(payload_hash, owner.to_owned(), &err, cfg.record_ttl);
                let at = (tool.as_ref(), skey, owner);
                record(&shared, at, rec, cfg.record_ttl, lease, guard, &payload).await;
                Err(err)
            }
            Err(e)
                if (releases_key(e.kind())
                    || (unsent && e.kind() == ErrorKind::OutcomeUnknown))
                    && claim.from.is_some() =>
            {
                // This call resumed work an earlier owner started (its token is on the claim):
                // releasing would let the next call start that work again. The claim is left
                // to lapse instead, so the next claim takes it over and resumes.
                guard.on_drop = OnDrop::Nothing;
                tracing::warn!(tool = %tool, code = %e.kind(), "idempotency: a resumed call failed; its claim is left to expire so the next call resumes again");
                Err(e)
            }
            // A mutation that ends `CANCELLED` may have been sent before its tool stopped
            // on the token (an MCP call is, once handed to the transport): the key is kept
            // as `OUTCOME_UNKNOWN`, as it is when the cancel layer drops the call's future
            // instead. The caller still gets its `CANCELLED`.
            Err(e) if sent && e.kind() == ErrorKind::Cancelled => {
                counters.outcome_unknown.bump();
                let unknown =
                    outcome_unknown(tool, "was cancelled after it was sent").with_source(e.clone());
                let rec = IdempotencyRecord::failed(
                    payload_hash,
                    owner.to_owned(),
                    &unknown,
                    cfg.record_ttl,
                );
                let at = (tool.as_ref(), skey, owner);
                record(&shared, at, rec, cfg.record_ttl, lease, guard, &payload).await;
                Err(e)
            }
            // An `Idempotent` call whose outcome is unknown (a resumed task the server no
            // longer knows, say) may simply run again: that is what idempotent means. Its
            // token, if any, named the work that was lost, so it goes with the claim. So
            // may a mutation that never reached the tool (a `TIMEOUT` or `CANCELLED` before
            // it was sent is a refusal).
            Err(e)
                if releases_key(e.kind())
                    || ((!mutating || unsent) && e.kind() == ErrorKind::OutcomeUnknown) =>
            {
                guard.on_drop = OnDrop::Release;
                match shared.store.release(skey, owner).await {
                    Ok(_) => guard.on_drop = OnDrop::Nothing,
                    Err(err) => {
                        counters.store_errors.bump();
                        tracing::warn!(tool = %tool, error = %err, "idempotency: could not release the key; its lease will expire");
                        guard.on_drop = OnDrop::Nothing;
                    }
                }
                if unsent && e.kind() == ErrorKind::OutcomeUnknown {
                    // The claim was lost (or could not be kept) while the call still
                    // waited below it: nothing ran, and the caller is not told otherwise.
                    return Err(ToolError::new(
                        ErrorKind::StoreUnavailable,
                        format!("call of `{tool}` could not keep its idempotency claim while it waited; it was not started"),
                    )
                    .with_source(e));
                }
                Err(e)
            }
            Err(e) => {
                let rec =
                    IdempotencyRecord::failed(payload_hash, owner.to_owned(), &e, cfg.failed_ttl);
                let at = (tool.as_ref(), skey, owner);
                record(&shared, at, rec, cfg.failed_ttl, lease, guard, &payload).await;
                Err(e)
            }
        }
    }
}

/// Writes the outcome record `rec` of the claim `(tool, storage key, owner)` with
/// [`write_outcome`], the guard holding it until it is written (a drop in between writes
/// it in the background; so does a write that failed past the bound, once more).
///
/// Not an async fn, which would keep the record (a few hundred bytes) twice in the
/// future of every first execution: the argument and the body's binding.
fn record<'a>(
    shared: &'a Shared,
    (tool, skey, owner): (&'a str, &'a str, &'a str),
    mut rec: IdempotencyRecord,
    ttl: Duration,
    lease: &'a mut Lease,
    guard: &'a mut ClaimGuard,
    payload: &SharedPayload,
) -> impl Future<Output = Written> + 'a {
    // Kept by an in-memory store, so a replay with an equal payload needs no digest.
    rec.payload = Some(payload.clone());
    guard.on_drop = OnDrop::Write(Box::new(rec.clone()), ttl);
    async move {
        let w = write_outcome(shared, tool, skey, owner, &rec, ttl, lease).await;
        if w != Written::Failed {
            guard.on_drop = OnDrop::Nothing;
        }
        w
    }
}

/// Runs the call while renewing the lease every third of it (the renewal runs beside the
/// call, never holding it up). A mutation whose lease cannot be kept (renewals fail until a
/// quarter of the lease is left, or the claim was taken from it) is dropped before anyone
/// can take the key over, and ends `OUTCOME_UNKNOWN`: two executions of one key never run
/// at once.
#[allow(clippy::too_many_arguments)]
async fn call_under_lease<S>(
    shared: &Shared,
    svc: &mut S,
    req: ToolRequest,
    tool: &str,
    skey: &str,
    owner: &str,
    mutating: bool,
    lease: &mut Lease,
) -> Result<ToolResponse, ToolError>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: IntoToolError + Send,
{
    let cfg = &shared.config;
    let fut = svc.call(req);
    tokio::pin!(fut);
    let every = (cfg.lease / 3).max(Duration::from_millis(1));
    let mut next_renewal = deadline_after(lease.last_renewal, every);
    let mut renewing: Option<(Instant, StoreFuture<'_, bool>)> = None;
    loop {
        let abort_at = lease.abort_at();
        tokio::select! {
            biased;
            r = &mut fut => return r.map_err(IntoToolError::into_tool_error),
            r = async {
                match renewing.as_mut() {
                    Some((_, f)) => f.await,
                    None => std::future::pending().await,
                }
            }, if renewing.is_some() => {
                let sent = renewing.take().map_or_else(Instant::now, |(sent, _)| sent);
                match r {
                    Ok(true) => lease.renewed(sent),
                    Ok(false) => {
                        tracing::error!(tool = %tool, "idempotency: the claim was taken while the call ran");
                        if mutating {
                            return Err(outcome_unknown(tool, "lost its idempotency claim while it ran"));
                        }
                    }
                    Err(e) => {
                        shared.counters.store_errors.bump();
                        tracing::warn!(tool = %tool, error = %e, "idempotency: could not renew the lease");
                    }
                }
                next_renewal = deadline_after(time::now(), every);
            }
            () = tokio::time::sleep_until(next_renewal), if renewing.is_none() => {
                renewing = Some((time::now(), shared.store.renew(skey, owner, cfg.lease)));
            }
            () = tokio::time::sleep_until(abort_at), if mutating => {
                tracing::error!(tool = %tool, "idempotency: the lease could not be renewed; the call is abandoned before its claim expires");
                return Err(outcome_unknown(tool, "was abandoned: its idempotency lease could not be renewed"));
            }
        }
    }
}
/// The longest part of an inner error's message kept in an `OUTCOME_UNKNOWN` message
/// (and record), in bytes.
const MAX_INNER_MESSAGE: usize = 512;

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What happened to a mutation that ended with an error that may have taken effect, for
/// its `OUTCOME_UNKNOWN` message.
fn why_unknown(e: &ToolError) -> Cow<'static, str> {
    match e.kind() {
        ErrorKind::Timeout => Cow::Borrowed("timed out after it was sent"),
        ErrorKind::Internal => Cow::Borrowed("failed inside the tool layer after it was sent"),
        // The tool said why (e.g. an MCP task that could not be resumed): keep it.
        _ => Cow::Owned(format!(
            "ended without a known outcome ({})",
            cut(e.message(), MAX_INNER_MESSAGE)
        )),
    }
}

/// The error of a keyless mutation (no key given, none derived): one that may have taken
/// effect becomes `OUTCOME_UNKNOWN` (one already so is kept as it is); any other passes.
fn unkeyed_outcome(tool: &str, e: ToolError) -> ToolError {
    if !e.kind().may_have_taken_effect() || e.kind() == ErrorKind::OutcomeUnknown {
        return e;
    }
    let why = why_unknown(&e);
    ToolError::new(
        ErrorKind::OutcomeUnknown,
        format!("call of `{tool}` {why}; its outcome is unknown (it had no idempotency key: nothing was recorded)"),
    )
    .with_source(e)
}

fn outcome_unknown(tool: &str, what: &str) -> ToolError {
    ToolError::new(
        ErrorKind::OutcomeUnknown,
        format!("call of `{tool}` {what}; its outcome is unknown and its idempotency record is kept for reconciliation"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first execution's future, boxed on every first execution of a key: 1,456 bytes
    /// around a tool answering at once (2,128 with the 232-byte `Result` of before the
    /// provenance record was boxed, 2,992 when it was an async fn that built its
    /// `OUTCOME_UNKNOWN` record up front); a change that makes it hold a value twice again
    /// shows here.
    #[test]
    fn the_first_execution_future_stays_small() {
        let layer = IdempotencyLayer::new(crate::IdempotencyConfig::default()).expect("config");
        let shared = Arc::clone(&layer.shared);
        let claimed = Claimed {
            tool: Arc::from("pay"),
            payload_hash: Digest::of_bytes(b"{}"),
            execution_id: uuid::Uuid::nil(),
            lease: Lease::new(Instant::now(), Duration::from_secs(30)),
            guard: ClaimGuard {
                shared: Arc::clone(&shared),
                key: String::new(),
                owner: String::new(),
                on_drop: OnDrop::Nothing,
            },
            resume: None,
            attempt_marks: true,
        };
        let req = ToolRequest::new("pay", serde_json::json!({}));
        let fut = execute(shared, toolshield_test::BareTool, req, claimed);
        let size = std::mem::size_of_val(&fut);
        assert!(
            size <= 1_600,
            "the first execution's future is {size} bytes"
        );
    }

    #[test]
    fn owner_tokens_are_unique_per_claim_and_share_the_process_prefix() {
        let tokens: Vec<String> = (0..1_000).map(|_| new_owner_token()).collect();
        let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "every claim gets its own token"
        );
        for t in &tokens {
            assert_eq!(
                t.len(),
                48,
                "32 hex characters of prefix, 16 of counter: {t}"
            );
            assert!(t.bytes().all(|b| b.is_ascii_hexdigit()), "hex only: {t}");
            assert_eq!(t[..32], tokens[0][..32], "one random prefix per process");
        }
        assert_ne!(
            &tokens[0][..32],
            "0".repeat(32),
            "the prefix is drawn at random"
        );
    }
}
