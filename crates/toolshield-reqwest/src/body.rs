//! Request bodies the adapter sends: in memory, so a request can be cloned and retried.

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::{Empty, Full};

/// A request body [`Client`](crate::Client) can send: turned into a [`reqwest::Body`]
/// when the request leaves.
///
/// Implemented for the in-memory bodies ([`Bytes`], `Vec<u8>`, `String`, `&'static str`,
/// `&'static [u8]`, [`Full<Bytes>`](Full), [`Empty<Bytes>`](Empty)), which are `Clone`, as
/// the retry layer needs; and for [`reqwest::Body`] itself, which is not, so a request
/// carrying one is sent once (put `toolshield_http::BufferBodyLayer` in front to buffer a
/// streaming body into a `Full<Bytes>`).
pub trait RequestBody {
    /// The body as reqwest sends it.
    fn into_reqwest_body(self) -> reqwest::Body;
}

impl RequestBody for reqwest::Body {
    fn into_reqwest_body(self) -> reqwest::Body {
        self
    }
}

impl RequestBody for Bytes {
    fn into_reqwest_body(self) -> reqwest::Body {
        self.into()
    }
}

impl RequestBody for Vec<u8> {
    fn into_reqwest_body(self) -> reqwest::Body {
        self.into()
    }
}

impl RequestBody for String {
    fn into_reqwest_body(self) -> reqwest::Body {
        self.into()
    }
}

impl RequestBody for &'static str {
    fn into_reqwest_body(self) -> reqwest::Body {
        self.into()
    }
}

impl RequestBody for &'static [u8] {
    fn into_reqwest_body(self) -> reqwest::Body {
        self.into()
    }
}

impl RequestBody for Empty<Bytes> {
    fn into_reqwest_body(self) -> reqwest::Body {
        Bytes::new().into()
    }
}

impl RequestBody for Full<Bytes> {
    fn into_reqwest_body(self) -> reqwest::Body {
        // A `Full` holds its bytes and answers its one frame at once: taking them keeps
        // the body in memory for reqwest (exact content-length, and a body it can send
        // again on a 307/308 redirect), rather than a boxed stream.
        let mut body = pin!(self);
        let mut cx = Context::from_waker(Waker::noop());
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default().into(),
            _ => Bytes::new().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_body_keeps_its_bytes() {
        let body = Full::new(Bytes::from_static(b"hello")).into_reqwest_body();
        assert_eq!(body.as_bytes(), Some(&b"hello"[..]));
        let empty = Full::new(Bytes::new()).into_reqwest_body();
        assert_eq!(empty.as_bytes(), Some(&b""[..]));
        assert_eq!(
            Empty::<Bytes>::new().into_reqwest_body().as_bytes(),
            Some(&b""[..])
        );
    }
}
