//! The hasher of toolshield's in-process maps.
//!
//! Every layer looks something up per call: the breaker by its key, the cache by a
//! `{tool}:{digest}` key, the metrics by tool name, the router by tool name. The standard
//! library's SipHash costs about 20 ns for a tool name and 60 ns for a cache key on the
//! machines the budgets in `docs/benchmarks.md` were set on, and a cache miss hashes its key several
//! times (lookup, insert, single-flight, eviction). These maps use foldhash instead: seeded
//! per process (keys a caller controls cannot be aimed at one bucket without seeing the
//! seed), and a few nanoseconds per key.
//!
//! ```
//! use toolshield_contract::hash::FastHashMap;
//!
//! let mut tools: FastHashMap<&str, u32> = FastHashMap::default();
//! tools.insert("weather", 1);
//! assert_eq!(tools.get("weather"), Some(&1));
//! ```

/// The `BuildHasher` of toolshield's in-process maps (foldhash, seeded per process).
pub type FastState = foldhash::fast::RandomState;

/// A `HashMap` with [`FastState`]; create one with `FastHashMap::default()`.
pub type FastHashMap<K, V> = std::collections::HashMap<K, V, FastState>;
