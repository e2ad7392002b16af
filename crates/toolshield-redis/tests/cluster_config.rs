//! `RedisConfig` for a cluster: seed nodes, checked at once with every problem listed.

use toolshield_redis::{RedisConfig, RedisConnection};

fn fields(config: &RedisConfig) -> Vec<String> {
    match config.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.problems().iter().map(|p| p.field.clone()).collect(),
    }
}

#[test]
fn cluster_seeds_must_be_tcp_urls_to_database_zero_and_exclude_a_url() {
    let ok = RedisConfig::cluster(["redis://10.0.0.1:7000", "redis://u:p@10.0.0.2:7000"]);
    assert!(ok.is_cluster());
    assert_eq!(fields(&ok), Vec::<String>::new());

    let bad = RedisConfig {
        url: "redis://elsewhere:6379".into(),
        ..RedisConfig::cluster([
            "redis://10.0.0.1:7000",
            "not a url",
            "redis+unix:///tmp/redis.sock",
            "redis://10.0.0.3:7000/2",
        ])
    };
    assert_eq!(
        fields(&bad),
        [
            "url",
            "cluster_nodes[1]",
            "cluster_nodes[2]",
            "cluster_nodes[3]"
        ]
    );
    assert!(!RedisConfig::default().is_cluster());
}

#[test]
fn cluster_nodes_come_from_serde_and_unknown_fields_are_refused() {
    let cfg: RedisConfig =
        serde_json::from_str(r#"{"cluster_nodes": ["redis://127.0.0.1:7000"]}"#).unwrap();
    assert_eq!(cfg.cluster_nodes, ["redis://127.0.0.1:7000"]);
    assert!(serde_json::from_str::<RedisConfig>(r#"{"cluster": ["redis://x:1"]}"#).is_err());
}

#[tokio::test]
async fn a_lazy_cluster_connection_to_nowhere_fails_within_the_operation_timeout() {
    use std::time::{Duration, Instant};
    // A port nothing listens on: bind, read the port, drop the listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = RedisConfig::cluster([format!("redis://127.0.0.1:{port}")])
        .with_op_timeout(Duration::from_millis(200));
    let conn = RedisConnection::connect_lazy(config).expect("lazy: nothing is reached yet");
    assert!(conn.is_cluster());
    let started = Instant::now();
    assert!(conn.health().await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
