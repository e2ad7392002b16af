//! [`ToolService`]: the bound of a tool implementation, spelled once.

use crate::{ToolError, ToolRequest, ToolResponse};

/// A tool implementation that can sit behind a router or in a fallback tier: a
/// cloneable, thread-safe `Service<ToolRequest>` whose future can move across threads.
///
/// Implemented for every service that qualifies; use it to spell the bound once.
pub trait ToolService:
    tower_service::Service<
        ToolRequest,
        Response = ToolResponse,
        Error = ToolError,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> ToolService for S where
    S: tower_service::Service<
            ToolRequest,
            Response = ToolResponse,
            Error = ToolError,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}
