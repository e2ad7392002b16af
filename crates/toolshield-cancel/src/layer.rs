//! [`CancelLayer`]: applies [`Cancel`].

use tower_layer::Layer;

use crate::service::Cancel;

/// Applies [`Cancel`] to a service. Has no configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct CancelLayer {
    _priv: (),
}

impl CancelLayer {
    /// A new cancellation layer.
    #[must_use]
    pub fn new() -> Self {
        CancelLayer { _priv: () }
    }
}

impl<S> Layer<S> for CancelLayer {
    type Service = Cancel<S>;

    fn layer(&self, inner: S) -> Cancel<S> {
        Cancel::new(inner)
    }
}
