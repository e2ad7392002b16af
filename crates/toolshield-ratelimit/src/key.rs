//! [`KeyFn`]: which bucket of a rate limiter a request goes to.

use std::borrow::Cow;

use toolshield_contract::ShieldRequest;

/// Picks the bucket (key) of a request in a rate limiter
/// ([`RateLimitLayer::keyed`](crate::RateLimitLayer::keyed)).
///
/// `None` is the bucket of requests that carry no key (no caller id, no run id):
/// they share one bucket of their own, which no present key can reach. Returning a
/// borrowed key costs nothing; an owned one costs an allocation per call.
pub trait KeyFn<Req> {
    /// The key of `req`, or `None` when it has none.
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>>;
}

/// The name the request gives ([`ShieldRequest::call_name`]: the tool, the host): one
/// bucket per tool (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByName;

impl<Req: ShieldRequest> KeyFn<Req> for ByName {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.call_name().map(Cow::Borrowed)
    }
}

/// The caller id ([`CallMeta::caller`](toolshield_contract::CallMeta)): each caller has
/// its own rate.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByCaller;

impl<Req: ShieldRequest> KeyFn<Req> for ByCaller {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.call_meta().caller.map(Cow::Borrowed)
    }
}

/// The agent run id ([`CallMeta::run_id`](toolshield_contract::CallMeta)).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByRun;

impl<Req: ShieldRequest> KeyFn<Req> for ByRun {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.call_meta().run_id.map(Cow::Borrowed)
    }
}

/// A [`KeyFn`] made from a closure; see [`key_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FnKey<F>(F);

/// Makes a [`KeyFn`] from a closure `Fn(&Req) -> Option<Cow<str>>`.
///
/// ```
/// use std::borrow::Cow;
/// use toolshield_ratelimit::{key_fn, KeyFn};
///
/// let by_prefix = key_fn(|req: &String| req.split_once(':').map(|(p, _)| Cow::Borrowed(p)));
/// assert_eq!(by_prefix.key(&"db:select".to_owned()).as_deref(), Some("db"));
/// ```
pub fn key_fn<Req, F>(f: F) -> FnKey<F>
where
    F: for<'r> Fn(&'r Req) -> Option<Cow<'r, str>>,
{
    FnKey(f)
}

impl<Req, F> KeyFn<Req> for FnKey<F>
where
    F: for<'r> Fn(&'r Req) -> Option<Cow<'r, str>>,
{
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        (self.0)(req)
    }
}
