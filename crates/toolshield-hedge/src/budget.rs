//! [`HedgeBudget`]: what hedging withdraws from before it sends an extra attempt.

/// A budget of extra attempts, shared with the retry layer so that hedges and retries
/// together add at most a fraction of the traffic.
///
/// The hedging crate depends on the contract only; with the `retry` feature this trait is
/// implemented for `toolshield_retry::RetryBudget`, so the budget of a retry layer
/// (`RetryLayer::budget()`) is handed over as it is. Any other limiter (a rate limiter, a
/// per-tenant quota) implements the two methods.
pub trait HedgeBudget: Send + Sync {
    /// Asks for one extra attempt: `true` (and it is spent) if the budget allows it.
    fn try_withdraw(&self) -> bool;

    /// Records a call (a first attempt). Hedging calls it only for a budget it owns
    /// ([`HedgeLayer::with_own_budget`](crate::HedgeLayer::with_own_budget)); a budget
    /// shared with a retry layer is fed by that layer.
    fn deposit(&self) {}
}

#[cfg(feature = "retry")]
impl HedgeBudget for toolshield_retry::RetryBudget {
    fn try_withdraw(&self) -> bool {
        toolshield_retry::RetryBudget::try_withdraw(self)
    }

    fn deposit(&self) {
        toolshield_retry::RetryBudget::deposit(self);
    }
}

impl<B: HedgeBudget + ?Sized> HedgeBudget for std::sync::Arc<B> {
    fn try_withdraw(&self) -> bool {
        (**self).try_withdraw()
    }

    fn deposit(&self) {
        (**self).deposit();
    }
}
