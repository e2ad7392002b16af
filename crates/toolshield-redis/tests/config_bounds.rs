//! Every duration of a Redis configuration is bounded, and reported with the other
//! problems; no connection is built from an unbounded one.

use std::time::Duration;

use toolshield_redis::{RedisConfig, RedisConnection};

#[tokio::test]
async fn validate_reports_unbounded_durations_with_the_other_problems() {
    let cfg: RedisConfig = serde_json::from_str(
        r#"{"url": "http://x", "op_timeout": "300000000000years", "reconnect_max_delay": "300000000000years"}"#,
    )
    .unwrap();
    let cfg = RedisConfig {
        connect_timeout: Duration::MAX,
        health_timeout: Duration::MAX,
        ..cfg
    };
    let err = cfg.validate().unwrap_err();
    let fields: Vec<_> = err.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "url",
            "op_timeout",
            "connect_timeout",
            "health_timeout",
            "reconnect_max_delay"
        ],
        "{err}"
    );
    assert!(
        err.problems()[1]
            .message
            .contains("longer than the longest duration accepted"),
        "{err}"
    );

    let huge_op = RedisConfig::default().with_op_timeout(Duration::MAX);
    assert!(huge_op.validate().is_err());
    assert!(RedisConnection::connect_lazy(huge_op).is_err());
}

/// A Redis operation may take up to `op_timeout`: one that is not shorter than the
/// idempotency lease could let a claim or a renewal outlast the whole lease, so another
/// call takes the key over while the first still runs. Building the layer says so.
#[tokio::test]
async fn an_op_timeout_at_or_above_the_claim_lease_is_a_config_error() {
    use std::sync::Arc;
    use toolshield_idempotency::{IdempotencyConfig, IdempotencyLayer};
    use toolshield_redis::RedisIdempotencyStore;

    let lease = Duration::from_secs(2);
    let config = IdempotencyConfig {
        lease,
        wait_timeout: Duration::from_secs(1),
        ..IdempotencyConfig::default()
    };
    for op_timeout in [lease, lease * 2] {
        let conn = RedisConnection::connect_lazy(
            RedisConfig::from_url("redis://127.0.0.1:1").with_op_timeout(op_timeout),
        )
        .expect("a valid redis config");
        let store = Arc::new(RedisIdempotencyStore::new(conn));
        let err = IdempotencyLayer::with_store(config.clone(), store)
            .expect_err("an op_timeout at or above the lease must be refused");
        let problem = &err.problems()[0];
        assert_eq!(problem.field, "lease", "{err}");
        assert!(problem.message.contains("op_timeout"), "{err}");
    }
    let conn = RedisConnection::connect_lazy(
        RedisConfig::from_url("redis://127.0.0.1:1").with_op_timeout(Duration::from_millis(250)),
    )
    .expect("a valid redis config");
    IdempotencyLayer::with_store(config, Arc::new(RedisIdempotencyStore::new(conn)))
        .expect("an op_timeout well below the lease is fine");
}

/// Deployments share a Redis by key prefix, so no key of one may be a key of another. The
/// lease marker of a record is `lease:` + the record key: with prefixes `P` and
/// `Please:`, the second's records would be the first's markers (and a claim of one would
/// overwrite or read the other's). A prefix that ends with a namespace nested in another
/// key (`lease:`, `breaker:`, `toolshield:rl:`) is refused; any other pair of valid
/// prefixes gives disjoint keys.
#[tokio::test]
async fn two_key_prefixes_never_share_a_key() {
    for bad in ["lease:", "prod:lease:", "prod:breaker:", "toolshield:rl:"] {
        let cfg = RedisConfig::default().with_key_prefix(bad);
        let err = cfg
            .validate()
            .expect_err("a prefix ending with a nested namespace");
        assert_eq!(err.problems()[0].field, "key_prefix", "{bad}: {err}");
        assert!(RedisConnection::connect_lazy(cfg).is_err(), "{bad}");
    }
    for good in [
        "",
        "prod:",
        "staging:",
        "lease",
        "t1-2-3:",
        "app:idemp:",
        "app:cache:",
    ] {
        RedisConfig::default()
            .with_key_prefix(good)
            .validate()
            .unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
}
