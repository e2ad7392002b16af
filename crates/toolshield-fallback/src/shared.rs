//! The chain every service built from one layer shares.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use toolshield_core::{ToolError, ToolRequest, ToolResponse};
use tower::util::BoxCloneSyncService;

use crate::policy::{Escalation, FallbackFailure};
use crate::stats::FallbackStats;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub(crate) type TierService = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;
pub(crate) type Predicate = Arc<dyn Fn(&ToolRequest, &ToolError) -> bool + Send + Sync>;
pub(crate) type EscalateFn = Arc<dyn Fn(FallbackFailure) -> BoxFuture<Escalation> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Tier {
    pub(crate) name: Arc<str>,
    pub(crate) service: TierService,
    pub(crate) predicate: Predicate,
}

pub(crate) struct Shared {
    pub(crate) tiers: Vec<Tier>,
    pub(crate) escalate: Option<EscalateFn>,
    pub(crate) max_escalations: u32,
    pub(crate) stats: Arc<FallbackStats>,
}
