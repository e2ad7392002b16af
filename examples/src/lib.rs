//! Runnable examples of toolshield; see the `[[example]]` targets.

/// `docs/axum.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/axum.md")]
pub struct AxumDocDoctests;

/// `docs/budget.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/budget.md")]
pub struct BudgetDocDoctests;

/// `docs/bulkhead.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/bulkhead.md")]
pub struct BulkheadDocDoctests;

/// `docs/hedging.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/hedging.md")]
pub struct HedgingDocDoctests;

/// `docs/mcp.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/mcp.md")]
pub struct McpDocDoctests;

/// `docs/operations.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/operations.md")]
pub struct OperationsDocDoctests;

/// `docs/progress.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/progress.md")]
pub struct ProgressDocDoctests;

/// `docs/rate-limit.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/rate-limit.md")]
pub struct RateLimitDocDoctests;

/// `docs/redis.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/redis.md")]
pub struct RedisDocDoctests;

/// `docs/reload.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/reload.md")]
pub struct ReloadDocDoctests;

/// `docs/reqwest.md`, whose Rust snippets run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/reqwest.md")]
pub struct ReqwestDocDoctests;
