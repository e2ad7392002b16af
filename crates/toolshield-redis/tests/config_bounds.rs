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
