use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::Extensions;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::canonical::Digest;
use crate::{ErrorKind, Hedged, InBandFailure, ShieldResponse, SlowCall};

/// Where a result came from. Every successful response carries one; the provenance
/// layer fills in what the tool left blank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Provenance {
    /// What produced the data: the tool, server or URL behind it.
    pub source: Option<Arc<str>>,
    /// The tool that was called.
    pub tool: Option<Arc<str>>,
    /// When the data was fetched from its source. A cache hit or a replay keeps the
    /// original time.
    pub fetched_at: Option<DateTime<Utc>>,
    /// Served from the result cache.
    pub cache_hit: bool,
    /// Replayed from an idempotency record: the tool did not run again.
    pub replayed: bool,
    /// A cache entry past its TTL, served because the tool failed (stale-if-error).
    pub stale: bool,
    /// The call succeeded but crossed the soft (slow-call) threshold.
    pub slow: bool,
    /// Attempts made for this result (1 when the first attempt succeeded).
    pub attempts: u32,
    /// The execution id of the attempt that produced the data.
    pub execution_id: Option<Uuid>,
    /// The trace the call belonged to.
    pub trace_id: Option<Arc<str>>,
    /// Duration of the logical call, as the provenance layer measured it from the call's
    /// entry; JSON `durationMs`, whole milliseconds.
    #[serde(rename = "durationMs", with = "millis")]
    pub duration: Option<Duration>,
    /// SHA-256 of the canonical JSON of the output.
    pub response_digest: Option<Digest>,
    /// The fallback tier that answered; `None` when the primary service did.
    pub tier: Option<Arc<str>>,
    /// The tool ran, but its idempotency record could not be written (the store failed
    /// past the retry bound, or the claim was lost): a duplicate of this call may not be
    /// answered from the record. Counted as `idempotency_unrecorded_total`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unrecorded: bool,
    /// With hedging, when more than one attempt was sent: which one answered (1 for the
    /// first, 2 for the first hedge, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge_answered_by: Option<u32>,
    /// With hedging, when more than one attempt was sent: how many were sent in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedges_sent: Option<u32>,
    /// Progress reports the tool made during the call, across its attempts
    /// ([`Progress::report`](crate::Progress::report)); absent from JSON when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub progress_reports: u64,
    /// The last progress message reported (at most
    /// [`MAX_PROGRESS_MESSAGE`](crate::MAX_PROGRESS_MESSAGE) bytes); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_message: Option<Arc<str>>,
}

/// `Option<Duration>` as whole milliseconds (`null` when absent).
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)] // serde's `with` passes a reference to the field
    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a tool returned, with where it came from.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ToolResponse {
    /// The tool's output.
    pub output: Value,
    /// Where it came from.
    #[serde(default)]
    pub provenance: Provenance,
    /// Typed extensions layers attach to the response (not serialised).
    #[serde(skip)]
    pub extensions: Extensions,
}

impl ToolResponse {
    /// A response with `output` and empty provenance.
    #[must_use]
    pub fn new(output: Value) -> Self {
        ToolResponse {
            output,
            provenance: Provenance::default(),
            extensions: Extensions::new(),
        }
    }

    /// Whether the output reports a failure in-band, MCP style: `{"isError": true, ...}`.
    #[inline]
    pub fn is_error(&self) -> bool {
        // Only an object can carry the flag; checked inline, as every layer that
        // classifies a success asks.
        match &self.output {
            Value::Object(map) => map.get("isError").and_then(Value::as_bool).unwrap_or(false),
            _ => false,
        }
    }
}

impl PartialEq for ToolResponse {
    /// Output and provenance; extensions are not compared.
    fn eq(&self, other: &Self) -> bool {
        self.output == other.output && self.provenance == other.provenance
    }
}

impl ShieldResponse for ToolResponse {
    #[inline]
    fn call_duration(&self) -> Option<Duration> {
        self.provenance.duration
    }

    fn mark_hedged(&mut self, hedged: Hedged) {
        self.provenance.hedge_answered_by = Some(hedged.answered_by);
        self.provenance.hedges_sent = Some(hedged.sent);
    }

    /// An MCP-style `{"isError": true, "content": [{"type": "text", "text": message}]}`.
    /// Whatever `kind` asks for, a `ToolResponse` reports an in-band failure as
    /// `EXECUTION_FAILED` (the only kind its `isError` flag carries).
    fn in_band_failure_response(_kind: ErrorKind, message: &str) -> Option<Self> {
        Some(ToolResponse::new(serde_json::json!({
            "isError": true,
            "content": [{"type": "text", "text": message}],
        })))
    }

    #[inline]
    fn in_band_failure(&self) -> Option<InBandFailure> {
        self.is_error().then_some(InBandFailure {
            kind: ErrorKind::ExecutionFailed,
            retry_after: None,
        })
    }

    fn mark_slow(&mut self, slow: SlowCall) {
        self.provenance.slow = true;
        self.extensions.insert(slow);
    }

    #[inline]
    fn slow_call(&self) -> Option<SlowCall> {
        self.extensions.get::<SlowCall>().copied()
    }

    #[inline]
    fn set_attempts(&mut self, attempts: u32) {
        self.provenance.attempts = attempts;
    }

    #[inline]
    fn attempts(&self) -> Option<u32> {
        Some(self.provenance.attempts)
    }

    #[inline]
    fn is_slow(&self) -> bool {
        self.provenance.slow || self.slow_call().is_some()
    }

    #[inline]
    fn cache_hit(&self) -> bool {
        self.provenance.cache_hit
    }

    #[inline]
    fn unrecorded(&self) -> bool {
        self.provenance.unrecorded
    }

    fn mark_tier(&mut self, tier: &Arc<str>) {
        self.provenance.tier = Some(Arc::clone(tier));
    }

    #[inline]
    fn replayed(&self) -> bool {
        self.provenance.replayed
    }
}
