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

impl Provenance {
    /// Nothing recorded: what a new response carries.
    const EMPTY: Provenance = Provenance {
        source: None,
        tool: None,
        fetched_at: None,
        cache_hit: false,
        replayed: false,
        stale: false,
        slow: false,
        attempts: 0,
        execution_id: None,
        trace_id: None,
        duration: None,
        response_digest: None,
        tier: None,
        unrecorded: false,
        hedge_answered_by: None,
        hedges_sent: None,
        progress_reports: 0,
        progress_message: None,
    };

    /// Nothing recorded but the one attempt that succeeded.
    const FIRST_ATTEMPT: Provenance = Provenance {
        attempts: 1,
        ..Provenance::EMPTY
    };
}

/// The [`Provenance`] of a [`ToolResponse`], read and written through `Deref` and
/// `DerefMut` (`res.provenance.cache_hit`, `res.provenance.tier = ...`).
///
/// It is one pointer and a tag wide, not the 192 bytes of a `Provenance`, because every
/// layer of a stack moves its response at least once: with the record inline, most of
/// what a call copied was provenance, on every success. The record is boxed on its first
/// write; until then it reads as empty, and a response whose only record is the one
/// attempt that succeeded (what a retry layer writes on the common path) keeps that
/// without a box. So a layer that only reads provenance, or records a first attempt,
/// allocates nothing.
#[derive(Clone, Default)]
pub struct ProvenanceBox {
    /// The record, once anything but a first attempt was written.
    boxed: Option<Box<Provenance>>,
    /// Unboxed, the record reads as `attempts: 1` rather than empty.
    first_attempt: bool,
}

/// Returned for an unboxed record; never written.
static EMPTY: Provenance = Provenance::EMPTY;
static FIRST_ATTEMPT: Provenance = Provenance::FIRST_ATTEMPT;

impl ProvenanceBox {
    /// A box holding `provenance`.
    #[must_use]
    pub fn new(provenance: Provenance) -> Self {
        ProvenanceBox {
            boxed: Some(Box::new(provenance)),
            first_attempt: false,
        }
    }

    /// The record, out of its box.
    #[must_use]
    pub fn into_inner(self) -> Provenance {
        match self.boxed {
            Some(provenance) => *provenance,
            None if self.first_attempt => Provenance::FIRST_ATTEMPT,
            None => Provenance::EMPTY,
        }
    }

    /// Records the attempts made; on an otherwise empty record, a first attempt
    /// allocates nothing.
    #[inline]
    pub fn set_attempts(&mut self, attempts: u32) {
        match &mut self.boxed {
            Some(provenance) => provenance.attempts = attempts,
            None if attempts <= 1 => self.first_attempt = attempts == 1,
            None => self.boxed_mut().attempts = attempts,
        }
    }

    /// The record, boxed on the first call.
    fn boxed_mut(&mut self) -> &mut Provenance {
        let first_attempt = self.first_attempt;
        self.boxed.get_or_insert_with(|| {
            Box::new(if first_attempt {
                Provenance::FIRST_ATTEMPT
            } else {
                Provenance::EMPTY
            })
        })
    }
}

impl std::ops::Deref for ProvenanceBox {
    type Target = Provenance;

    #[inline]
    fn deref(&self) -> &Provenance {
        match &self.boxed {
            Some(provenance) => provenance,
            None if self.first_attempt => &FIRST_ATTEMPT,
            None => &EMPTY,
        }
    }
}

impl std::ops::DerefMut for ProvenanceBox {
    /// Boxes the record on its first write.
    #[inline]
    fn deref_mut(&mut self) -> &mut Provenance {
        self.boxed_mut()
    }
}

impl From<Provenance> for ProvenanceBox {
    fn from(provenance: Provenance) -> Self {
        ProvenanceBox::new(provenance)
    }
}

