//! Wall-clock stamps as RFC 3339 text (`2026-11-23T09:15:02.123Z`), without a date crate:
//! the breaker's events and status carry a [`SystemTime`] and serialize it this way.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A [`SystemTime`] shown as RFC 3339 in UTC with milliseconds; times before 1970 show as
/// the epoch.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use toolshield_contract::time::Rfc3339;
///
/// let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
/// assert_eq!(Rfc3339(t).to_string(), "2023-11-14T22:13:20.123Z");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        let secs = since.as_secs();
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60,
            since.subsec_millis()
        )
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Serializes a [`SystemTime`] as RFC 3339 text: `#[serde(serialize_with = "toolshield_contract::time::serialize")]`.
#[cfg(feature = "serde")]
pub fn serialize<S: serde::Serializer>(
    time: &SystemTime,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&Rfc3339(*time))
}

/// The same for `Option<SystemTime>` (`None` is `null`).
#[cfg(feature = "serde")]
pub fn serialize_option<S: serde::Serializer>(
    time: &Option<SystemTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(t) => serializer.collect_str(&Rfc3339(*t)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let at = |secs: u64| Rfc3339(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.000Z");
        assert_eq!(at(1_798_761_600), "2027-01-01T00:00:00.000Z");
    }
}
