//! The `toolshield` binary (feature `cli`): a clear error and a non-zero exit code when
//! the admin API cannot be reached, and usage errors exit 2.
#![cfg(feature = "cli")]

use std::process::Command;

#[test]
fn binary_reports_an_unreachable_server() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolshield"))
        .args([
            "breakers",
            "status",
            "--url",
            &format!("http://{dead}"),
            "--token",
            "t",
        ])
        .env_remove("TOOLSHIELD_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the admin API"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_toolshield"))
        .args(["breakers", "frobnicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let help = Command::new(env!("CARGO_BIN_EXE_toolshield"))
        .args(["breakers", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("status"));
}
