//! A transport that closes mid-call, against a real in-process rmcp server: a mutating
//! call's outcome is unknown (never repeated, its key kept); a read-only call stays
//! retriable; a transport closed before the call sent nothing. And server text in
//! errors is bounded.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use rmcp::model::ErrorCode;
use rmcp::ErrorData;
use serde_json::json;
use toolshield::prelude::*;
use toolshield::shield::Shield;
use toolshield_mcp::{map_protocol_error, MAX_MESSAGE};
use tower::ServiceExt;

fn shield() -> Shield {
    Shield::from_config(
        ShieldConfig::from_toml_str(
            r#"
            [defaults]
            retry = { max_attempts = 3, backoff = { strategy = "none" } }
            "#,
        )
        .unwrap(),
    )
    .unwrap()
}

fn order() -> ToolRequest {
    ToolRequest::new("vanish", json!({"item": "book"}))
        .kind(CallKind::Mutating)
        .idempotency_key("order-1")
}

#[tokio::test(start_paused = true)]
async fn a_mutating_call_whose_server_dies_mid_call_is_outcome_unknown_and_runs_once() {
    let (client, seen, _server) = common::start().await;
    let shield = shield();
    let svc = shield.wrap("vanish", client);

    let err = svc.clone().oneshot(order()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(seen.vanish.load(Ordering::SeqCst), 1);

    // The key is kept: the duplicate is answered from the record, not sent.
    let again = svc.oneshot(order()).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::OutcomeUnknown);
    assert_eq!(seen.vanish.load(Ordering::SeqCst), 1, "ran once");
    let record = shield
        .idempotency("vanish")
        .record_for(&order())
        .await
        .unwrap()
        .expect("the key is kept");
    assert_eq!(
        record.error.map(|e| e.kind),
        Some(ErrorKind::OutcomeUnknown)
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_only_call_whose_server_dies_mid_call_stays_retriable() {
    let (client, seen, _server) = common::start().await;
    let err = client
        .oneshot(ToolRequest::new("vanish", json!({})).kind(CallKind::ReadOnly))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
    assert!(err.is_retriable());
    assert_eq!(seen.vanish.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_mutating_call_on_a_transport_closed_before_it_is_connection_failed_and_frees_the_key() {
    let (client, _seen, server) = common::start().await;
    server.abort();
    while !client.peer().is_transport_closed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let shield = shield();
    let err = shield
        .wrap("vanish", client)
        .oneshot(order())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionFailed, "{err}");
    let record = shield
        .idempotency("vanish")
        .record_for(&order())
        .await
        .unwrap();
    assert!(record.is_none(), "nothing was sent: the key is released");
}

#[tokio::test]
async fn a_json_rpc_error_message_of_one_mib_is_cut() {
    let (client, _seen, _server) = common::start().await;
    let err = client
        .oneshot(ToolRequest::new("huge_error", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ExecutionFailed);
    assert!(
        err.message().len() <= MAX_MESSAGE + 64,
        "{} bytes",
        err.message().len()
    );
    assert!(err.message().contains(&"x".repeat(MAX_MESSAGE)));
}

#[test]
fn a_cut_never_splits_a_multibyte_character() {
    // 1 + 2k bytes: byte 512 falls inside an `é`; then 4-byte characters at the cut.
    for message in [
        format!("a{}", "é".repeat(600)),
        format!("ab{}", "😀".repeat(300)),
        "é".repeat(1 << 19),
    ] {
        let err = map_protocol_error(
            "t",
            &ErrorData::new(ErrorCode::INTERNAL_ERROR, message.clone(), None),
        );
        let kept = err
            .message()
            .strip_prefix("mcp tool `t` failed: ")
            .and_then(|m| m.rsplit_once(" ("))
            .map(|(m, _)| m)
            .expect("message shape");
        assert!(kept.len() <= MAX_MESSAGE, "{} bytes", kept.len());
        assert!(kept.len() > MAX_MESSAGE - 4, "{} bytes", kept.len());
        assert!(message.starts_with(kept));
    }
}
