//! The cancellation tokens of a call, behind one `Arc`.
//!
//! tokio-util's `CancellationToken::clone` takes a lock on the token tree; a request is
//! cloned by several layers per call, so the request keeps both of its tokens behind
//! one `Arc` instead: cloning a request, or handing a layer a way to cancel the attempt,
//! is a single reference-count increment.
//!
//! The attempt token is made the first time it is asked for (by the tool, or by a guard
//! cancelling an abandoned attempt): a child token costs two allocations and a lock on
//! the call token both to make and to drop, which a tool that never watches it should
//! not pay. A token made after its attempt or call was cancelled is made cancelled.
//!
//! A later attempt's tokens (and the tokens a clone of a template gets for its own
//! call) share the call token by holding the tokens that own it, not a clone of it: one
//! reference count instead of a lock on the token tree to make and another to drop.

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

struct Tokens {
    call: Call,
    attempt: OnceLock<CancellationToken>,
}

/// Where the call token is.
enum Call {
    /// Here.
    Own(CancellationToken),
    /// In these tokens, whose own it is (never another `Of`: one step at most).
    Of(Arc<Tokens>),
}

impl Tokens {
    #[inline]
    fn call(&self) -> &CancellationToken {
        match &self.call {
            Call::Own(token) => token,
            Call::Of(owner) => owner.call(),
        }
    }
}

/// The call token (the caller's: cancelling it cancels the whole call) and the attempt
/// token (a child of it, what the tool watches). Cheap to clone.
#[derive(Clone)]
pub struct CallTokens(Arc<Tokens>);

impl CallTokens {
    /// A fresh call token; its attempt token is made when first asked for.
    #[must_use]
    pub fn new() -> Self {
        Self::with_call(CancellationToken::new())
    }

    /// Uses the caller's `call` token; the attempt token is a new child of it.
    #[must_use]
    pub fn with_call(call: CancellationToken) -> Self {
        CallTokens(Arc::new(Tokens {
            call: Call::Own(call),
            attempt: OnceLock::new(),
        }))
    }

    /// Wraps tokens a request type keeps elsewhere (`attempt` should be a child of `call`).
    #[must_use]
    pub fn from_parts(call: CancellationToken, attempt: CancellationToken) -> Self {
        CallTokens(Arc::new(Tokens {
            call: Call::Own(call),
            attempt: OnceLock::from(attempt),
        }))
    }

    /// The call token.
    #[inline]
    pub fn call(&self) -> &CancellationToken {
        self.0.call()
    }

    /// The attempt token.
    pub fn attempt(&self) -> &CancellationToken {
        self.0.attempt.get_or_init(|| self.0.call().child_token())
    }

    /// The same call token with a fresh attempt token, for the next attempt.
    pub fn next_attempt(&self) -> CallTokens {
        let owner = match &self.0.call {
            Call::Own(_) => Arc::clone(&self.0),
            Call::Of(owner) => Arc::clone(owner),
        };
        CallTokens(Arc::new(Tokens {
            call: Call::Of(owner),
            attempt: OnceLock::new(),
        }))
    }

    /// Whether anything else holds these same tokens: another request (a clone of a
    /// template, or the template itself), a layer's copy, or a later attempt's tokens.
    #[inline]
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }

    /// A guard that cancels the attempt token when dropped, unless disarmed.
    pub fn guard_attempt(self) -> AttemptGuard {
        AttemptGuard { tokens: Some(self) }
    }
}

impl Default for CallTokens {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CallTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTokens")
            .field("call_cancelled", &self.0.call().is_cancelled())
            .field(
                "attempt_cancelled",
                &self
                    .0
                    .attempt
                    .get()
                    .is_some_and(CancellationToken::is_cancelled),
            )
            .finish()
    }
}

/// Cancels an attempt token when dropped: held by a future for as long as its attempt
/// runs, disarmed when the attempt finishes, so an attempt abandoned by a timeout, a
/// deadline or a dropped caller is cancelled. Cheaper than tokio-util's `DropGuard`
/// (no lock to create it).
#[must_use = "dropping the guard at once cancels the attempt"]
pub struct AttemptGuard {
    tokens: Option<CallTokens>,
}

impl AttemptGuard {
    /// The attempt finished: do not cancel it.
    #[inline]
    pub fn disarm(mut self) {
        self.tokens = None;
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        if let Some(tokens) = self.tokens.take() {
            tokens.attempt().cancel();
        }
    }
}

impl fmt::Debug for AttemptGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptGuard")
            .field("armed", &self.tokens.is_some())
            .finish()
    }
}