impl PartialEq for ProvenanceBox {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl PartialEq<Provenance> for ProvenanceBox {
    fn eq(&self, other: &Provenance) -> bool {
        **self == *other
    }
}

impl PartialEq<ProvenanceBox> for Provenance {
    fn eq(&self, other: &ProvenanceBox) -> bool {
        *self == **other
    }
}

impl From<ProvenanceBox> for Provenance {
    fn from(provenance: ProvenanceBox) -> Self {
        provenance.into_inner()
    }
}

impl std::fmt::Debug for ProvenanceBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl Serialize for ProvenanceBox {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ProvenanceBox {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Provenance::deserialize(deserializer).map(ProvenanceBox::new)
    }
}

/// What a tool returned, with where it came from.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ToolResponse {
    /// The tool's output.
    pub output: Value,
    /// Where it came from.
    #[serde(default)]
    pub provenance: ProvenanceBox,
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
            provenance: ProvenanceBox::default(),
            extensions: Extensions::new(),
        }
    }

    /// Takes off the slow-call mark (`provenance.slow` and the [`SlowCall`] extension) of
    /// an answer served again: a cache hit or an idempotent replay did not wait for the
    /// tool, so the slowness of the call that produced it is not this call's, and it must
    /// not count again in `tool_slow_calls_total` or the breaker's slow-call rate.
    pub fn clear_slow(&mut self) {
        // Read first: a write through the provenance box would allocate an empty one.
        if self.provenance.slow {
            self.provenance.slow = false;
        }
        self.extensions.remove::<SlowCall>();
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
        self.provenance.set_attempts(attempts);
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
    fn name_attempt(&mut self, id: [u8; 16]) {
        if self.provenance.execution_id.is_none() {
            self.provenance.execution_id = Some(Uuid::from_bytes(id));
        }
    }

    #[inline]
    fn replayed(&self) -> bool {
        self.provenance.replayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_response_reads_an_empty_record() {
        let res = ToolResponse::new(Value::Null);
        assert_eq!(*res.provenance, Provenance::default());
        assert_eq!(res.provenance, Provenance::default());
        assert!(res.provenance.boxed.is_none());
    }

    #[test]
    fn a_first_attempt_is_recorded_without_a_box_and_kept_by_later_writes() {
        let mut res = ToolResponse::new(Value::Null);
        res.set_attempts(1);
        assert!(
            res.provenance.boxed.is_none(),
            "a first attempt needs no box"
        );
        assert_eq!(res.provenance.attempts, 1);
        assert_eq!(res.attempts(), Some(1));

        // The first write of anything else boxes the record, the attempt included.
        res.provenance.cache_hit = true;
        assert!(res.provenance.boxed.is_some());
        assert_eq!(res.provenance.attempts, 1);
        assert!(res.provenance.cache_hit);

        res.set_attempts(3);
        assert_eq!(res.provenance.attempts, 3);
        assert!(res.provenance.cache_hit);
    }

    #[test]
    fn attempts_set_on_an_unboxed_record_read_back_as_set() {
        let mut p = ProvenanceBox::default();
        p.set_attempts(1);
        p.set_attempts(0);
        assert_eq!(p.attempts, 0);
        assert!(p.boxed.is_none());
        p.set_attempts(4);
        assert_eq!(p.attempts, 4);
        assert_eq!(p.clone().into_inner().attempts, 4);
        let mut first = ProvenanceBox::default();
        first.set_attempts(1);
        assert_eq!(first.into_inner(), Provenance::FIRST_ATTEMPT);
    }

    #[test]
    fn a_boxed_and_an_unboxed_record_with_the_same_fields_are_equal() {
        let mut unboxed = ProvenanceBox::default();
        unboxed.set_attempts(1);
        let boxed = ProvenanceBox::new(Provenance {
            attempts: 1,
            ..Provenance::default()
        });
        assert_eq!(unboxed, boxed);
        assert_ne!(ProvenanceBox::default(), boxed);
        // Compared with a plain record either way round, and converted back into one.
        let plain = Provenance {
            attempts: 1,
            ..Provenance::default()
        };
        assert_eq!(plain, unboxed);
        assert_eq!(unboxed, plain);
        assert_eq!(Provenance::from(boxed), plain);
    }

    #[test]
    fn a_clone_is_written_apart_from_its_original() {
        let mut original = ToolResponse::new(Value::Null);
        original.provenance.tool = Some(Arc::from("weather"));
        let mut copy = original.clone();
        copy.provenance.cache_hit = true;
        copy.provenance.tool = Some(Arc::from("quote"));
        assert!(!original.provenance.cache_hit);
        assert_eq!(original.provenance.tool.as_deref(), Some("weather"));
        assert_eq!(copy.provenance.tool.as_deref(), Some("quote"));
    }

    #[test]
    fn the_record_serialises_as_a_plain_provenance_both_ways() {
        let mut res = ToolResponse::new(serde_json::json!({"t": 1}));
        res.set_attempts(1);
        let unboxed = serde_json::to_value(&res).expect("serialise");
        res.provenance.replayed = true;
        res.provenance.replayed = false;
        let boxed = serde_json::to_value(&res).expect("serialise");
        assert_eq!(unboxed, boxed, "boxing changes nothing on the wire");
        let plain = serde_json::to_value(Provenance {
            attempts: 1,
            ..Provenance::default()
        })
        .expect("serialise");
        assert_eq!(unboxed["provenance"], plain);
        let back: ToolResponse = serde_json::from_value(boxed).expect("deserialise");
        assert_eq!(back, res);
        // A response without a provenance field reads as empty.
        let bare: ToolResponse =
            serde_json::from_value(serde_json::json!({"output": 1})).expect("deserialise");
        assert_eq!(bare.provenance, Provenance::default());
    }

    #[test]
    fn the_result_every_layer_moves_stays_small() {
        // The response's record is a pointer and a flag; the error one pointer.
        assert!(std::mem::size_of::<ProvenanceBox>() <= 16);
        assert!(std::mem::size_of::<Result<ToolResponse, crate::ToolError>>() <= 64);
    }
}

/// The UTC time of the monotonic reading `at`, as a provenance record's `fetched_at`
/// wants it: derived from one wall-clock base per process, as
/// [`time::wall_clock`](crate::time::wall_clock) derives it, with the calendar date
/// worked out once per day and thread (the date from a day number is most of what a
/// `DateTime` costs to build; the time of day is arithmetic).
///
/// ```
/// use chrono::{DateTime, Utc};
/// use toolshield_core::{time, utc_at};
///
/// let at = time::now();
/// let apart = utc_at(at) - DateTime::<Utc>::from(time::wall_clock(at));
/// assert!(apart.num_milliseconds().abs() < 1_000);
/// ```
#[must_use]
pub fn utc_at(at: tokio::time::Instant) -> DateTime<Utc> {
    utc_of_unix_nanos(crate::time::unix_nanos(at))
}

/// The UTC time `nanos` nanoseconds after the Unix epoch (the epoch for a time before
/// it), the date kept per thread for the day last asked for.
fn utc_of_unix_nanos(nanos: i64) -> DateTime<Utc> {
    use std::cell::Cell;

    use chrono::{NaiveDate, NaiveTime};

    const NANOS: i64 = 1_000_000_000;
    const DAY: i64 = 86_400;
    std::thread_local! {
        // The day number (days since the Unix epoch) last asked for, and its date.
        static LAST_DAY: Cell<Option<(i64, NaiveDate)>> = const { Cell::new(None) };
    }
    let nanos = nanos.max(0);
    let (secs, subsec) = (nanos / NANOS, nanos % NANOS);
    let (day, of_day) = (secs / DAY, secs % DAY);
    let date = LAST_DAY.with(|last| match last.get() {
        Some((d, date)) if d == day => Some(date),
        _ => {
            let date = DateTime::from_timestamp(day * DAY, 0)?.date_naive();
            last.set(Some((day, date)));
            Some(date)
        }
    });
    let time = u32::try_from(of_day)
        .ok()
        .zip(u32::try_from(subsec).ok())
        .and_then(|(secs, nanos)| NaiveTime::from_num_seconds_from_midnight_opt(secs, nanos));
    match date.zip(time) {
        Some((date, time)) => date.and_time(time).and_utc(),
        None => DateTime::from_timestamp_nanos(nanos),
    }
}

#[cfg(test)]
mod utc_tests {
    use chrono::DateTime;

    use super::utc_of_unix_nanos;

    #[test]
    fn the_utc_time_is_the_calendar_time_to_the_nanosecond() {
        const DAY: i64 = 86_400 * 1_000_000_000;
        let now = 1_795_000_000_123_456_789_i64; // 2026-11-18
        let mut cases = vec![
            0,
            1,
            DAY - 1,
            DAY,
            951_782_400 * 1_000_000_000 - 1,
            i64::MAX,
        ];
        // Every day of two years, each at a time of day that moves, asked in order and
        // out of order: a kept date is used only for its own day.
        for d in 0..731 {
            cases.push(now + d * DAY + d * 997_000_001 % DAY);
        }
        for d in (0..731).rev().step_by(7) {
            cases.push(now + d * DAY + 3);
        }
        for nanos in cases {
            assert_eq!(
                utc_of_unix_nanos(nanos),
                DateTime::from_timestamp_nanos(nanos),
                "{nanos}"
            );
        }
        // Before the epoch: the epoch.
        assert_eq!(utc_of_unix_nanos(-5), DateTime::from_timestamp_nanos(0));
    }
}
