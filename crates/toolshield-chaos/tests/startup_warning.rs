//! Building an active fault-injection layer logs a warning, so fault injection cannot be
//! left on unnoticed.
//!
//! Alone in its test binary: `tracing` caches whether a callsite is enabled, process-wide,
//! and a layer built on another test thread with no subscriber can race this test's scoped
//! subscriber for that decision. With one test in the process there is no other thread.

use toolshield_chaos::{ChaosConfig, ChaosLayer, HangFault};

#[test]
fn building_an_active_layer_logs_a_warning() {
    let logs = toolshield_test::LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let cfg = ChaosConfig {
        enabled: true,
        seed: Some(77),
        hang: Some(HangFault { rate: 0.01 }),
        ..ChaosConfig::default()
    };
    tracing::subscriber::with_default(subscriber, || {
        let layer = ChaosLayer::from_config("weather", &cfg);
        assert!(matches!(layer, Ok(Some(_))), "an active layer is built");
    });
    let text = logs.text();
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("fault injection is ON"), "{text}");
    assert!(
        text.contains("tool=\"weather\"") || text.contains("tool=weather"),
        "{text}"
    );
    assert!(text.contains("seed=77"), "{text}");
}
