//! Live reload: the policies of every tool behind one swappable cell, and the service
//! that reads it once per call.
//!
//! A reload builds a whole new generation of policies (every tool's layers) next to the
//! running one, then publishes it in one step. A wrapped service compares the cell's
//! generation with the one its stack was built from (one atomic load per call, in
//! `poll_ready`) and rebuilds its stack only when they differ. A call that already went
//! through `poll_ready` keeps the stack it was made ready on: calls in flight finish under
//! the settings they started with. See docs/reload.md.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll};

use serde::Serialize;
use toolshield_core::ToolRequest;
use toolshield_metrics::{MetricsLayer, MetricsTarget};
use tower::Service;

use crate::config::ShieldConfig;
use crate::shield::ToolLayers;

/// One generation of policies: every tool's layers, built and checked together.
pub(crate) struct Policies {
    /// Set by [`PolicyCell::publish`].
    pub(crate) generation: u64,
    pub(crate) config: Arc<ShieldConfig>,
    pub(crate) defaults: ToolLayers,
    pub(crate) tools: BTreeMap<String, ToolLayers>,
    pub(crate) metrics: MetricsLayer,
    /// Where `metrics` records: a registered tool outside `config.tools` gets a layer of
    /// its own on the same target, under its own name.
    pub(crate) metrics_target: MetricsTarget,
}

impl Policies {
    /// The layers of `tool`: its own section, or the defaults.
    pub(crate) fn layers(&self, tool: &str) -> &ToolLayers {
        self.tools.get(tool).unwrap_or(&self.defaults)
    }
}

/// The current generation of policies, shared by a shield, its clones and every service
/// they wrapped.
pub(crate) struct PolicyCell {
    /// The generation of `current`, readable without the lock: the hot path's one load.
    generation: AtomicU64,
    current: RwLock<Arc<Policies>>,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while the lock was held cannot leave a half-written `Arc`: writes are one
    // assignment.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl PolicyCell {
    pub(crate) fn new(mut policies: Policies) -> Self {
        policies.generation = 1;
        PolicyCell {
            generation: AtomicU64::new(1),
            current: RwLock::new(Arc::new(policies)),
        }
    }

    /// The generation new calls get.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current policies.
    pub(crate) fn load(&self) -> Arc<Policies> {
        Arc::clone(&read(&self.current))
    }

    /// Makes `policies` the current generation; returns its number.
    pub(crate) fn publish(&self, mut policies: Policies) -> u64 {
        let mut current = write(&self.current);
        let generation = current.generation + 1;
        policies.generation = generation;
        *current = Arc::new(policies);
        // After the write: a service that sees this number finds these policies (or
        // newer ones) behind the lock.
        self.generation.store(generation, Ordering::Release);
        generation
    }
}

/// What one wrapped service shares among its clones: the policies, how to build its
/// stack, and the stack built last (so a clone made from a stale one does not build it
/// again). One `Arc` for all of it: a clone of the service costs one increment here.
pub(crate) struct Wrapped<B, T> {
    cell: Arc<PolicyCell>,
    build: B,
    latest: RwLock<(u64, T)>,
}

/// A tool's stack that follows reloads: the stack of the current generation, rebuilt
/// (once per wrapped service and generation) when the generation changes.
pub(crate) struct Reloading<B, T> {
    shared: Arc<Wrapped<B, T>>,
    generation: u64,
    stack: T,
}

impl<B, T: Clone> Clone for Reloading<B, T> {
    #[inline(always)]
    fn clone(&self) -> Self {
        Reloading {
            shared: Arc::clone(&self.shared),
            generation: self.generation,
            stack: self.stack.clone(),
        }
    }
}

impl<B, T> Reloading<B, T>
where
    B: Fn(&Policies) -> T,
    T: Clone,
{
    pub(crate) fn new(cell: Arc<PolicyCell>, build: B) -> Self {
        let policies = cell.load();
        let stack = build(&policies);
        Reloading {
            shared: Arc::new(Wrapped {
                cell,
                build,
                latest: RwLock::new((policies.generation, stack.clone())),
            }),
            generation: policies.generation,
            stack,
        }
    }

    /// Brings the stack to the current generation.
    #[inline]
    fn refresh(&mut self) {
        let now = self.shared.cell.generation();
        if now != self.generation {
            self.rebuild(now);
        }
    }

    #[cold]
    fn rebuild(&mut self, now: u64) {
        {
            let latest = read(&self.shared.latest);
            if latest.0 >= now {
                self.generation = latest.0;
                self.stack = latest.1.clone();
                return;
            }
        }
        let policies = self.shared.cell.load();
        let stack = (self.shared.build)(&policies);
        let mut latest = write(&self.shared.latest);
        if policies.generation > latest.0 {
            *latest = (policies.generation, stack.clone());
        }
        self.generation = policies.generation;
        self.stack = stack;
    }
}

impl<B, T> Service<ToolRequest> for Reloading<B, T>
where
    B: Fn(&Policies) -> T,
    T: Service<ToolRequest> + Clone,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = T::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The one load per call. A stack replaced here may have been made ready before:
        // dropping it releases what it reserved, and the new one is polled now.
        self.refresh();
        self.stack.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // The stack made ready is the one called, even if a reload came in between.
        self.stack.call(req)
    }
}

/// What a [`Shield::reload`](crate::Shield::reload) changed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct ReloadSummary {
    /// The number of the configuration now in force (1 is the one the shield was built
    /// with; every reload adds one).
    pub generation: u64,
    /// Whether the stack is on (`enabled`); `false` makes every tool a pass-through.
    pub enabled: bool,
    /// Tool sections the new configuration adds.
    pub added: Vec<String>,
    /// Tool sections it removes (those tools now run on the defaults).
    pub removed: Vec<String>,
    /// Sections whose settings changed (`defaults` and tool names; no tool may be named
    /// `defaults`, so the entry always means the defaults section).
    pub changed: Vec<String>,
    /// Sections whose breaker settings changed but whose breakers keep their registry,
    /// state and thresholds (a registry's thresholds are fixed when it is created; see
    /// docs/reload.md). Empty when every breaker setting is in force.
    pub breaker_settings_kept: Vec<String>,
    /// Breaker registries the reload created (tools added with breaker settings of their
    /// own).
    pub new_registries: Vec<String>,
    /// Tools already wrapped whose flow-control settings (bulkhead, rate limit, run budget,
    /// hedging, fault injection) changed: those layers are built when a tool is first
    /// wrapped and keep their settings and state for the life of the shield, so the new
    /// settings are **not** in force for them (see docs/reload.md). Restart to apply them.
    pub flow_settings_kept: Vec<String>,
    /// Whether the `[runs]` table changed: it is read once, when the shield is built, so
    /// the new run budgets are **not** in force. Restart to apply them.
    pub runs_kept: bool,
}
