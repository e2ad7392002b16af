//! [`http_tool`]: `toolshield_http::HttpTool` over reqwest, so the whole default stack,
//! the idempotency layer and its derived keys included, applies to reqwest calls.

use bytes::Bytes;
use http_body_util::Full;
use toolshield_http::HttpTool;
use tower::util::MapResponse;

use crate::Client;

/// Turns a buffered response into one `HttpTool` reads (a `Full` body).
pub type ToFullBody = fn(http::Response<Bytes>) -> http::Response<Full<Bytes>>;

/// [`HttpTool`] sending through a [`Client`]: a `Service<ToolRequest>` whose payload is
/// `{method, url, headers?, body?}` and whose output is `{status, headers, body}`.
pub type ReqwestTool = HttpTool<MapResponse<Client, ToFullBody>>;

/// [`HttpTool`] over `client`: put it under a `Shield` to get the default stack for
/// reqwest calls. A `Mutating` call's idempotency key, given or derived by the
/// idempotency layer, is sent as its `Idempotency-Key` header on every attempt, an
/// error status is an `Err` of its kind (429 with its `Retry-After`), and reqwest's
/// errors are mapped by [`reqwest_error_for`](crate::reqwest_error_for).
///
/// ```
/// use toolshield::{shield::Shield, ShieldConfig};
/// use toolshield_http::http_tool_request;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let shield = Shield::from_config(ShieldConfig::default())?;
/// let api = shield.wrap("api", toolshield_reqwest::http_tool(reqwest::Client::new().into()));
/// let req = http_tool_request("api", serde_json::json!({
///     "method": "POST",
///     "url": "http://127.0.0.1:8080/orders",
///     "body": {"item": "book"},
/// }));
/// # let _ = (api, req);
/// # Ok(()) }
/// ```
pub fn http_tool(client: Client) -> ReqwestTool {
    let to_full: ToFullBody = |response| response.map(Full::new);
    HttpTool::with_client(MapResponse::new(client, to_full))
}
