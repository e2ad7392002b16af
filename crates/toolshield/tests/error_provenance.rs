//! A failed call's envelope names the tool and its source, as a successful one does.

use serde_json::json;
use toolshield::prelude::*;
use toolshield::provenance::ProvenanceLayer;
use toolshield_core::ToolService;
use tower::{service_fn, ServiceExt};

fn failing() -> impl ToolService {
    service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(
            ErrorKind::UpstreamUnavailable,
            "503 from the api",
        ))
    })
}

#[tokio::test(start_paused = true)]
async fn an_error_result_names_its_tool_and_source() {
    let config = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        retry = { max_attempts = 2, backoff = { strategy = "none" } }
        breaker = { consecutive_failures = 2, open_wait = "30s" }
        [tools.weather]
        kind = "read_only"
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shield = Shield::from_config(config)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_provenance(ProvenanceLayer::new().source_for("weather", "api.weather.example"));
    let router = shield
        .router()
        .tool("weather", failing())
        .tool("search", failing())
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let call = |tool: &str| {
        router
            .clone()
            .oneshot(ToolRequest::new(tool, json!({})).kind(CallKind::ReadOnly))
    };

    // Retries exhausted: the tool ran twice.
    let err = call("weather").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    let result = ToolResult::from(err);
    let p = result.provenance.expect("an error's provenance");
    assert_eq!(p.tool.as_deref(), Some("weather"));
    assert_eq!(p.source.as_deref(), Some("api.weather.example"));
    assert_eq!(p.attempts, 2);

    // Rejected by the open breaker, the tool never ran: still named.
    let err = call("weather").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    let json = serde_json::to_value(ToolResult::from(err)).expect("json");
    assert_eq!(json["status"], "circuit_open");
    assert_eq!(json["provenance"]["tool"], "weather");
    assert_eq!(json["provenance"]["source"], "api.weather.example");

    // Without a source of its own, the source is the tool, as on success.
    let err = call("search").await.unwrap_err();
    let p = ToolResult::from(err).provenance.expect("provenance");
    assert_eq!(p.tool.as_deref(), Some("search"));
    assert_eq!(p.source.as_deref(), Some("search"));

    // Cancelled before the first attempt: named, zero attempts.
    let token = CancellationToken::new();
    token.cancel();
    let err = router
        .clone()
        .oneshot(
            ToolRequest::new("search", json!({}))
                .kind(CallKind::ReadOnly)
                .cancel_token(token),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    let p = ToolResult::from(err).provenance.expect("provenance");
    assert_eq!(p.tool.as_deref(), Some("search"));
    assert_eq!(p.attempts, 0);
}
