use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use toolshield_contract::config::MAX_DURATION;
use toolshield_contract::{ConfigError, ShieldRequest};
use tower_layer::Layer;

use crate::config::{BulkheadConfig, BulkheadKey, MAX_CONCURRENT, MAX_QUEUE};
use crate::gate::{Counters, Gates, Limits};
use crate::service::Bulkhead;
use toolshield_contract::key::{ByCaller, ByName, ByRun, KeyFn};

/// What every service of a layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) limits: Limits,
    pub(crate) gates: Gates,
    pub(crate) counters: Arc<Counters>,
}

impl Shared {
    fn new(limits: Limits, max_keys: Option<usize>) -> Arc<Self> {
        let counters = Arc::new(Counters::default());
        let gates = match max_keys {
            None => Gates::one(limits.max_concurrent, Arc::clone(&counters)),
            Some(n) => Gates::keyed(limits.max_concurrent, n, Arc::clone(&counters)),
        };
        Arc::new(Shared {
            limits,
            gates,
            counters,
        })
    }
}

/// The key of a bulkhead with one compartment for the whole layer: never consulted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Whole;

impl<Req> KeyFn<Req> for Whole {
    #[inline]
    fn key<'a>(&'a self, _req: &'a Req) -> Option<std::borrow::Cow<'a, str>> {
        None
    }
}

/// The key a [`BulkheadConfig`] names.
#[derive(Debug, Clone, Copy)]
pub enum ConfiguredKey {
    /// One compartment for the layer.
    Layer,
    /// [`ByName`].
    Tool,
    /// [`ByCaller`].
    Caller,
    /// [`ByRun`].
    Run,
}

impl<Req: ShieldRequest> KeyFn<Req> for ConfiguredKey {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<std::borrow::Cow<'a, str>> {
        match self {
            ConfiguredKey::Layer => None,
            ConfiguredKey::Tool => ByName.key(req),
            ConfiguredKey::Caller => ByCaller.key(req),
            ConfiguredKey::Run => ByRun.key(req),
        }
    }
}

/// Limits the calls in flight through the services it builds; see [`Bulkhead`].
///
/// Every service built from one layer (and every clone of them) shares the same
/// compartments: build one layer per tool stack.
#[derive(Debug, Clone)]
pub struct BulkheadLayer<K = Whole> {
    shared: Arc<Shared>,
    key: K,
}

impl BulkheadLayer<Whole> {
    /// At most `max_concurrent` calls in flight (at least 1, at most
    /// [`MAX_CONCURRENT`]); a call beyond that is rejected at once with `OVERLOADED`.
    #[must_use]
    pub fn new(max_concurrent: usize) -> Self {
        BulkheadLayer {
            shared: Shared::new(
                Limits {
                    max_concurrent: max_concurrent.clamp(1, MAX_CONCURRENT),
                    max_queue: 0,
                    queue_timeout: Duration::ZERO,
                },
                None,
            ),
            key: Whole,
        }
    }
}

impl<K> BulkheadLayer<K> {
    /// Lets up to `max_queue` calls (per key, at most [`MAX_QUEUE`]) wait for a slot in
    /// FIFO order, each for at most `timeout` (clamped to
    /// [`MAX_DURATION`]) and never past its deadline. Starts fresh compartments: call it
    /// before building services.
    #[must_use]
    pub fn with_queue(self, max_queue: usize, timeout: Duration) -> Self {
        let limits = Limits {
            max_queue: max_queue.min(MAX_QUEUE),
            queue_timeout: timeout.min(MAX_DURATION),
            ..self.shared.limits
        };
        let max_keys = self.max_keys();
        BulkheadLayer {
            shared: Shared::new(limits, max_keys),
            key: self.key,
        }
    }

    /// One compartment per key that `key` picks (each with the full limit and queue),
    /// holding at most `max_keys` keys (from 1 to
    /// [`MAX_KEYS`](toolshield_contract::config::MAX_KEYS)): idle keys are evicted to make room,
    /// and a new key is rejected with `OVERLOADED` while every held key is busy. Keys
    /// longer than 4 KiB are not held: they share one overflow compartment. Starts fresh
    /// compartments: call it before building services.
    #[must_use]
    pub fn keyed<K2>(self, key: K2, max_keys: usize) -> BulkheadLayer<K2> {
        BulkheadLayer {
            shared: Shared::new(self.shared.limits, Some(max_keys)),
            key,
        }
    }

    fn max_keys(&self) -> Option<usize> {
        match &self.shared.gates {
            Gates::One(_) => None,
            Gates::Keyed(k) => Some(k.max_keys()),
        }
    }

    /// A handle on the counters every service of this layer shares.
    #[must_use]
    pub fn stats(&self) -> BulkheadStats {
        BulkheadStats {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl BulkheadLayer<ConfiguredKey> {
    /// The bulkhead a validated config describes.
    pub fn from_config(cfg: &BulkheadConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let key = match cfg.key {
            BulkheadKey::Layer => ConfiguredKey::Layer,
            BulkheadKey::Tool => ConfiguredKey::Tool,
            BulkheadKey::Caller => ConfiguredKey::Caller,
            BulkheadKey::Run => ConfiguredKey::Run,
        };
        let limits = Limits {
            max_concurrent: cfg.max_concurrent,
            max_queue: cfg.max_queue,
            queue_timeout: cfg.queue_timeout,
        };
        let max_keys = (cfg.key != BulkheadKey::Layer).then_some(cfg.max_keys);
        Ok(BulkheadLayer {
            shared: Shared::new(limits, max_keys),
            key,
        })
    }
}

impl<S, K: Clone> Layer<S> for BulkheadLayer<K> {
    type Service = Bulkhead<S, K>;

    fn layer(&self, inner: S) -> Bulkhead<S, K> {
        Bulkhead::from_parts(inner, Arc::clone(&self.shared), self.key.clone())
    }
}

/// The counters of a bulkhead, shared by every service of its layer, for metrics.
#[derive(Debug, Clone)]
pub struct BulkheadStats {
    shared: Arc<Shared>,
}

/// The counters of a bulkhead at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BulkheadSnapshot {
    /// Calls given a slot (at once or after waiting), since the layer was built.
    pub admitted: u64,
    /// Calls rejected with `OVERLOADED` (full, queue full, queue timeout, too many keys).
    pub rejected: u64,
    /// Calls holding a slot now.
    pub in_flight: usize,
    /// Calls waiting in a queue now.
    pub queued: usize,
    /// Keys held now (0 for a bulkhead with one compartment).
    pub keys: usize,
}

impl BulkheadStats {
    /// The counters now.
    #[must_use]
    pub fn snapshot(&self) -> BulkheadSnapshot {
        let c = &self.shared.counters;
        BulkheadSnapshot {
            admitted: c.admitted.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            keys: match &self.shared.gates {
                Gates::One(_) => 0,
                Gates::Keyed(k) => k.len(),
            },
        }
    }

    /// The most calls in flight per key.
    #[must_use]
    pub fn max_concurrent(&self) -> usize {
        self.shared.limits.max_concurrent
    }

    /// The most keys held at once; `None` for a bulkhead with one compartment.
    #[must_use]
    pub fn max_keys(&self) -> Option<usize> {
        match &self.shared.gates {
            Gates::One(_) => None,
            Gates::Keyed(k) => Some(k.max_keys()),
        }
    }
}
