//! A randomized concurrent test of the in-memory ledger with a checker of invariants:
//! many tasks on a multi-threaded runtime charge a few runs across tools of different
//! limits and costs, and the counts never pass a limit, and every rejection is justified
//! by a limit that is full at the end (counters only grow).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;
use toolshield_budget::{BudgetKey, BudgetLayer, BudgetLedger, LedgerConfig, Scope};
use toolshield_core::{ErrorKind, ToolError, ToolRequest, ToolResponse};
use toolshield_test::{BareTool, Rng};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type Tool = BoxCloneSyncService<ToolRequest, ToolResponse, ToolError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Admitted,
    Tool,
    RunCalls,
    RunCost,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charges_never_pass_a_limit_and_every_rejection_is_justified() {
    for seed in 1..=20u64 {
        let mut rng = Rng::new(seed);
        let run_max_calls = 5 + rng.below(30);
        let run_max_cost = 10 + rng.below(60);
        let ledger = BudgetLedger::from_config(&LedgerConfig {
            run_max_calls: Some(run_max_calls),
            run_max_cost: Some(run_max_cost),
            ..LedgerConfig::default()
        })
        .unwrap();
        // Four tools: limits from none to a few, costs from 0 to 7.
        let tools: Vec<(String, Option<u64>, u64, Tool)> = (0..4)
            .map(|i| {
                let name = format!("t{i}");
                let max = (rng.below(3) > 0).then(|| rng.below(8));
                let cost = rng.below(8);
                let svc = BoxCloneSyncService::new(
                    BudgetLayer::new(&ledger, name.as_str(), max)
                        .cost(cost)
                        .layer(BareTool),
                );
                (name, max, cost, svc)
            })
            .collect();
        let runs = ["a", "b", "c"];
        let log: Arc<Mutex<Vec<(usize, usize, Outcome)>>> = Arc::default();
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let t = usize::try_from(rng.below(4)).unwrap();
            let r = usize::try_from(rng.below(3)).unwrap();
            let svc = tools[t].3.clone();
            let name = tools[t].0.clone();
            let log = Arc::clone(&log);
            tasks.push(tokio::spawn(async move {
                let out = svc
                    .oneshot(ToolRequest::new(name, json!({})).run_id(runs[r]))
                    .await;
                let outcome = match out {
                    Ok(_) => Outcome::Admitted,
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::BudgetExhausted, "{e}");
                        let m = e.message();
                        if m.contains("calls in this run") {
                            Outcome::Tool
                        } else if m.contains("calls across tools") {
                            Outcome::RunCalls
                        } else {
                            assert!(m.contains("cost units"), "{m}");
                            Outcome::RunCost
                        }
                    }
                };
                log.lock().unwrap().push((t, r, outcome));
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let log = log.lock().unwrap();
        let store = ledger.memory_store().unwrap();
        for (r, run) in runs.iter().enumerate() {
            let key = BudgetKey::new(Scope::Run, Some(run), None)
                .unwrap()
                .encoded();
            let mut per_tool: HashMap<usize, u64> = HashMap::new();
            let (mut calls, mut cost) = (0u64, 0u64);
            for (t, _, _) in log
                .iter()
                .filter(|(_, lr, o)| *lr == r && *o == Outcome::Admitted)
            {
                *per_tool.entry(*t).or_default() += 1;
                calls += 1;
                cost += tools[*t].2;
            }
            // The store counted exactly the calls admitted, and no limit is passed.
            let (s_calls, s_cost) = store.usage(&key).unwrap_or((0, 0));
            assert_eq!((s_calls, s_cost), (calls, cost), "seed {seed} run {run}");
            assert!(
                calls <= run_max_calls && cost <= run_max_cost,
                "seed {seed}"
            );
            for (t, (name, max, _, _)) in tools.iter().enumerate() {
                let used = per_tool.get(&t).copied().unwrap_or(0);
                assert_eq!(store.tool_calls(&key, name).unwrap_or(0), used);
                assert!(max.is_none_or(|m| used <= m), "seed {seed} tool {name}");
            }
            // Every rejection names a limit that is full now.
            for (t, _, o) in log.iter().filter(|(_, lr, _)| *lr == r) {
                let used = per_tool.get(t).copied().unwrap_or(0);
                let full = match o {
                    Outcome::Admitted => true,
                    Outcome::Tool => tools[*t].1 == Some(used),
                    Outcome::RunCalls => calls == run_max_calls,
                    Outcome::RunCost => cost + tools[*t].2 > run_max_cost,
                };
                assert!(full, "seed {seed} run {run}: {o:?} of t{t} without cause");
            }
        }
    }
}
