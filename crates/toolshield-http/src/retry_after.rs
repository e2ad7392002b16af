//! `Retry-After` in both of its forms (RFC 9110 §10.2.3).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use toolshield_core::config::MAX_DURATION;

/// Parses a `Retry-After` value: delta seconds (`"120"`) or an HTTP date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), the latter measured from `now`. A date in the past
/// is a zero wait. Anything else (a negative or fractional number, garbage) is `None`. A
/// wait longer than [`MAX_DURATION`](toolshield_core::config::MAX_DURATION) (366 days) is
/// cut to it, more digits than a `u64` holds included, so a peer's
/// `Retry-After: 99999999999999` cannot overflow a deadline computed from it.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{HeaderMap, HeaderValue};
/// use toolshield_http::parse_retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("2"), now), Some(Duration::from_secs(2)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() {
        return None;
    }
    let wait = if text.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: a number too large for a u64 is "very long", never garbage (which
        // would be retried after the default backoff instead).
        Duration::from_secs(text.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let at = httpdate::parse_http_date(text).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_DURATION))
}

/// The wait a response's `Retry-After` asks for, every field line of it considered:
/// the longest wait among the values [`parse_retry_after`] reads, so a response that
/// carries several (`Retry-After` is a single-value field; a proxy may add its own) is
/// never retried sooner than any of them asked. Values that do not parse are ignored;
/// `None` when none parses.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{header::RETRY_AFTER, HeaderMap, HeaderValue};
/// use toolshield_http::retry_after_from_headers;
///
/// let mut headers = HeaderMap::new();
/// headers.append(RETRY_AFTER, HeaderValue::from_static("0"));
/// headers.append(RETRY_AFTER, HeaderValue::from_static("120"));
/// headers.append(RETRY_AFTER, HeaderValue::from_static("soon"));
/// let wait = retry_after_from_headers(&headers, SystemTime::now());
/// assert_eq!(wait, Some(Duration::from_secs(120)));
/// ```
pub fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    headers
        .get_all(http::header::RETRY_AFTER)
        .iter()
        .filter_map(|v| parse_retry_after(v, now))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[test]
    fn delta_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after(&hv("0"), now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&hv("2"), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_retry_after(&hv(" 30 "), now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn http_date_in_the_future_and_past() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after(&hv("Wed, 21 Oct 2015 07:28:05 GMT"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse_retry_after(&hv("Wed, 21 Oct 2015 07:27:00 GMT"), now),
            Some(Duration::ZERO)
        );
        // The obsolete RFC 850 form is accepted too.
        assert_eq!(
            parse_retry_after(&hv("Wednesday, 21-Oct-15 07:28:10 GMT"), now),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn a_wait_longer_than_the_longest_duration_is_cut_to_it() {
        let now = SystemTime::now();
        for s in [
            "99999999999999",
            "18446744073709551615",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert_eq!(
                parse_retry_after(&HeaderValue::from_str(s).unwrap(), now),
                Some(MAX_DURATION),
                "{s}"
            );
        }
        assert_eq!(
            parse_retry_after(&hv("31622400"), now),
            Some(MAX_DURATION),
            "exactly the bound"
        );
    }

    #[test]
    fn garbage_is_none() {
        let now = SystemTime::now();
        for s in ["", "-1", "1.5", "soon", "Wed, 99 Oct 2015"] {
            assert_eq!(
                parse_retry_after(&HeaderValue::from_str(s).unwrap(), now),
                None,
                "{s}"
            );
        }
    }
}
