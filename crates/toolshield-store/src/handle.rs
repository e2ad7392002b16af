//! [`StoreHandle`], [`store_handle!`](crate::store_handle) and
//! [`counters!`](crate::counters): the handle and the counters every store-backed layer
//! (the cache, idempotency) shares.

use std::fmt;
use std::sync::Arc;

/// The state every clone of a store-backed layer shares (its store, its counters, its
/// policy), as its [`StoreHandle`] reads it.
pub trait LayerState: Send + Sync + 'static {
    /// A snapshot of the layer's counters.
    type Counts: fmt::Debug + Copy;

    /// The counters now.
    fn counts(&self) -> Self::Counts;
}

/// A handle on the state of a store-backed layer: what its layer, its services and the
/// handle itself share behind one `Arc`. Cheap to clone; every clone sees the same
/// counters. Each layer wraps it in its own handle type ([`store_handle!`](crate::store_handle)),
/// which adds what only that layer does (invalidation, `forget`).
///
/// ```
/// use std::sync::Arc;
/// use toolshield_store::{counters, LayerState, StoreHandle};
///
/// counters! {
///     /// The counters of a layer.
///     pub(crate) struct Counters;
///     /// A snapshot of them.
///     pub struct Counts {
///         /// Answers served.
///         hits,
///         /// Calls let through.
///         misses,
///     }
/// }
///
/// #[derive(Default)]
/// struct State {
///     counters: Counters,
/// }
///
/// impl LayerState for State {
///     type Counts = Counts;
///     fn counts(&self) -> Counts {
///         self.counters.snapshot()
///     }
/// }
///
/// toolshield_store::store_handle! {
///     /// The handle of my layer.
///     pub struct MyHandle(State) -> Counts;
/// }
///
/// let state = Arc::new(State::default());
/// let handle = MyHandle(StoreHandle::new(Arc::clone(&state)));
/// state.counters.hits.bump();
/// assert_eq!(handle.clone().counts().hits, 1);
/// assert_eq!(handle.counts().misses, 0);
/// assert!(format!("{handle:?}").starts_with("MyHandle { counts: Counts { hits: 1"));
/// ```
pub struct StoreHandle<T> {
    state: Arc<T>,
}

impl<T> StoreHandle<T> {
    /// A handle on `state`.
    pub fn new(state: Arc<T>) -> Self {
        StoreHandle { state }
    }

    /// The shared state.
    pub fn state(&self) -> &Arc<T> {
        &self.state
    }
}

impl<T: LayerState> StoreHandle<T> {
    /// The counters now.
    pub fn counts(&self) -> T::Counts {
        self.state.counts()
    }
}

impl<T> Clone for StoreHandle<T> {
    fn clone(&self) -> Self {
        StoreHandle {
            state: Arc::clone(&self.state),
        }
    }
}

impl<T: LayerState> fmt::Debug for StoreHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreHandle")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// Declares a layer's handle type: a newtype over a [`StoreHandle`] of the layer's state
/// (`Clone`, `Debug` showing the counts, and `counts()`), to which the layer adds its
/// own methods. The state implements [`LayerState`]. See [`StoreHandle`] for an example.
#[macro_export]
macro_rules! store_handle {
    (
        $(#[$meta:meta])*
        $vis:vis struct $Handle:ident($State:ty) -> $Counts:ty;
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        $vis struct $Handle(pub(crate) $crate::StoreHandle<$State>);

        impl ::std::fmt::Debug for $Handle {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($Handle))
                    .field("counts", &self.0.counts())
                    .finish_non_exhaustive()
            }
        }

        impl $Handle {
            /// The counters now.
            pub fn counts(&self) -> $Counts {
                self.0.counts()
            }
        }
    };
}

/// Declares a layer's event counters once: the shared cells (a struct of
/// [`Counter`](crate::Counter)s, `Default`, with `snapshot()`) and the public snapshot
/// (a `Copy` struct of `u64`s, `#[non_exhaustive]`), each field documented once for both.
///
/// ```
/// toolshield_store::counters! {
///     /// The cells.
///     pub(crate) struct Cells;
///     /// The snapshot.
///     pub struct Snapshot {
///         /// Replays served.
///         replays,
///     }
/// }
///
/// let cells = Cells::default();
/// cells.replays.bump();
/// let now: Snapshot = cells.snapshot();
/// assert_eq!(now.replays, 1);
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$cells_meta:meta])*
        $cells_vis:vis struct $Cells:ident;
        $(#[$counts_meta:meta])*
        $counts_vis:vis struct $Counts:ident {
            $( $(#[$field_meta:meta])* $field:ident, )+
        }
    ) => {
        $(#[$cells_meta])*
        #[derive(Debug, Default)]
        $cells_vis struct $Cells {
            $( $(#[$field_meta])* $cells_vis $field: $crate::Counter, )+
        }

        impl $Cells {
            /// The counts now.
            $cells_vis fn snapshot(&self) -> $Counts {
                $Counts { $( $field: self.$field.get(), )+ }
            }
        }

        $(#[$counts_meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        $counts_vis struct $Counts {
            $( $(#[$field_meta])* pub $field: u64, )+
        }
    };
}
