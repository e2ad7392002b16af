//! `Retry-After` in both of its forms (RFC 9110 §10.2.3).

use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// Parses a `Retry-After` value: delta seconds (`"120"`) or an HTTP date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), the latter measured from `now`. A date in the past
/// is a zero wait. Anything else is `None`.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
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
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
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
