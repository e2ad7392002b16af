//! The "Use it" example of README.md, kept compiling and passing.

use serde_json::json;
use toolshield::prelude::*;
use tower::{service_fn, ServiceExt};

#[tokio::test]
async fn readme_use_it_example() -> Result<(), Box<dyn std::error::Error>> {
    let config = ShieldConfig::from_toml_str(
        r#"
        [defaults]
        timeout = { attempt = "10s", soft = "2s", total = "30s" }

        [tools.weather]
        kind = "read_only"
        cache = { ttl = "5m" }

        [tools.pay]
        kind = "mutating"
    "#,
    )?;
    let shield = Shield::from_config(config)?;

    let weather = service_fn(|req: ToolRequest| async move {
        Ok::<_, ToolError>(ToolResponse::new(
            json!({"city": req.payload()["city"], "temp": 21}),
        ))
    });
    let router = shield.router().tool("weather", weather).build()?;

    let req = ToolRequest::new("weather", json!({"city": "Paris"}))
        .kind(CallKind::ReadOnly)
        .caller("agent-7");
    let result: ToolResult = router.oneshot(req).await.into(); // never throws
    let text = serde_json::to_string(&result)?;
    assert!(result.is_success(), "{text}");
    assert_eq!(result.data, Some(json!({"city": "Paris", "temp": 21})));
    Ok(())
}
