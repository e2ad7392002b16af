//! [`KeyFn`]: which compartment (a bulkhead's), bucket (a rate limiter's) or counter a
//! request goes to, shared by the keyed layers.

use std::borrow::Cow;

use crate::ShieldRequest;

/// Picks the key of a request in a keyed layer (a bulkhead's compartment, a rate
/// limiter's bucket).
///
/// `None` is the key of requests that carry none (no caller id, no run id): they share
/// one compartment of their own, which no present key can reach. Returning a
/// borrowed key costs nothing; an owned one costs an allocation per call.
pub trait KeyFn<Req> {
    /// The key of `req`, or `None` when it has none.
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>>;
}

/// The name the request gives ([`ShieldRequest::call_name`]: the tool, the host): one
/// key per tool when one layer guards several.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByName;

impl<Req: ShieldRequest> KeyFn<Req> for ByName {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.call_name().map(Cow::Borrowed)
    }
}

/// The caller id ([`CallMeta::caller`](crate::CallMeta)): one caller cannot take what
/// every caller shares.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByCaller;

impl<Req: ShieldRequest> KeyFn<Req> for ByCaller {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.call_meta().caller.map(Cow::Borrowed)
    }
}

/// The agent run id ([`CallMeta::run_id`](crate::CallMeta)).
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
/// use toolshield_contract::key::{key_fn, KeyFn};
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
