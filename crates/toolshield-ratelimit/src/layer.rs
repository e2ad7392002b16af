use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::{ConfigError, ShieldRequest};
use toolshield_store::Counter;
use tower_layer::Layer;

use crate::config::{OnLimit, OnStoreError, RateKey, RateLimitConfig};
use crate::gcra::RateLimit;
use crate::service::RateLimiter;
use crate::store::{MemoryRateLimitStore, RateLimitStore};
use toolshield_contract::key::{ByCaller, ByName, ByRun, KeyFn};

/// The counters every service of a layer shares.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) admitted: Counter,
    pub(crate) waited: Counter,
    pub(crate) rejected: Counter,
    pub(crate) store_errors: Counter,
}

/// What every service of a layer shares: settings resolved once, the store, counters.
pub(crate) struct Shared {
    pub(crate) limit: RateLimit,
    /// `None`: reject at once; else the longest wait.
    pub(crate) max_wait: Option<Duration>,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) store: Arc<dyn RateLimitStore>,
    pub(crate) counters: Counters,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("limit", &self.limit)
            .field("max_wait", &self.max_wait)
            .field("on_store_error", &self.on_store_error)
            .finish_non_exhaustive()
    }
}

/// The key a [`RateLimitConfig`] names.
#[derive(Debug, Clone, Copy)]
pub enum ConfiguredKey {
    /// [`ByName`].
    Tool,
    /// [`ByCaller`].
    Caller,
    /// [`ByRun`].
    Run,
}

impl<Req: ShieldRequest> KeyFn<Req> for ConfiguredKey {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        match self {
            ConfiguredKey::Tool => ByName.key(req),
            ConfiguredKey::Caller => ByCaller.key(req),
            ConfiguredKey::Run => ByRun.key(req),
        }
    }
}

/// Rate-limits the calls through the services it builds; see [`RateLimiter`].
///
/// Every service built from one layer (and every clone) shares its store and counters;
/// build one layer per tool stack (or share one store between replicas).
#[derive(Debug, Clone)]
pub struct RateLimitLayer<K = ByName> {
    shared: Arc<Shared>,
    key: K,
}

impl RateLimitLayer<ByName> {
    /// `limit` per tool name, in memory (10,000 keys), rejecting at once a call over it.
    #[must_use]
    pub fn new(limit: RateLimit) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                limit,
                max_wait: None,
                on_store_error: OnStoreError::Allow,
                store: Arc::new(MemoryRateLimitStore::default()),
                counters: Counters::default(),
            }),
            key: ByName,
        }
    }
}

impl<K> RateLimitLayer<K> {
    fn rebuild(self, f: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Shared {
            limit: self.shared.limit,
            max_wait: self.shared.max_wait,
            on_store_error: self.shared.on_store_error,
            store: Arc::clone(&self.shared.store),
            counters: Counters::default(),
        };
        f(&mut shared);
        RateLimitLayer {
            shared: Arc::new(shared),
            key: self.key,
        }
    }

    /// A call over the limit waits for its turn when that wait is at most `max_wait`
    /// (clamped to [`MAX_DURATION`]) and ends before the call's deadline; else it is
    /// rejected. Call before building services (the counters start afresh).
    #[must_use]
    pub fn wait_up_to(self, max_wait: Duration) -> Self {
        self.rebuild(|s| s.max_wait = Some(max_wait.min(MAX_DURATION)))
    }

    /// The state lives in `store` (shared by every replica for a Redis store).
    #[must_use]
    pub fn with_store(self, store: Arc<dyn RateLimitStore>) -> Self {
        self.rebuild(|s| s.store = store)
    }

    /// What a call does when the store fails.
    #[must_use]
    pub fn on_store_error(self, on: OnStoreError) -> Self {
        self.rebuild(|s| s.on_store_error = on)
    }

    /// One bucket per key that `key` picks.
    #[must_use]
    pub fn keyed<K2>(self, key: K2) -> RateLimitLayer<K2> {
        RateLimitLayer {
            shared: self.shared,
            key,
        }
    }

    /// A handle on the counters every service of this layer shares.
    #[must_use]
    pub fn stats(&self) -> RateLimitStats {
        RateLimitStats {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl RateLimitLayer<ConfiguredKey> {
    /// The limiter a validated config describes, in memory (`max_keys` keys).
    pub fn from_config(cfg: &RateLimitConfig) -> Result<Self, ConfigError> {
        Self::from_config_with_store(cfg, Arc::new(MemoryRateLimitStore::new(cfg.max_keys)))
    }

    /// The limiter a validated config describes, over `store` (`max_keys` unused).
    pub fn from_config_with_store(
        cfg: &RateLimitConfig,
        store: Arc<dyn RateLimitStore>,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let key = match cfg.key {
            RateKey::Tool => ConfiguredKey::Tool,
            RateKey::Caller => ConfiguredKey::Caller,
            RateKey::Run => ConfiguredKey::Run,
        };
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limit: cfg.limit(),
                max_wait: (cfg.on_limit == OnLimit::Wait).then_some(cfg.max_wait),
                on_store_error: cfg.on_store_error,
                store,
                counters: Counters::default(),
            }),
            key,
        })
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimiter<S, K>;

    fn layer(&self, inner: S) -> RateLimiter<S, K> {
        RateLimiter::from_parts(inner, Arc::clone(&self.shared), self.key.clone())
    }
}

/// The counters of a rate limiter, shared by every service of its layer, for metrics.
#[derive(Debug, Clone)]
pub struct RateLimitStats {
    shared: Arc<Shared>,
}

/// The counters of a rate limiter at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RateLimitSnapshot {
    /// Calls let through (at once, after a wait, or unlimited on a store error in
    /// `allow` mode).
    pub admitted: u64,
    /// Calls that waited for their turn (counted in `admitted` when they start).
    pub waited: u64,
    /// Calls rejected with `RATE_LIMITED`.
    pub rejected: u64,
    /// Store failures (each handled by `on_store_error`).
    pub store_errors: u64,
}

impl RateLimitStats {
    /// The counters now.
    #[must_use]
    pub fn snapshot(&self) -> RateLimitSnapshot {
        let c = &self.shared.counters;
        RateLimitSnapshot {
            admitted: c.admitted.get(),
            waited: c.waited.get(),
            rejected: c.rejected.get(),
            store_errors: c.store_errors.get(),
        }
    }

    /// The rate enforced.
    #[must_use]
    pub fn limit(&self) -> RateLimit {
        self.shared.limit
    }
}
