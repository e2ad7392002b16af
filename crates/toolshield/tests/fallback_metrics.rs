//! The fallback counters of a tool are one set of series, however many times the tool is
//! wrapped (a router rebuilt per agent session): every chain's hand-overs add up in it,
//! and a wrap that is gone leaves nothing behind in the exporter.

use std::sync::Arc;

use serde_json::json;
use toolshield::fallback::FallbackLayer;
use toolshield::metrics::local_prometheus;
use toolshield::prelude::*;
use toolshield_core::ToolService;
use tower::{service_fn, ServiceExt};

fn failing() -> impl ToolService {
    service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    })
}

fn answer() -> impl ToolService {
    service_fn(|_req: ToolRequest| async { Ok::<_, ToolError>(ToolResponse::new(json!("tier"))) })
}

fn shield() -> Shield {
    let cfg = ShieldConfig::from_toml_str(
        "[defaults]\nretry = { max_attempts = 1 }\nbreaker = { consecutive_failures = 1000 }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Shield::from_config(cfg).unwrap_or_else(|e| panic!("{e}"))
}

fn req(i: u64) -> ToolRequest {
    ToolRequest::new("llm", json!({ "i": i })).kind(CallKind::ReadOnly)
}

fn line<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut lines: Vec<_> = text.lines().filter(|l| l.starts_with(prefix)).collect();
    lines.sort_unstable();
    lines
}

#[tokio::test(start_paused = true)]
async fn the_hand_overs_of_every_wrap_of_a_tool_add_up_in_one_series() {
    let exporter = local_prometheus();
    let shield = shield()
        .with_metrics(&exporter)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut routers = Vec::new();
    // Three agent sessions, each with a router and a chain of its own.
    for (session, calls) in [3u64, 2, 4].into_iter().enumerate() {
        let chain = FallbackLayer::new().tier("small", answer());
        let router = shield
            .router()
            .tool_with_fallback("llm", failing(), chain)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..calls {
            let res = router
                .clone()
                .oneshot(req(session as u64 * 100 + i))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(res.provenance.tier.as_deref(), Some("small"));
        }
        routers.push(router);
    }
    let text = exporter.render();
    assert_eq!(
        line(&text, "tool_fallback_handovers_total{"),
        vec![r#"tool_fallback_handovers_total{tool="llm",tier="small"} 9"#],
        "{text}"
    );
    // A session that ends takes none of its hand-overs away: the counter never goes down.
    drop(routers);
    let router = shield
        .router()
        .tool_with_fallback(
            "llm",
            failing(),
            FallbackLayer::new().tier("small", answer()),
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    router
        .oneshot(req(1000))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text = exporter.render();
    assert_eq!(
        line(&text, "tool_fallback_handovers_total{"),
        vec![r#"tool_fallback_handovers_total{tool="llm",tier="small"} 10"#],
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn wrapping_a_tool_many_times_keeps_no_chain_or_collector_per_wrap() {
    let exporter = local_prometheus();
    let shield = shield()
        .with_metrics(&exporter)
        .unwrap_or_else(|e| panic!("{e}"));

    // One chain, cloned into a router rebuilt per session.
    let shared = FallbackLayer::new().tier("small", answer());
    // A chain of its own per session: none may outlive its router.
    let mut per_session = Vec::new();
    for _ in 0..500 {
        let own = FallbackLayer::new().tier("small", answer());
        per_session.push(Arc::downgrade(&own.stats()));
        let router = shield
            .router()
            .tool_with_fallback("llm", failing(), shared.clone())
            .tool_with_fallback("search", failing(), own)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        router
            .oneshot(req(1))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let _ = exporter.render();
    // The test's chain, and at most one reference the shield keeps for its metrics.
    assert!(
        Arc::strong_count(&shared.stats()) <= 3,
        "{} references to one chain's counters after 500 wraps",
        Arc::strong_count(&shared.stats()) - 1
    );
    let alive = per_session.iter().filter(|w| w.strong_count() > 0).count();
    assert!(
        alive <= 1,
        "{alive} chains of routers that are gone are still held"
    );
    let text = exporter.render();
    assert_eq!(
        line(&text, "tool_fallback_handovers_total{"),
        vec![
            r#"tool_fallback_handovers_total{tool="llm",tier="small"} 500"#,
            r#"tool_fallback_handovers_total{tool="search",tier="small"} 0"#,
        ],
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_chain_wrapped_before_the_exporter_was_attached_is_exported() {
    let exporter = local_prometheus();
    let shield = shield();
    let router = shield
        .router()
        .tool_with_fallback(
            "llm",
            failing(),
            FallbackLayer::new().tier("small", answer()),
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let _shield = shield
        .with_metrics(&exporter)
        .unwrap_or_else(|e| panic!("{e}"));
    router
        .oneshot(req(1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text = exporter.render();
    assert!(
        text.contains(r#"tool_fallback_handovers_total{tool="llm",tier="small"} 1"#),
        "{text}"
    );
}
