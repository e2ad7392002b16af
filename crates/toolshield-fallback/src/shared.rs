//! The chain every service built from one layer shares.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use toolshield_contract::ToolError;
use tower::util::BoxCloneSyncService;

use crate::policy::{Escalation, FallbackFailure};
use crate::stats::FallbackStats;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub(crate) type TierService<Req, Res> = BoxCloneSyncService<Req, Res, ToolError>;
pub(crate) type Predicate<Req> = Arc<dyn Fn(&Req, &ToolError) -> bool + Send + Sync>;
pub(crate) type EscalateFn<Req, Res> =
    Arc<dyn Fn(FallbackFailure<Req>) -> BoxFuture<Escalation<Req, Res>> + Send + Sync>;

pub(crate) struct Tier<Req, Res> {
    pub(crate) name: Arc<str>,
    pub(crate) service: TierService<Req, Res>,
    pub(crate) predicate: Predicate<Req>,
}

impl<Req, Res> Clone for Tier<Req, Res> {
    fn clone(&self) -> Self {
        Tier {
            name: Arc::clone(&self.name),
            service: self.service.clone(),
            predicate: Arc::clone(&self.predicate),
        }
    }
}

pub(crate) struct Shared<Req, Res> {
    pub(crate) tiers: Vec<Tier<Req, Res>>,
    pub(crate) escalate: Option<EscalateFn<Req, Res>>,
    pub(crate) max_escalations: u32,
    pub(crate) stats: Arc<FallbackStats>,
}
