//! The exporter's recorder counts into cells of the recording thread: whatever the
//! threads, the batches and the handles dropped on the way, a render shows every call.

mod support;

use std::sync::{Arc, Barrier};

use serde_json::Value;
use toolshield_core::ToolRequest;
use toolshield_metrics::{local_prometheus, MetricsConfig, MetricsLayer};
use toolshield_test::{call_blocking, BareTool};
use tower::Layer;

use support::parse;

const SUCCESS: &[(&str, &str)] = &[("tool", "weather"), ("status", "success")];

/// `per_thread[i]` calls on thread `i`, all started together, through clones of one
/// service; then the render, with no upkeep in between.
fn calls_on_threads(per_thread: &[usize], drop_layer_first: bool) -> support::Exposition {
    let exporter = local_prometheus();
    let layer = MetricsLayer::build(MetricsConfig::with_tools(["weather"]), exporter.target())
        .expect("layer");
    let svc = layer.layer(BareTool);
    let start = Arc::new(Barrier::new(per_thread.len()));
    let threads: Vec<_> = per_thread
        .iter()
        .map(|&n| {
            let mut svc = svc.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..n {
                    let res = call_blocking(&mut svc, ToolRequest::new("weather", Value::Null));
                    assert!(res.is_ok());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    if drop_layer_first {
        drop(svc);
        drop(layer);
    }
    parse(&exporter.render()).expect("valid exposition")
}

fn assert_counted(exp: &support::Exposition, total: usize) {
    let total = total as f64;
    assert_eq!(exp.value("tool_execution_total", SUCCESS), Some(total));
    assert_eq!(
        exp.value("tool_duration_seconds_count", SUCCESS),
        Some(total)
    );
    let mut le_inf: Vec<(&str, &str)> = SUCCESS.to_vec();
    le_inf.push(("le", "+Inf"));
    assert_eq!(
        exp.value("tool_duration_seconds_bucket", &le_inf),
        Some(total)
    );
}

#[test]
fn every_call_of_every_thread_is_in_the_render() {
    // More threads than cells (up to 16), counts that are and are not whole batches of
    // histogram samples (64).
    let per_thread = [
        1, 63, 64, 65, 128, 200, 7, 0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233,
    ];
    let exp = calls_on_threads(&per_thread, false);
    assert_counted(&exp, per_thread.iter().sum());
}

#[test]
fn a_service_and_layer_dropped_before_the_render_keep_their_counts() {
    let per_thread = [10, 3, 70];
    let exp = calls_on_threads(&per_thread, true);
    assert_counted(&exp, per_thread.iter().sum());
}

#[test]
fn one_call_is_rendered_at_once() {
    let exp = calls_on_threads(&[1], false);
    assert_counted(&exp, 1);
}
