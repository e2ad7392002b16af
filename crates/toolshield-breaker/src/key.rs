//! [`KeyFn`]: which breaker a request goes to.

use std::borrow::Cow;

use toolshield_core::ShieldRequest;

/// Picks the breaker key of a request.
///
/// The default, [`ToolKey`], keys on the tool name ([`ShieldRequest::tool`]). Build other
/// keys with [`key_fn`]: by provider, by agent, by host. Returning a borrowed key costs
/// nothing; an owned one costs an allocation per call.
///
/// ```
/// use std::borrow::Cow;
/// use toolshield_breaker::{key_fn, KeyFn};
/// use toolshield_core::ToolRequest;
///
/// // One breaker per calling agent.
/// let by_agent = key_fn(|req: &ToolRequest| {
///     Cow::Borrowed(req.meta().caller_id.as_deref().unwrap_or("anonymous"))
/// });
/// let req = ToolRequest::new("search", serde_json::json!({})).caller("agent-7");
/// assert_eq!(by_agent.key(&req), "agent-7");
///
/// // One breaker per provider, from a typed extension set by the caller.
/// #[derive(Clone)]
/// struct Provider(&'static str);
/// let by_provider = key_fn(|req: &ToolRequest| {
///     Cow::Borrowed(req.extensions().get::<Provider>().map_or("unknown", |p| p.0))
/// });
/// let req = ToolRequest::new("chat", serde_json::json!({})).extension(Provider("anthropic"));
/// assert_eq!(by_provider.key(&req), "anthropic");
/// ```
pub trait KeyFn<Req> {
    /// The key of `req`.
    fn key<'r>(&self, req: &'r Req) -> Cow<'r, str>;
}

/// The default key: the tool name (the host for HTTP requests).
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolKey;

impl<Req: ShieldRequest> KeyFn<Req> for ToolKey {
    #[inline]
    fn key<'r>(&self, req: &'r Req) -> Cow<'r, str> {
        Cow::Borrowed(req.tool())
    }
}

/// A [`KeyFn`] made from a closure; see [`key_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FnKey<F>(F);

/// Makes a [`KeyFn`] from a closure `Fn(&Req) -> Cow<str>`.
pub fn key_fn<Req, F>(f: F) -> FnKey<F>
where
    F: for<'r> Fn(&'r Req) -> Cow<'r, str>,
{
    FnKey(f)
}

impl<Req, F> KeyFn<Req> for FnKey<F>
where
    F: for<'r> Fn(&'r Req) -> Cow<'r, str>,
{
    #[inline]
    fn key<'r>(&self, req: &'r Req) -> Cow<'r, str> {
        (self.0)(req)
    }
}
