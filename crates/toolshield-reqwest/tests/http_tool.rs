//! `http_tool`: the whole default stack over reqwest, derived idempotency keys included.

mod support;

use serde_json::json;
use toolshield::config::ShieldConfig;
use toolshield::shield::Shield;
use toolshield_core::ErrorKind;
use toolshield_http::http_tool_request;
use tower::ServiceExt;

fn shield() -> Shield {
    let cfg = ShieldConfig::from_toml_str(
        r#"
        [defaults.retry]
        max_attempts = 3
        backoff = { strategy = "none" }
        "#,
    )
    .unwrap();
    Shield::from_config(cfg).unwrap()
}

fn tool() -> toolshield_reqwest::ReqwestTool {
    toolshield_reqwest::http_tool(reqwest::Client::new().into())
}

#[tokio::test]
async fn a_keyless_post_is_retried_under_one_derived_key_the_server_sees() {
    let (addr, rec) = support::start().await;
    let err = shield()
        .wrap("api", tool())
        .oneshot(http_tool_request(
            "api",
            json!({"method": "POST", "url": format!("http://{addr}/post503"), "body": {"n": 1}}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UpstreamUnavailable);
    let keys = rec.keys("/post503");
    assert_eq!(keys.len(), 3, "a 503 is retried: {keys:?}");
    assert_eq!(keys[0].len(), 1, "one Idempotency-Key header: {keys:?}");
    assert!(!keys[0][0].trim().is_empty());
    assert!(
        keys.iter().all(|k| k == &keys[0]),
        "the same key on every attempt: {keys:?}"
    );
}

#[tokio::test]
async fn two_503s_then_a_200_and_a_429_become_a_tool_result() {
    let (addr, _rec) = support::start().await;
    let api = shield().wrap("api", tool());
    let res = api
        .clone()
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/flaky")}),
        ))
        .await
        .unwrap();
    assert_eq!(res.output["status"], 200);
    assert_eq!(res.output["body"], "recovered");
    assert_eq!(res.provenance.attempts, 3);

    // A Retry-After longer than the stack waits (60 s by default): RATE_LIMITED at once.
    let err = api
        .oneshot(http_tool_request(
            "api",
            json!({"url": format!("http://{addr}/limited-long-date")}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    let wait = err.retry_after().expect("the wait the server asked for");
    assert!(wait.as_secs() > 100 && wait.as_secs() <= 120, "{wait:?}");
}
