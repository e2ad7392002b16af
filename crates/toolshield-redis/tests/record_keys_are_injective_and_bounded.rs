//! Idempotency records in Redis under names a model or a remote caller chooses: tool
//! names, callers and keys holding hash-tag braces, glob characters, the encoding's own
//! separators, CR LF and NUL, and keys that differ only in case or Unicode normalisation.
//! Every distinct (tool, caller, key) gets a Redis key of its own, a forget by a key that
//! looks like a pattern clears that one record only, and a name too long to be a key is
//! refused before anything is sent to Redis.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect, prefix, stack};
use serde_json::json;
use toolshield_core::{CallKind, ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_idempotency::{IdempotencyConfig, MAX_CALLER_LEN, MAX_KEY_LEN};
use toolshield_redis::testing::test_redis;
use toolshield_redis::RedisIdempotencyStore;
use tower::{service_fn, ServiceExt};

const TOOLS: [&str; 7] = [
    "pay",
    "pay}:x",
    "{pay}",
    "pay%7D",
    "pa*",
    "pay\r\nDEL x",
    "pay\0",
];
const CALLERS: [Option<&str>; 8] = [
    None,
    Some(""),
    Some("a"),
    Some("a:g:k"),
    Some("{pay}"),
    Some("*"),
    Some("a\r\nb"),
    Some("\0"),
];
const KEYS: [&str; 11] = [
    "k", "K", "k:g:k", "*", "?", "[a-z]", "{x}", "é", "e\u{301}", "k\r\n1", "\0",
];

fn call_of(tool: &str, caller: Option<&str>, key: &str) -> ToolRequest {
    let req = ToolRequest::new(tool, json!({"amount": 1}))
        .kind(CallKind::Mutating)
        .idempotency_key(key);
    match caller {
        Some(c) => req.caller(c),
        None => req,
    }
}

fn numbering_tool(
    runs: &Arc<AtomicUsize>,
) -> impl tower::Service<ToolRequest, Response = ToolResponse, Error = ToolError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    let runs = Arc::clone(runs);
    service_fn(move |_req: ToolRequest| {
        let n = runs.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, ToolError>(ToolResponse::new(json!({ "run": n }))) }
    })
}

/// The hash tag Redis Cluster hashes for `key`: the text between the first `{` and the
/// first `}` after it, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

