//! The `toolshield` CLI end to end against a running server: status table, JSON, force
//! open, reset, and clear errors with a non-zero exit code.

mod support;

use serde_json::json;
use toolshield::cli::{run_with, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE};
use toolshield_axum::ShieldRouter;
use toolshield_breaker::{BreakerRegistry, CircuitState};

use support::serve;

const TOKEN: &str = "cli-token";

async fn cli(args: &[&str]) -> (i32, String, String) {
    let mut argv = vec!["toolshield".to_owned()];
    argv.extend(args.iter().map(|s| (*s).to_owned()));
    tokio::task::spawn_blocking(move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_with(argv, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_open_reset_and_errors() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    registry.reset("search");
    let addr = serve(
        ShieldRouter::new()
            .breakers(registry.clone())
            .admin_token(TOKEN)
            .build(),
    )
    .await;
    let url = format!("http://{addr}");

    // Status table.
    let (code, out, err) = cli(&["breakers", "status", "--url", &url, "--token", TOKEN]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("STATE"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("search") && lines[1].contains("closed"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("weather") && lines[2].contains("closed"),
        "{out}"
    );

    // Force open.
    let (code, out, err) = cli(&[
        "breakers", "open", "weather", "--url", &url, "--token", TOKEN,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("open: weather") && out.contains("forced_open"),
        "{out}"
    );
    assert_eq!(registry.state("weather"), CircuitState::ForcedOpen);

    // JSON status of one key.
    let (code, out, _) = cli(&[
        "--json", "breakers", "status", "weather", "--url", &url, "--token", TOKEN,
    ])
    .await;
    assert_eq!(code, 0);
    let body: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(body["key"], "weather");
    assert_eq!(body["breakers"][0]["registry"], "default");
    assert_eq!(body["breakers"][0]["state"], "forced_open");

    // Reset all.
    let (code, out, _) = cli(&[
        "breakers", "reset", "all", "--url", &url, "--token", TOKEN, "--json",
    ])
    .await;
    assert_eq!(code, 0);
    let body: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(body["action"], "reset");
    assert_eq!(body["key"], "all");
    assert_eq!(registry.state("weather"), CircuitState::Closed);
    let states: Vec<&str> = body["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["closed", "closed"]);
    let _ = json!(null);

    // Wrong token: exit 1, says why.
    let (code, out, err) = cli(&["breakers", "status", "--url", &url, "--token", "nope"]).await;
    assert_eq!(code, EXIT_FAILED);
    assert!(out.is_empty());
    assert!(err.contains("unauthorized"), "{err}");

    // Unknown key: exit 1 with the server's message.
    let (code, _, err) = cli(&[
        "breakers", "status", "ghost", "--url", &url, "--token", TOKEN,
    ])
    .await;
    assert_eq!(code, EXIT_FAILED);
    assert!(err.contains("404") && err.contains("no breaker"), "{err}");

    // Nothing listens there: exit 3, says where.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (code, _, err) = cli(&[
        "breakers",
        "status",
        "--url",
        &format!("http://{dead}"),
        "--token",
        TOKEN,
    ])
    .await;
    assert_eq!(code, EXIT_UNREACHABLE);
    assert!(
        err.contains("cannot reach the admin API") && err.contains(&dead.to_string()),
        "{err}"
    );

    // Usage errors: exit 2.
    let (code, _, err) = cli(&["breakers", "open", "--url", &url, "--token", TOKEN]).await;
    assert_eq!(code, EXIT_USAGE, "{err}");
    let (code, _, err) = cli(&["breakers", "status", "--url", "ftp://x", "--token", TOKEN]).await;
    assert_eq!(code, EXIT_USAGE);
    assert!(err.contains("invalid --url"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_in_the_key_exits_non_zero_and_creates_nothing() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    let addr = serve(
        ShieldRouter::new()
            .breakers(registry.clone())
            .admin_token(TOKEN)
            .build(),
    )
    .await;
    let url = format!("http://{addr}");

    for verb in ["open", "close", "metrics-only", "reset"] {
        let (code, out, err) =
            cli(&["breakers", verb, "wether", "--url", &url, "--token", TOKEN]).await;
        assert_eq!(code, EXIT_FAILED, "{verb}: {out}{err}");
        assert!(
            err.contains("404") && err.contains("no breaker") && err.contains("--create"),
            "{verb}: {err}"
        );
    }
    assert!(registry.status("wether").is_none());
    assert_eq!(registry.len(), 1);

    // Pre-opening a key not seen yet is explicit.
    let (code, out, err) = cli(&[
        "breakers", "open", "payments", "--create", "--url", &url, "--token", TOKEN,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("open: payments") && out.contains("created"),
        "{out}"
    );
    assert_eq!(registry.state("payments"), CircuitState::ForcedOpen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_does_not_confirm_the_action_is_a_failure() {
    use axum::routing::{get, post};
    // A server that answers 200 to everything without doing anything: a proxy's
    // catch-all, an old version, a different service on that port.
    let addr = serve(
        axum::Router::new()
            .route("/admin/breakers", get(|| async { axum::Json(json!({})) }))
            .route(
                "/admin/breakers/{key}",
                get(|| async { axum::Json(json!({})) }),
            )
            .route(
                "/admin/breakers/{key}/{action}",
                post(|| async { axum::Json(json!({})) }),
            ),
    )
    .await;
    let url = format!("http://{addr}");
    for args in [
        &["breakers", "open", "weather"][..],
        &["breakers", "reset", "all"][..],
        &["breakers", "status", "weather"][..],
        &["breakers", "status"][..],
    ] {
        let mut argv = args.to_vec();
        argv.extend(["--url", &url, "--token", TOKEN]);
        let (code, out, err) = cli(&argv).await;
        assert_eq!(code, EXIT_FAILED, "{args:?}: {out}{err}");
        assert!(err.contains("did not confirm"), "{args:?}: {err}");
    }

    // An answer for another action or another key is not a confirmation either.
    let addr = serve(axum::Router::new().route(
        "/admin/breakers/{key}/{action}",
        post(|| async {
            axum::Json(json!({
                "key": "search", "action": "reset", "created": false,
                "breakers": [{"registry": "default", "key": "search", "state": "closed"}]
            }))
        }),
    ))
    .await;
    let url = format!("http://{addr}");
    let (code, _, err) = cli(&[
        "breakers", "open", "weather", "--url", &url, "--token", TOKEN,
    ])
    .await;
    assert_eq!(code, EXIT_FAILED);
    assert!(err.contains("did not confirm"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_usage_errors_never_taken_for_an_unreachable_server() {
    let registry = BreakerRegistry::default();
    registry.reset("weather");
    registry.reset(".");
    registry.reset("..");
    let addr = serve(
        ShieldRouter::new()
            .breakers(registry.clone())
            .admin_token(TOKEN)
            .build(),
    )
    .await;
    let url = format!("http://{addr}");
    // Surrounding whitespace is not part of the token (a secret read from a file).
    let (code, _, err) = cli(&[
        "breakers",
        "status",
        "--url",
        &url,
        "--token",
        " cli-token\n",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    // A token that cannot be sent in a header (a control character inside it).
    for token in ["cli\ntoken", "cli\u{7}token", "cli\rtoken"] {
        let (code, _, err) = cli(&["breakers", "status", "--url", &url, "--token", token]).await;
        assert_eq!(code, EXIT_USAGE, "token {token:?}: {err}");
        assert!(err.contains("token"), "{err}");
        assert!(!err.contains("cannot reach"), "{err}");
        assert!(
            !err.contains(token.trim()),
            "the token is not echoed: {err}"
        );
    }
    // An empty key names no breaker and no route.
    for args in [
        &["breakers", "status", ""][..],
        &["breakers", "open", ""][..],
        &["breakers", "reset", "", "--create"][..],
    ] {
        let mut argv = args.to_vec();
        argv.extend(["--url", &url, "--token", TOKEN]);
        let (code, _, err) = cli(&argv).await;
        assert_eq!(code, EXIT_USAGE, "{args:?}: {err}");
        assert!(err.contains("key"), "{err}");
    }
    // Keys that are dot segments reach their own breaker, not another route.
    for key in [".", ".."] {
        let (code, out, err) =
            cli(&["breakers", "open", key, "--url", &url, "--token", TOKEN]).await;
        assert_eq!(code, 0, "{key}: {err}");
        assert!(out.contains("forced_open"), "{out}");
        assert_eq!(registry.state(key), CircuitState::ForcedOpen);
    }
    assert_eq!(registry.state("weather"), CircuitState::Closed);
}
