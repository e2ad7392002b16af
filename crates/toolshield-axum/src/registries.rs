//! [`BreakerRegistries`]: every breaker registry the operations router reports and
//! controls, each under a name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use toolshield_breaker::BreakerRegistry;

/// The name of the registry of [`BreakerRegistries::from`]`(BreakerRegistry)`, and the
/// registry a key that names no registry is created in (`?create=true`). It is the name
/// the `toolshield` facade gives the registry shared by every tool on the default
/// breaker settings.
pub const DEFAULT_REGISTRY: &str = "default";

/// Every breaker registry of a stack, each under a name: what
/// [`ShieldRouter::breakers`](crate::ShieldRouter::breakers) takes, in one call.
///
/// A shield built from a configuration has one registry per group of tools with the same
/// breaker settings (`default`, and one named after each tool with settings of its own);
/// its `breakers()` map converts as is, so `ShieldRouter::new().breakers(shield.breakers())`
/// hands over all of them. A single [`BreakerRegistry`] converts to one registry named
/// [`DEFAULT_REGISTRY`].
///
/// Registries are kept sorted by name. Two registries may share a name (both are kept
/// and reported); [`get`](Self::get) returns the first. Give each registry once: one
/// added twice (under two names) is listed and counted twice.
///
/// ```
/// use std::collections::BTreeMap;
/// use toolshield_axum::{BreakerRegistries, ShieldRouter};
/// use toolshield_breaker::BreakerRegistry;
///
/// let map = BTreeMap::from([
///     ("default".to_owned(), BreakerRegistry::default()),
///     ("weather".to_owned(), BreakerRegistry::default()),
/// ]);
/// let registries = BreakerRegistries::from(&map);
/// assert_eq!(registries.names().collect::<Vec<_>>(), ["default", "weather"]);
/// let router: axum::Router = ShieldRouter::new().breakers(&map).admin_token("t").build();
/// # let _ = router;
/// ```
#[derive(Clone, Default)]
pub struct BreakerRegistries {
    entries: Vec<(Arc<str>, BreakerRegistry)>,
}

impl fmt::Debug for BreakerRegistries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(n, r)| (n, r.len())))
            .finish()
    }
}

impl BreakerRegistries {
    /// No registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `registry` under `name`.
    #[must_use]
    pub fn with(mut self, name: impl Into<Arc<str>>, registry: BreakerRegistry) -> Self {
        self.push(name.into(), registry);
        self
    }

    fn push(&mut self, name: Arc<str>, registry: BreakerRegistry) {
        // After the registries of the same name: the order of addition is kept among them.
        let at = self.entries.partition_point(|(n, _)| **n <= *name);
        self.entries.insert(at, (name, registry));
    }

    /// Adds every registry of `other`.
    pub(crate) fn extend(&mut self, other: BreakerRegistries) {
        for (name, registry) in other.entries {
            self.push(name, registry);
        }
    }

    /// The first registry named `name`.
    pub fn get(&self, name: &str) -> Option<&BreakerRegistry> {
        self.entries
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, r)| r)
    }

    /// Every registry with its name, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BreakerRegistry)> {
        self.entries.iter().map(|(n, r)| (&**n, r))
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| &**n)
    }

    /// How many registries there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl From<BreakerRegistry> for BreakerRegistries {
    /// One registry, named [`DEFAULT_REGISTRY`].
    fn from(registry: BreakerRegistry) -> Self {
        Self::new().with(DEFAULT_REGISTRY, registry)
    }
}

impl From<&BreakerRegistry> for BreakerRegistries {
    /// One registry (a clone of the handle, sharing its breakers), named
    /// [`DEFAULT_REGISTRY`].
    fn from(registry: &BreakerRegistry) -> Self {
        Self::from(registry.clone())
    }
}

impl From<&BTreeMap<String, BreakerRegistry>> for BreakerRegistries {
    /// Every registry of the map under its key (the shape of the facade's
    /// `Shield::breakers()`).
    fn from(map: &BTreeMap<String, BreakerRegistry>) -> Self {
        map.iter().map(|(n, r)| (n.as_str(), r.clone())).collect()
    }
}

impl From<BTreeMap<String, BreakerRegistry>> for BreakerRegistries {
    /// Every registry of the map under its key.
    fn from(map: BTreeMap<String, BreakerRegistry>) -> Self {
        map.into_iter().collect()
    }
}

impl<N: Into<Arc<str>>> FromIterator<(N, BreakerRegistry)> for BreakerRegistries {
    fn from_iter<I: IntoIterator<Item = (N, BreakerRegistry)>>(iter: I) -> Self {
        let mut out = Self::new();
        for (name, registry) in iter {
            out.push(name.into(), registry);
        }
        out
    }
}
