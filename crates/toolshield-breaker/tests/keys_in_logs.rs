//! Keys chosen by a caller (a host, an agent, a tool name behind `server__*`) reach the
//! breaker's `tracing` events: they must not be able to forge a log line.
//!
//! Alone in its test binary: `tracing` caches per call site whether anyone listens, and a
//! test on another thread reaching the same call site with no subscriber could race with
//! this test's subscriber.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolshield_breaker::{key_fn, BreakerConfig, BreakerLayer, CircuitState};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use tower::Layer;

/// The fields of one event, as `(name, value)`.
type EventFields = Vec<(String, String)>;

/// A subscriber that keeps, for every event, the value of each field as a log line would
/// show it: a `Display` field (`%`) verbatim, a `Debug` field (`?`) as `{:?}`.
#[derive(Clone, Default)]
struct Fields(Arc<Mutex<Vec<EventFields>>>);

struct Visitor<'a>(&'a mut EventFields);

impl tracing::field::Visit for Visitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl tracing::Subscriber for Fields {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() != "toolshield::breaker" {
            return;
        }
        let mut fields = Vec::new();
        event.record(&mut Visitor(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn breaks_a_line(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

const FORGED: &str =
    "evil\nINFO toolshield::breaker: circuit breaker transition key=weather\r\u{2028}\u{1b}[2J";

#[test]
fn a_key_with_control_characters_cannot_forge_a_log_line() {
    let fields = Fields::default();
    tracing::subscriber::with_default(fields.clone(), || {
        let layer = BreakerLayer::from_config(&BreakerConfig {
            consecutive_failures: 1,
            open_wait: Duration::from_secs(30),
            ..BreakerConfig::default()
        })
        .unwrap()
        .key_fn(key_fn(|r: &ToolRequest| {
            Cow::Owned(r.payload()["host"].as_str().unwrap_or("-").to_owned())
        }));
        let registry = layer.registry().clone();
        let mut svc = layer.layer(tower::service_fn(|_req: ToolRequest| async {
            Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
        }));
        let request = ToolRequest::new("fetch", json!({ "host": FORGED }));
        let _ = toolshield_test::call_now(&mut svc, request);
        assert_eq!(registry.state(FORGED), CircuitState::Open);
        registry.force_open(FORGED);
        registry.reset_all();
    });
    let events = fields.0.lock().unwrap();
    let keys: Vec<&String> = events
        .iter()
        .flatten()
        .filter(|(name, _)| name == "key")
        .map(|(_, value)| value)
        .collect();
    assert_eq!(keys.len(), 3, "a transition and two overrides: {events:?}");
    for key in keys {
        assert!(
            !key.chars().any(breaks_a_line),
            "a key reaches the log with a control character: {key:?}"
        );
        assert!(
            key.contains("evil"),
            "the key is still recognisable: {key:?}"
        );
    }
}
