//! The hand-over decision and what the escalation hook sees and decides.

use std::sync::Arc;
use std::time::Duration;

use toolshield_contract::{CallKind, ErrorKind, ShieldRequest, ToolError};

/// The default hand-over rule.
///
/// - `CIRCUIT_OPEN` always hands over: the failing service never ran.
/// - For `ReadOnly` and `Idempotent` calls, any retriable error hands over too (the
///   fallback layer sits outside retry, so a retriable error reaching it means the
///   retries are exhausted).
/// - A `Mutating` call hands over only on `CIRCUIT_OPEN`: after a timeout or a lost
///   connection it may have happened, and running it on another tier could do it twice.
/// - Everything else (invalid input, not found, unauthorized, cancelled, idempotency
///   conflicts, outcome unknown) stays with the caller: another tier would fail the same
///   way, or must not run.
pub fn default_hand_over<Req: ShieldRequest>(req: &Req, error: &ToolError) -> bool {
    match error.kind() {
        ErrorKind::CircuitOpen => true,
        kind if kind.is_retriable() => req.call_kind() != Some(CallKind::Mutating),
        _ => false,
    }
}

/// What the application decides when every tier failed.
#[derive(Debug)]
pub enum Escalation<Req, Res> {
    /// Return the combined error.
    Abort,
    /// Return this response instead (marked with tier `escalation`).
    Skip(Res),
    /// Run the fallback tiers once more (the primary already spent its retries).
    ///
    /// The round starts as a hand-over from the last error: each tier's predicate is
    /// asked again, in order. For a `Mutating` call, a tier that failed with anything but
    /// `CIRCUIT_OPEN` (a `TIMEOUT`, an `OUTCOME_UNKNOWN`: it may have run) is never sent
    /// the call again.
    Retry,
    /// Run the fallback tiers once more with a changed request, under the same rules as
    /// [`Retry`](Escalation::Retry) (the call counts as `Mutating` if either request is).
    Modify(Req),
}

/// Every tier's failure, handed to the escalation hook.
#[derive(Debug, Clone)]
pub struct FallbackFailure<Req> {
    /// The request of the last round.
    pub request: Req,
    /// `(tier, error)` for the primary (named `primary`) and each tier that ran.
    pub errors: Vec<(Arc<str>, ToolError)>,
    /// How many escalations already happened for this call.
    pub escalations: u32,
}

impl<Req> FallbackFailure<Req> {
    /// The combined error: the kind of the last tier that ran, the shortest wait
    /// (`retry_after`) any tier asked for, and a message listing every tier's error. The
    /// source is the last tier's error.
    pub fn to_error(&self) -> ToolError {
        combine(&self.errors)
    }
}

/// The combined error of a failed chain (see [`FallbackFailure::to_error`]).
pub(crate) fn combine(errors: &[(Arc<str>, ToolError)]) -> ToolError {
    let listed: Vec<String> = errors
        .iter()
        .map(|(tier, e)| format!("{tier}: {e}"))
        .collect();
    let Some((_, last)) = errors.last() else {
        return ToolError::internal("fallback chain failed without an error");
    };
    let message = format!("every tier failed ({})", listed.join("; "));
    let retry_after: Option<Duration> = errors.iter().filter_map(|(_, e)| e.retry_after()).min();
    let mut error = ToolError::new(last.kind(), message)
        .with_attempts(last.attempts())
        .with_source(last.clone());
    if let Some(wait) = retry_after {
        error = error.with_retry_after(wait);
    }
    error
}
