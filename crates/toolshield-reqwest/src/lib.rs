#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod client;
mod error;
mod tool;

pub use body::RequestBody;
pub use client::{Client, ResponseFuture};
pub use error::{error_for_status, reqwest_error_for};
pub use tool::{http_tool, ReqwestTool, ToFullBody};
pub use toolshield_core::http_impls::{HttpRoute, RetryAfter, IDEMPOTENCY_KEY_HEADER};
