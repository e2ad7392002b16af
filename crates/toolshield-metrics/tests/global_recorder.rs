//! `install_prometheus` installs the global recorder once: layers built with the
//! exporter's target record into it, the exporter renders what they recorded (drained by
//! the recorder itself, outside any runtime), and a second install fails with a clear
//! error instead of replacing it. Its own test binary: the global recorder is per process.

mod support;

use serde_json::Value;
use toolshield_core::ToolRequest;
use toolshield_metrics::{install_prometheus, DRAIN_EVERY};
use toolshield_test::call_now;

#[test]
fn the_global_recorder_is_installed_once_and_renders_what_layers_record() {
    let exporter = install_prometheus().expect("the first install");
    let second = install_prometheus();
    assert!(
        second.is_err(),
        "a second install must fail, not replace the recorder"
    );

    let mut svc = support::metered(&exporter);
    let req = ToolRequest::new("weather", Value::Null);
    let calls = DRAIN_EVERY + 10;
    for _ in 0..calls {
        call_now(&mut svc, req.clone()).expect("a success");
    }
    assert!(!exporter.upkeep_running(), "no runtime, no upkeep task");

    let text = exporter.render();
    support::parse(&text).expect("valid exposition");
    assert_eq!(support::successes(&text, "weather"), Some(calls as f64));
}
