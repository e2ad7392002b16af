#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod alloc;
mod bare;
mod call;
mod config;
mod counting;
pub mod exposition;
mod logs;
pub mod raw_http;
mod rng;
mod script;

pub use bare::{BareTool, FailOnPayload, PendingOnce, PendingOnceTool};
pub use call::{block_on, call, call_blocking, call_now, drive, polls_to_finish, Driven};
pub use config::problem_fields;
pub use counting::{counting_tool, CountingTool};
pub use logs::LogCapture;
pub use rng::{seeds_from_env, Rng};
pub use script::{gaps, ScriptedTool, Seen};

/// A boxed, cloneable tool service: what most helpers of this crate return, and what a
/// test stores when it keeps one tool type for every case.
pub type BoxedTool = tower::util::BoxCloneService<
    toolshield_core::ToolRequest,
    toolshield_core::ToolResponse,
    toolshield_core::ToolError,
>;
