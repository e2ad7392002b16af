//! The bounded tool set and the metric handles cached per tool and label value.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram, Key, Label};
use toolshield_contract::hash::FastHashMap;
use toolshield_contract::ErrorKind;

use crate::names::*;
use crate::target::MetricsTarget;

/// Above this many names, lookups use a hash map instead of a scan.
const SCAN_MAX: usize = 8;

/// The registered tool names; anything else is labelled `other`.
#[derive(Debug)]
pub(crate) struct ToolNames {
    names: Vec<Arc<str>>,
    map: FastHashMap<Arc<str>, usize>,
}

impl ToolNames {
    pub(crate) fn new(names: Vec<Arc<str>>) -> Self {
        let map = if names.len() > SCAN_MAX {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (Arc::clone(n), i))
                .collect()
        } else {
            FastHashMap::default()
        };
        ToolNames { names, map }
    }

    /// The index of `tool`, or `len()` (the `other` slot).
    pub(crate) fn index(&self, tool: &str) -> usize {
        if self.names.len() <= SCAN_MAX {
            self.names
                .iter()
                .position(|n| &**n == tool)
                .unwrap_or(self.names.len())
        } else {
            self.map.get(tool).copied().unwrap_or(self.names.len())
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn label(&self, index: usize) -> &str {
        self.names.get(index).map_or(OTHER_TOOL, |n| n)
    }
}

/// Handles of one tool (or of `other`), registered on first use.
#[derive(Debug, Default)]
pub(crate) struct ToolSlots {
    execution: [OnceLock<Counter>; 5],
    duration: [OnceLock<Histogram>; 5],
    attempts: [OnceLock<Counter>; 5],
    errors: [OnceLock<Counter>; CODES],
    retries: [OnceLock<Counter>; CODES],
    retries_unknown: OnceLock<Counter>,
    slow: OnceLock<Counter>,
    cache_hits: OnceLock<Counter>,
    cache_misses: OnceLock<Counter>,
    replays: OnceLock<Counter>,
    unrecorded: OnceLock<Counter>,
}

/// What every service of a metrics layer, outer and inner, shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tools: ToolNames,
    slots: Box<[ToolSlots]>,
    pub(crate) target: MetricsTarget,
    pub(crate) cache_misses: bool,
    pub(crate) spans: bool,
}

fn key(name: &'static str, tool: &str, label: Option<(&'static str, &'static str)>) -> Key {
    let mut labels = vec![Label::new("tool", tool.to_owned())];
    if let Some((k, v)) = label {
        labels.push(Label::new(k, v));
    }
    Key::from_parts(name, labels)
}

impl Shared {
    pub(crate) fn new(
        tools: ToolNames,
        target: MetricsTarget,
        cache_misses: bool,
        spans: bool,
    ) -> Self {
        let slots = (0..=tools.len()).map(|_| ToolSlots::default()).collect();
        describe(&target);
        Shared {
            tools,
            slots,
            target,
            cache_misses,
            spans,
        }
    }

    fn slots(&self, tool: usize) -> &ToolSlots {
        // `tool` comes from `ToolNames::index`, always <= len.
        &self.slots[tool.min(self.slots.len() - 1)]
    }

