//! Tool names are validated where they enter: configuration and route registration.
//! Braces delimit the Redis hash tag of every storage key and control characters reach
//! logs and labels, so neither may appear in a name.

use serde_json::json;
use toolshield::prelude::*;
use toolshield_core::ToolService;
use tower::{service_fn, ServiceExt};

fn echo() -> impl ToolService {
    service_fn(|req: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(json!({ "tool": req.tool() })))
    })
}

#[test]
fn a_config_with_braces_or_control_characters_in_a_tool_name_lists_each() {
    let err = ShieldConfig::from_toml_str(
        r#"
        [tools."a}:b"]
        kind = "read_only"
        [tools."line\nbreak"]
        kind = "read_only"
        [tools.fine]
        kind = "read_only"
        "#,
    )
    .expect_err("rejected");
    let text = err.to_string();
    assert_eq!(err.problems().len(), 2, "{text}");
    assert!(text.contains("a}:b"), "{text}");
    assert!(text.contains("line\\nbreak"), "{text}");
}

#[test]
fn a_router_refuses_bad_and_duplicate_names_and_lists_them_all() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let err = shield
        .router()
        .tool("a}b", echo())
        .tool("ok", echo())
        .tool("ok", echo())
        .tool(" ", echo())
        .server("srv__x", echo())
        .build()
        .expect_err("refused");
    let text = err.to_string();
    assert_eq!(err.problems().len(), 4, "{text}");
    assert!(
        text.contains("a}b") && text.contains("registered twice"),
        "{text}"
    );
    assert!(text.contains("srv__x"), "{text}");
}

#[tokio::test]
async fn a_server_route_does_not_route_a_name_no_route_could_register() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let router = shield
        .router()
        .server("github", echo())
        .build()
        .expect("valid");
    let ok = router
        .clone()
        .oneshot(ToolRequest::new("github__search", json!({})))
        .await
        .expect("routed");
    assert_eq!(ok.output["tool"], "github__search");
    let err = router
        .oneshot(ToolRequest::new("github__x}:y", json!({})))
        .await
        .expect_err("not routed");
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn a_server_route_keeps_a_breaker_per_tool_and_none_under_the_server_name() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let router = shield
        .router()
        .tool("quote", echo())
        .server("github", echo())
        .build()
        .expect("valid");
    let registry = shield.breaker_for("quote");
    // A tool's own route has its breaker from the time it is built.
    assert!(registry.status("quote").is_some());
    router
        .oneshot(ToolRequest::new("github__search", json!({})))
        .await
        .expect("routed");
    assert!(registry.status("github__search").is_some());
    assert!(
        registry.status("github").is_none(),
        "no call is keyed by the server's own name"
    );
}

/// A tool named like the shared registry (`default`) gets the breaker settings of its
/// own section, in a registry of its own, at start and when a reload adds it; the
/// shared registry keeps the defaults.
#[tokio::test]
async fn a_tool_named_like_the_default_registry_gets_its_own_breaker_settings() {
    let toml = r#"
        [defaults]
        retry = { max_attempts = 1 }
        breaker = { consecutive_failures = 50 }
        [tools.default]
        breaker = { consecutive_failures = 1 }
    "#;
    let config = ShieldConfig::from_toml_str(toml).expect("valid");
    let own = config.tools["default"].breaker.clone();
    let defaults = config.defaults.breaker.clone();
    let failing = service_fn(|_req: ToolRequest| async {
        Err::<ToolResponse, _>(ToolError::new(ErrorKind::UpstreamUnavailable, "down"))
    });

    let shield = Shield::from_config(config).expect("shield");
    assert_eq!(shield.breaker_for("default").config(), &own);
    assert_eq!(shield.breaker_for("weather").config(), &defaults);
    assert_eq!(
        shield.breakers()[toolshield::shield::DEFAULT_REGISTRY].config(),
        &defaults,
        "the shared registry keeps the defaults"
    );
    let router = shield
        .router()
        .tool("default", failing)
        .build()
        .expect("valid");
    let first = router
        .clone()
        .oneshot(ToolRequest::new("default", json!({})))
        .await
        .unwrap_err();
    assert_eq!(first.kind(), ErrorKind::UpstreamUnavailable);
    let second = router
        .oneshot(ToolRequest::new("default", json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        second.kind(),
        ErrorKind::CircuitOpen,
        "one failure opens a breaker whose threshold is one"
    );

    // Added by a reload.
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let summary = shield
        .reload(ShieldConfig::from_toml_str(toml).expect("valid"))
        .expect("reload");
    assert_eq!(shield.breaker_for("default").config(), &own);
    assert!(
        !summary.breaker_settings_kept.iter().any(|s| s == "default"),
        "{summary:?}"
    );
    assert_eq!(summary.new_registries.len(), 1, "{summary:?}");
}

/// `other` (the metrics label of unregistered tools), `defaults` (the defaults
/// section's name in reload summaries) and `all` (the admin API's key for every breaker)
/// are refused as route names, as they are as configuration sections: a route under one
/// would share its series, its summary entries or its admin actions with what the
/// reserved name stands for.
#[test]
fn a_router_refuses_the_reserved_names_as_tools_and_servers() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let err = shield
        .router()
        .tool("other", echo())
        .tool("defaults", echo())
        .server("other", echo())
        .server("defaults", echo())
        .tool("all", echo())
        .server("all", echo())
        .tool("fine", echo())
        .build()
        .expect_err("refused");
    let text = err.to_string();
    assert_eq!(err.problems().len(), 6, "{text}");
    assert!(text.contains("reserved"), "{text}");
}

/// The name of an unknown tool is chosen by a model: the `NOT_FOUND` error quotes it on
/// one line and cut, so a name with line breaks or of megabytes reaches no log or
/// message as it came.
#[tokio::test]
async fn an_unknown_tool_is_quoted_on_one_line_and_cut_in_its_not_found_error() {
    let shield = Shield::from_config(ShieldConfig::default()).expect("shield");
    let router = shield
        .router()
        .server("github", echo())
        .build()
        .expect("valid");
    let name = format!("github__x\n\u{1b}[2Jforged log line{}", "y".repeat(100_000));
    let err = router
        .oneshot(ToolRequest::new(name.as_str(), json!({})))
        .await
        .expect_err("not routed");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let message = err.message();
    assert!(!message.chars().any(char::is_control), "{message:?}");
    assert!(message.len() <= 256, "{} bytes", message.len());
    assert!(message.contains("github__x"), "{message:?}");
}