#[tokio::test]
async fn every_tool_caller_and_key_has_its_own_redis_record_and_hash_tag() {
    let Some(redis) = test_redis("every_tool_caller_and_key_has_its_own_redis_record_and_hash_tag")
    else {
        return;
    };
    let url = redis.url();
    let prefix = prefix();
    let conn = connect(&url, &prefix, Duration::from_secs(2)).await;
    let store = Arc::new(RedisIdempotencyStore::new(conn));
    let runs = Arc::new(AtomicUsize::new(0));
    let (svc, handle) = stack(IdempotencyConfig::default(), store, numbering_tool(&runs));

    // First pass: each triple runs once; second pass: each replays its own answer.
    let mut answers = HashMap::new();
    for tool in TOOLS {
        for caller in CALLERS {
            for key in KEYS {
                let r = svc
                    .clone()
                    .oneshot(call_of(tool, caller, key))
                    .await
                    .unwrap_or_else(|e| panic!("{tool:?} {caller:?} {key:?}: {e}"));
                assert!(
                    !r.provenance.replayed,
                    "{tool:?} {caller:?} {key:?} replayed another's record"
                );
                answers.insert((tool, caller, key), r.output);
            }
        }
    }
    let triples = TOOLS.len() * CALLERS.len() * KEYS.len();
    assert_eq!(runs.load(Ordering::SeqCst), triples, "each triple ran once");
    for ((tool, caller, key), first) in &answers {
        let r = svc
            .clone()
            .oneshot(call_of(tool, *caller, key))
            .await
            .expect("replay");
        assert!(r.provenance.replayed, "{tool:?} {caller:?} {key:?}");
        assert_eq!(
            &r.output, first,
            "{tool:?} {caller:?} {key:?}: its own answer"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), triples, "nothing ran again");

    // In Redis: one record per triple, each hashed by its own tool's tag, one tag per tool.
    let mut raw = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let mut records = BTreeSet::new();
    let mut tags: HashMap<String, BTreeSet<String>> = HashMap::new();
    for (tool, caller, key) in answers.keys() {
        let skey = handle
            .key_for(&call_of(tool, *caller, key))
            .expect("a key")
            .expect("deduped");
        let full = format!("{prefix}{skey}");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&full)
            .query_async(&mut raw)
            .await
            .expect("EXISTS");
        assert_eq!(exists, 1, "{full:?} holds the record");
        let tag = hash_tag(&skey).unwrap_or_else(|| panic!("{skey:?} has no hash tag"));
        assert_eq!(
            hash_tag(&format!("lease:{skey}")),
            Some(tag),
            "record and lease marker share a slot"
        );
        tags.entry(tag.to_owned())
            .or_default()
            .insert((*tool).to_owned());
        records.insert(full);
    }
    assert_eq!(records.len(), triples, "no two triples share a Redis key");
    assert_eq!(tags.len(), TOOLS.len(), "one hash tag per tool: {tags:?}");
    assert!(tags.values().all(|t| t.len() == 1), "{tags:?}");

    // A forget by a key that looks like a glob pattern clears that record only.
    assert!(handle.forget("pay", None, "*").await.expect("forget"));
    assert!(handle.forget("pa*", Some("*"), "?").await.expect("forget"));
    for (tool, caller, key) in answers.keys() {
        let gone = (*tool, *caller, *key) == ("pay", None, "*")
            || (*tool, *caller, *key) == ("pa*", Some("*"), "?");
        let rec = handle.record(tool, *caller, key).await.expect("record");
        assert_eq!(rec.is_none(), gone, "{tool:?} {caller:?} {key:?}");
    }
}

#[tokio::test]
async fn names_too_long_for_a_key_are_refused_before_reaching_redis() {
    let Some(redis) = test_redis("names_too_long_for_a_key_are_refused_before_reaching_redis")
    else {
        return;
    };
    let conn = connect(&redis.url(), &prefix(), Duration::from_secs(2)).await;
    let store = Arc::new(RedisIdempotencyStore::new(conn.clone()));
    let runs = Arc::new(AtomicUsize::new(0));
    let (svc, handle) = stack(IdempotencyConfig::default(), store, numbering_tool(&runs));
    let huge = "x".repeat(1 << 20);
    let before = conn.round_trips();
    let cases = [
        ("a 1 MB key", call_of("pay", Some("alice"), &huge)),
        ("a 1 MB caller", call_of("pay", Some(&huge), "order-1")),
        ("a 1 MB tool name", call_of(&huge, Some("alice"), "order-1")),
        (
            "a 1 MB caller without a key",
            ToolRequest::new("pay", json!({"amount": 1}))
                .kind(CallKind::Mutating)
                .caller(huge.as_str()),
        ),
    ];
    for (what, req) in cases {
        let e = svc.clone().oneshot(req).await.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        assert!(
            e.message().len() < 200,
            "{what}: the message does not echo the name"
        );
    }
    for (what, r) in [
        ("forget a 1 MB key", handle.forget("pay", None, &huge).await),
        (
            "forget for a 1 MB caller",
            handle.forget("pay", Some(&huge), "k").await,
        ),
        (
            "forget of a 1 MB tool",
            handle.forget(&huge, None, "k").await,
        ),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
    }
    let e = handle
        .record("pay", None, &huge)
        .await
        .expect_err("read a 1 MB key");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(conn.round_trips(), before, "nothing was sent to Redis");

    // At the bound, all is accepted.
    let at_bound = "y".repeat(MAX_KEY_LEN);
    svc.clone()
        .oneshot(call_of("pay", Some(&"c".repeat(MAX_CALLER_LEN)), &at_bound))
        .await
        .expect("a key and a caller at the bound are accepted");
}
