#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod layer;
mod ledger;
mod service;
mod store;

pub use config::{
    BudgetConfig, LedgerConfig, OnStoreError, Scope, WithoutRun, MAX_ID_LEN, MAX_LIMIT,
};
pub use layer::BudgetLayer;
pub use ledger::{BudgetLedger, ToolStats};
pub use service::{Budget, ResponseFuture};
pub use store::{BudgetKey, BudgetStore, Charge, Limit, MemoryBudgetStore, Verdict};
pub use toolshield_store::{StoreError, StoreFuture};
