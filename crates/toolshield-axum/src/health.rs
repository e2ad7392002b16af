//! `GET /healthz`: registered checks, run concurrently, each with a timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The future a [`HealthCheck`] returns.
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

/// One health check: a store's PING, a database query, a tool probe.
///
/// Implemented by every `Fn() -> impl Future<Output = Result<(), E>>` with `E: Display`,
/// so an async closure is a check.
pub trait HealthCheck: Send + Sync + 'static {
    /// Runs the check once. `Err` carries a short reason shown in the JSON body (never a
    /// secret: it is served to whoever can reach `/healthz`).
    fn check(&self) -> CheckFuture;
}

impl<F, Fut, E> HealthCheck for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    fn check(&self) -> CheckFuture {
        let fut = self();
        Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
    }
}

/// Whether a failing check fails `/healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Importance {
    /// A failure makes `/healthz` answer 503 `degraded` (a store the stack needs).
    Core,
    /// A failure is reported but `/healthz` stays 200 (a tool probe, open breakers).
    NonCore,
}

#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) name: Arc<str>,
    pub(crate) importance: Importance,
    pub(crate) timeout: Duration,
    pub(crate) check: Arc<dyn HealthCheck>,
}

/// The state of one component in the `/healthz` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComponentStatus {
    /// The check passed.
    Ok,
    /// The check failed.
    Error,
    /// The check did not finish within its timeout.
    Timeout,
    /// Informational: not healthy, but not a failure (open breakers).
    Degraded,
}

/// One component in the `/healthz` body.
#[derive(Debug, Clone, Serialize)]
pub struct Component {
    /// ok, error, timeout or degraded.
    pub status: ComponentStatus,
    /// Whether it decides the overall status.
    pub core: bool,
    /// How long the check took, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How many breakers are open (tripped), across every registry (the `breakers`
    /// component only). Counts, never keys: keys may be caller ids, and `/healthz` is
    /// served without a token (the keys are on the admin API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open: Option<usize>,
    /// How many breakers are forced open by an operator, across every registry (the
    /// `breakers` component only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced_open: Option<usize>,
}

/// The `/healthz` body: `{"status":"ok"|"degraded","components":{...},"failing":[...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    /// `ok` when every core check passed, else `degraded`.
    pub status: &'static str,
    /// Every component by name.
    pub components: BTreeMap<String, Component>,
    /// The core components that failed, sorted.
    pub failing: Vec<String>,
}

impl HealthReport {
    /// Whether every core check passed.
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs every check concurrently, each under its own timeout; a check that panics counts
/// as failed.
pub(crate) async fn run_checks(checks: &[Registered]) -> BTreeMap<String, Component> {
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in checks.iter().enumerate() {
        let check = Arc::clone(&c.check);
        let timeout = c.timeout;
        set.spawn(async move {
            let start = Instant::now();
            let result = tokio::time::timeout(timeout, check.check()).await;
            (i, result, start.elapsed())
        });
    }
    let mut done: Vec<Option<(ComponentStatus, Option<String>, Duration)>> =
        vec![None; checks.len()];
    while let Some(joined) = set.join_next().await {
        if let Ok((i, result, elapsed)) = joined {
            let entry = match result {
                Ok(Ok(())) => (ComponentStatus::Ok, None, elapsed),
                Ok(Err(e)) => (ComponentStatus::Error, Some(e), elapsed),
                Err(_) => (
                    ComponentStatus::Timeout,
                    Some(format!("no answer within {} ms", millis(checks[i].timeout))),
                    elapsed,
                ),
            };
            if let Some(slot) = done.get_mut(i) {
                *slot = Some(entry);
            }
        }
    }
    checks
        .iter()
        .zip(done)
        .map(|(c, r)| {
            let (status, error, elapsed) = r.unwrap_or((
                ComponentStatus::Error,
                Some("check panicked".to_owned()),
                Duration::ZERO,
            ));
            (
                c.name.to_string(),
                Component {
                    status,
                    core: c.importance == Importance::Core,
                    duration_ms: Some(millis(elapsed)),
                    error,
                    open: None,
                    forced_open: None,
                },
            )
        })
        .collect()
}

/// The name of the built-in component counting open breakers.
pub(crate) const BREAKERS_COMPONENT: &str = "breakers";

/// `name`, or `name#2`, `name#3`, ... (the first not in `taken`), recorded in `taken`.
/// Two components of one name would share one entry of the report, the later hiding the
/// earlier: a failing core check must never be hidden that way.
pub(crate) fn unique_name(taken: &mut BTreeSet<Arc<str>>, name: Arc<str>) -> Arc<str> {
    let mut unique = Arc::clone(&name);
    let mut n = 2u64;
    while taken.contains(&unique) {
        unique = Arc::from(format!("{name}#{n}"));
        n += 1;
    }
    taken.insert(Arc::clone(&unique));
    unique
}

pub(crate) fn report(components: BTreeMap<String, Component>) -> HealthReport {
    let failing: Vec<String> = components
        .iter()
        .filter(|(_, c)| c.core && c.status != ComponentStatus::Ok)
        .map(|(n, _)| n.clone())
        .collect();
    HealthReport {
        status: if failing.is_empty() { "ok" } else { "degraded" },
        components,
        failing,
    }
}
