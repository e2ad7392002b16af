//! [`KeyFn`]: which breaker a request goes to.

use std::borrow::Cow;

use toolshield_contract::ShieldRequest;

/// Picks the breaker key of a request.
///
/// The default, [`ToolKey`], keys on the name the request gives
/// ([`ShieldRequest::call_name`]: the tool, the host of an HTTP request), and puts requests
/// that give none (a `String`, your own type) under one key, [`UNNAMED_KEY`]. [`FixedKey`]
/// gives every request of a layer one breaker of its own name. Build other keys with
/// [`key_fn`]: by provider, by agent, by host. Returning a borrowed key costs nothing; an
/// owned one costs an allocation per call.
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
    fn key<'a>(&'a self, req: &'a Req) -> Cow<'a, str>;
}

/// The key of a request that names no tool or host.
pub const UNNAMED_KEY: &str = "default";

/// The default key: the name the request gives (the tool; the host for HTTP requests), or
/// [`UNNAMED_KEY`] for a request type that gives none.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolKey;

impl<Req: ShieldRequest> KeyFn<Req> for ToolKey {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Cow<'a, str> {
        Cow::Borrowed(req.call_name().unwrap_or(UNNAMED_KEY))
    }
}

/// One key for every request of a layer: one breaker guards the whole service it wraps
/// (a `Service<String>`, a database client), whatever the request says.
///
/// ```
/// use toolshield_breaker::{FixedKey, KeyFn};
///
/// let key = FixedKey::new("billing-db");
/// assert_eq!(KeyFn::<String>::key(&key, &"SELECT 1".to_owned()), "billing-db");
/// ```
#[derive(Debug, Clone)]
pub struct FixedKey(std::sync::Arc<str>);

impl FixedKey {
    /// Every request goes to the breaker `key`.
    #[must_use]
    pub fn new(key: impl Into<std::sync::Arc<str>>) -> Self {
        FixedKey(key.into())
    }
}

impl<Req> KeyFn<Req> for FixedKey {
    #[inline]
    fn key<'a>(&'a self, _req: &'a Req) -> Cow<'a, str> {
        Cow::Borrowed(&self.0)
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
    fn key<'a>(&'a self, req: &'a Req) -> Cow<'a, str> {
        (self.0)(req)
    }
}
