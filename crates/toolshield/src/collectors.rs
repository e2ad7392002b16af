//! Prometheus collectors for the state the breaker and fallback layers keep, read at
//! scrape time. They live in the facade, which knows every layer, so that
//! `toolshield-metrics` depends on no other layer.

mod breaker;
mod budget;
mod bulkhead;
mod chaos;
mod fallback;
mod hedge;
mod ratelimit;

pub use breaker::BreakerMetrics;
pub use budget::*;
pub use bulkhead::*;
pub use chaos::*;
pub(crate) use fallback::ToolChains;
pub use fallback::{FallbackMetrics, TOOL_FALLBACK_EXHAUSTED_TOTAL, TOOL_FALLBACK_HANDOVERS_TOTAL};
pub use hedge::*;
pub use ratelimit::*;
