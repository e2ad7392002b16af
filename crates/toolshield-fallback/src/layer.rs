//! [`FallbackLayer`]: the chain's configuration.

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use toolshield_contract::panic::CatchPanicLayer;
use toolshield_contract::IntoToolError;
use toolshield_contract::{ShieldRequest, ToolError};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::policy::{default_hand_over, Escalation, FallbackFailure};
use crate::service::Fallback;
use crate::shared::{EscalateFn, Shared, Tier};
use crate::stats::FallbackStats;

/// Configures a fallback chain; [`Layer::layer`] puts it around the primary service.
/// Every service built from one layer shares its [`FallbackStats`].
pub struct FallbackLayer<Req, Res> {
    shared: Arc<Shared<Req, Res>>,
}

impl<Req, Res> Clone for FallbackLayer<Req, Res> {
    fn clone(&self) -> Self {
        FallbackLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Req, Res> Default for FallbackLayer<Req, Res>
where
    Req: ShieldRequest + Send + 'static,
    Res: Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<Req, Res> fmt::Debug for FallbackLayer<Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.shared.tiers.iter().map(|t| &*t.name).collect();
        f.debug_struct("FallbackLayer")
            .field("tiers", &names)
            .field("escalate", &self.shared.escalate.is_some())
            .field("max_escalations", &self.shared.max_escalations)
            .finish()
    }
}

impl<Req, Res> FallbackLayer<Req, Res>
where
    Req: ShieldRequest + Send + 'static,
    Res: Send + 'static,
{
    /// An empty chain (a pass-through until tiers are added); the request and response
    /// types are those of the tiers and the service it is put around (`ToolRequest` and
    /// `ToolResponse` for tools, `http::Request<B>` and `http::Response<B>` for a client).
    #[must_use]
    pub fn new() -> Self {
        Self::from_parts(Vec::new(), None, 1)
    }

    fn from_parts(
        tiers: Vec<Tier<Req, Res>>,
        escalate: Option<EscalateFn<Req, Res>>,
        max_escalations: u32,
    ) -> Self {
        let stats = Arc::new(FallbackStats {
            tiers: tiers
                .iter()
                .map(|t| (t.name.clone(), AtomicU64::new(0)))
                .collect(),
            ..FallbackStats::default()
        });
        FallbackLayer {
            shared: Arc::new(Shared {
                tiers,
                escalate,
                max_escalations,
                stats,
            }),
        }
    }

    /// A copy of this configuration changed by `f` (with fresh counters: the tiers may
    /// have changed).
    fn rebuild(
        self,
        f: impl FnOnce(&mut Vec<Tier<Req, Res>>, &mut Option<EscalateFn<Req, Res>>, &mut u32),
    ) -> Self {
        let mut tiers = self.shared.tiers.clone();
        let mut escalate = self.shared.escalate.clone();
        let mut max = self.shared.max_escalations;
        f(&mut tiers, &mut escalate, &mut max);
        Self::from_parts(tiers, escalate, max)
    }

    /// The hand-over counters shared by every service built from this layer.
    pub fn stats(&self) -> Arc<FallbackStats> {
        self.shared.stats.clone()
    }

    /// Adds a tier with the [`default_hand_over`] rule.
    #[must_use]
    pub fn tier<S>(self, name: impl Into<Arc<str>>, service: S) -> Self
    where
        S: Service<Req, Response = Res> + Clone + Send + Sync + 'static,
        S::Error: IntoToolError,
        S::Future: Send + 'static,
    {
        self.tier_when(name, service, default_hand_over)
    }

    /// Adds a tier that takes over when `predicate(request, error)` holds for the error
    /// of the tier before it.
    #[must_use]
    pub fn tier_when<S, P>(self, name: impl Into<Arc<str>>, service: S, predicate: P) -> Self
    where
        S: Service<Req, Response = Res> + Clone + Send + Sync + 'static,
        S::Error: IntoToolError,
        S::Future: Send + 'static,
        P: Fn(&Req, &ToolError) -> bool + Send + Sync + 'static,
    {
        let name: Arc<str> = name.into();
        // A tier is application code the caller's stack does not wrap: a panic in it
        // ends the call with `INTERNAL` ("the tool panicked") instead of unwinding into
        // the caller's task. The text is logged, never put in the error.
        let tier_name = Arc::clone(&name);
        let catch = CatchPanicLayer::new().on_panic(move |text: &str| {
            tracing::error!(
                target: "toolshield::fallback",
                tier = &*tier_name,
                panic = text,
                "a fallback tier panicked"
            );
        });
        let tier = Tier {
            name,
            service: BoxCloneSyncService::new(
                catch.layer(service.map_err(IntoToolError::into_tool_error)),
            ),
            predicate: Arc::new(predicate),
        };
        self.rebuild(|tiers, _, _| tiers.push(tier))
    }

    /// The last resort when every tier failed: the hook decides to abort, skip with a
    /// substitute result, or retry the tiers (at most `max_escalations` times per call,
    /// default 1; see [`max_escalations`](Self::max_escalations)).
    ///
    /// The hook is asked only after a tier took the failure and failed too: an error no
    /// tier's predicate takes goes back as it was, unasked. A chain with a hook and no
    /// tiers therefore never asks it (building one logs a warning); for a substitute
    /// result on the primary's failure, as Polly's fallback action gives, add a tier
    /// that returns it.
    #[must_use]
    pub fn escalate<F, Fut>(self, hook: F) -> Self
    where
        F: Fn(FallbackFailure<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Escalation<Req, Res>> + Send + 'static,
    {
        let hook: EscalateFn<Req, Res> = Arc::new(move |failure| Box::pin(hook(failure)));
        self.rebuild(|_, escalate, _| *escalate = Some(hook))
    }

    /// How many times one call may be escalated and re-run (default 1). Past it, the
    /// combined error is returned.
    #[must_use]
    pub fn max_escalations(self, n: u32) -> Self {
        self.rebuild(|_, _, max| *max = n)
    }
}

impl<S, Req, Res> Layer<S> for FallbackLayer<Req, Res> {
    type Service = Fallback<S, Req, Res>;

    fn layer(&self, inner: S) -> Fallback<S, Req, Res> {
        if self.shared.tiers.is_empty() && self.shared.escalate.is_some() {
            tracing::warn!(
                target: "toolshield::fallback",
                "a fallback chain with an escalation hook and no tiers never asks the hook: \
                 add a tier (one that returns a substitute result, say)"
            );
        }
        Fallback::new(inner, self.shared.clone())
    }
}