    fn counter<'a>(
        &self,
        cell: &'a OnceLock<Counter>,
        name: &'static str,
        tool: usize,
        label: Option<(&'static str, &'static str)>,
    ) -> &'a Counter {
        cell.get_or_init(|| {
            self.target
                .counter(&key(name, self.tools.label(tool), label))
        })
    }

    pub(crate) fn execution(&self, tool: usize, status: Status) -> &Counter {
        let cell = &self.slots(tool).execution[status.index()];
        self.counter(
            cell,
            TOOL_EXECUTION_TOTAL,
            tool,
            Some(("status", status.as_str())),
        )
    }

    pub(crate) fn duration(&self, tool: usize, status: Status) -> &Histogram {
        self.slots(tool).duration[status.index()].get_or_init(|| {
            self.target.histogram(&key(
                TOOL_DURATION_SECONDS,
                self.tools.label(tool),
                Some(("status", status.as_str())),
            ))
        })
    }

    pub(crate) fn attempts(&self, tool: usize, outcome: Status) -> &Counter {
        let cell = &self.slots(tool).attempts[outcome.index()];
        self.counter(
            cell,
            TOOL_ATTEMPTS_TOTAL,
            tool,
            Some(("outcome", outcome.as_str())),
        )
    }

    pub(crate) fn errors(&self, tool: usize, kind: ErrorKind) -> &Counter {
        let cell = &self.slots(tool).errors[code_index(kind)];
        self.counter(cell, TOOL_ERRORS_TOTAL, tool, Some(("code", kind.code())))
    }

    /// `code` is the failure that made the retry layer start this attempt
    /// ([`CallState::retry_reason`](toolshield_contract::CallState::retry_reason)),
    /// `UNKNOWN` for a request type that does not carry it.
    pub(crate) fn retries(&self, tool: usize, kind: Option<ErrorKind>) -> &Counter {
        match kind {
            Some(kind) => {
                let cell = &self.slots(tool).retries[code_index(kind)];
                self.counter(cell, TOOL_RETRIES_TOTAL, tool, Some(("code", kind.code())))
            }
            None => {
                let cell = &self.slots(tool).retries_unknown;
                self.counter(cell, TOOL_RETRIES_TOTAL, tool, Some(("code", "UNKNOWN")))
            }
        }
    }

    pub(crate) fn slow(&self, tool: usize) -> &Counter {
        self.counter(&self.slots(tool).slow, TOOL_SLOW_CALLS_TOTAL, tool, None)
    }

    pub(crate) fn cache_hits(&self, tool: usize) -> &Counter {
        self.counter(
            &self.slots(tool).cache_hits,
            TOOL_CACHE_HITS_TOTAL,
            tool,
            None,
        )
    }

    pub(crate) fn cache_misses(&self, tool: usize) -> &Counter {
        self.counter(
            &self.slots(tool).cache_misses,
            TOOL_CACHE_MISSES_TOTAL,
            tool,
            None,
        )
    }

    pub(crate) fn replays(&self, tool: usize) -> &Counter {
        self.counter(
            &self.slots(tool).replays,
            IDEMPOTENCY_CACHE_HITS_TOTAL,
            tool,
            None,
        )
    }

    pub(crate) fn unrecorded(&self, tool: usize) -> &Counter {
        self.counter(
            &self.slots(tool).unrecorded,
            IDEMPOTENCY_UNRECORDED_TOTAL,
            tool,
            None,
        )
    }
}

/// `# HELP` lines for the metric set (docs/observability.md).
pub(crate) fn describe(target: &MetricsTarget) {
    use metrics::Unit;
    target.describe_counter(
        TOOL_EXECUTION_TOTAL,
        Some(Unit::Count),
        "Logical tool calls, by final status.",
    );
    target.describe_histogram(
        TOOL_DURATION_SECONDS,
        Some(Unit::Seconds),
        "Duration of logical tool calls in seconds, by final status.",
    );
    target.describe_counter(
        TOOL_ATTEMPTS_TOTAL,
        Some(Unit::Count),
        "Attempts of tool calls (retries included), by outcome.",
    );
    target.describe_counter(
        TOOL_ERRORS_TOTAL,
        Some(Unit::Count),
        "Failed logical tool calls, by canonical error code.",
    );
    target.describe_counter(
        TOOL_RETRIES_TOTAL,
        Some(Unit::Count),
        "Retries of tool calls, by the code of the failure that caused them.",
    );
    target.describe_counter(
        TOOL_SLOW_CALLS_TOTAL,
        Some(Unit::Count),
        "Successful tool calls slower than the soft threshold.",
    );
    target.describe_counter(
        TOOL_CACHE_HITS_TOTAL,
        Some(Unit::Count),
        "Tool calls answered from the result cache.",
    );
    target.describe_counter(
        TOOL_CACHE_MISSES_TOTAL,
        Some(Unit::Count),
        "Read-only tool calls the result cache could not answer.",
    );
    target.describe_counter(
        IDEMPOTENCY_CACHE_HITS_TOTAL,
        Some(Unit::Count),
        "Tool calls replayed from an idempotency record.",
    );
    target.describe_counter(
        IDEMPOTENCY_UNRECORDED_TOTAL,
        Some(Unit::Count),
        "Tool calls that ran but whose idempotency record could not be written.",
    );
}
