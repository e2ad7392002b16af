//! Each retry emits one `tracing` event with tool, attempt, wait and error code, and never
//! the payload.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{err, ok};
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolRequest};
use toolshield_retry::{BackoffStrategy, RetryLayer};
use toolshield_test::ScriptedTool;
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = Vec<(String, String)>;

#[derive(Clone, Default)]
struct Capture {
    events: Arc<Mutex<Vec<(String, Fields)>>>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value.to_string()));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Visitor(&mut fields));
        self.events
            .lock()
            .unwrap()
            .push((event.metadata().target().to_owned(), fields));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test(start_paused = true)]
async fn each_retry_emits_an_event_without_the_payload() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());

    let tool = ScriptedTool::new([
        err(ErrorKind::Timeout),
        err(ErrorKind::UpstreamUnavailable),
        ok(),
    ]);
    let layer = RetryLayer::default().with_backoff(BackoffStrategy::fixed_range(
        Duration::from_millis(250),
        Duration::from_millis(250),
    ));
    let req =
        ToolRequest::new("weather", json!({"secret": "s3cr3t-value"})).kind(CallKind::ReadOnly);
    layer.layer(tool.service()).oneshot(req).await.unwrap();

    let events = capture.events.lock().unwrap().clone();
    let retries: Vec<_> = events
        .iter()
        .filter(|(target, _)| target == "toolshield::retry")
        .map(|(_, f)| f.clone())
        .collect();
    assert_eq!(retries.len(), 2, "{events:?}");
    let get = |f: &Fields, k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get(&retries[0], "tool").as_deref(), Some("weather"));
    assert_eq!(get(&retries[0], "attempt").as_deref(), Some("1"));
    assert_eq!(get(&retries[0], "wait_ms").as_deref(), Some("250"));
    assert_eq!(get(&retries[0], "code").as_deref(), Some("TIMEOUT"));
    assert_eq!(get(&retries[1], "attempt").as_deref(), Some("2"));
    assert_eq!(
        get(&retries[1], "code").as_deref(),
        Some("UPSTREAM_UNAVAILABLE")
    );
    for (_, fields) in &events {
        for (_, v) in fields {
            assert!(!v.contains("s3cr3t"), "payload leaked into an event: {v}");
        }
    }
}
