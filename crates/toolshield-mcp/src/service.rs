//! [`McpClientService`] and [`McpTool`]: `Service<ToolRequest>` over an `rmcp` client.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientConfig, ClientRequest, ProtocolVersion,
    ServerResult, TASKS_EXTENSION_ID,
};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::IntoTransport;
use rmcp::{ClientHandler, Peer, ServiceExt};
use serde_json::Value;
use toolshield_core::{
    CallKind, CallState, ErrorKind, ShieldRequest, ToolError, ToolRequest, ToolResponse,
};
use tower_service::Service;

use crate::cancel::CancelNotice;
use crate::map::{capped, map_call_error, map_result, IsErrorPolicy};
use crate::progress::{ProgressRouter, ProgressWatch, WithProgress};
use crate::task::TaskCall;

/// The future of [`McpClientService`] and [`McpTool`].
///
/// Boxed: a tool call is a round trip to another process or task, whose cost dwarfs one
/// allocation, and `rmcp`'s request futures cannot be named.
pub type McpFuture = Pin<Box<dyn Future<Output = Result<ToolResponse, ToolError>> + Send>>;

/// Calls tools on one MCP server through an `rmcp` client.
///
/// - tool name: the request's tool, with a `{server}__` prefix stripped when the service
///   was given a server name ([`with_server`](Self::with_server)), so it can sit behind
///   `RouterBuilder::server`;
/// - arguments: the request's payload (an object; `null` sends no arguments; anything
///   else is `INVALID_INPUT`, never sent);
/// - result: see [`IsErrorPolicy`] and `docs/mcp.md` for the mapping of results and errors.
///
/// Cheap to clone: every clone shares one client connection. The call is abandoned when
/// the request's attempt token fires (`CANCELLED`) or the future is dropped, e.g. by the
/// attempt timeout; the server is then sent `notifications/cancelled` for the request,
/// exactly once ([`REASON_CANCELLED`](crate::REASON_CANCELLED) or
/// [`REASON_ABANDONED`](crate::REASON_ABANDONED)), and never after an answer.
///
/// A call the server answers with an MCP task is followed to its end as one call: polled
/// with `tasks/get`, cancelled with `tasks/cancel`; see `docs/mcp.md`.
///
/// The server's progress reaches the call: `notifications/progress` for the call's
/// progress token (and, for a task, each poll or status notification that says it is
/// still working) is reported on the request's progress handle, which resets the attempt
/// timeout's idle limit and is counted for provenance. [`connect`](Self::connect) sets
/// this up; a client given to [`new`](Self::new) needs a [`WithProgress`] handler and
/// [`with_progress_router`](Self::with_progress_router).
#[derive(Clone)]
pub struct McpClientService {
    peer: Peer<RoleClient>,
    /// Keeps the client's background task alive while any clone exists.
    keep_alive: Option<Arc<dyn Send + Sync>>,
    server: Option<Arc<str>>,
    policy: IsErrorPolicy,
    /// Where the client's handler sends the server's progress, if it does.
    progress: Option<ProgressRouter>,
}

impl fmt::Debug for McpClientService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpClientService")
            .field("server", &self.server)
            .field("policy", &self.policy)
            .field("owns_client", &self.keep_alive.is_some())
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}

impl McpClientService {
    /// Takes over a running `rmcp` client: the connection lives as long as any clone of
    /// this service.
    ///
    /// The server's progress notifications reach the calls only if the client's handler
    /// is a [`WithProgress`] whose router is given to
    /// [`with_progress_router`](Self::with_progress_router).
    #[must_use]
    pub fn new<H>(client: RunningService<RoleClient, H>) -> Self
    where
        H: ClientHandler,
        RunningService<RoleClient, H>: Send + Sync + 'static,
    {
        let peer = client.peer().clone();
        McpClientService {
            peer,
            keep_alive: Some(Arc::new(client)),
            server: None,
            policy: IsErrorPolicy::default(),
            progress: None,
        }
    }

    /// Uses a client peer whose connection is kept alive elsewhere. As with
    /// [`new`](Self::new), progress needs [`with_progress_router`](Self::with_progress_router).
    #[must_use]
    pub fn from_peer(peer: Peer<RoleClient>) -> Self {
        McpClientService {
            peer,
            keep_alive: None,
            server: None,
            policy: IsErrorPolicy::default(),
            progress: None,
        }
    }

    /// The client configuration [`connect`](Self::connect) uses: rmcp's default, with the
    /// tasks extension (`io.modelcontextprotocol/tasks`) declared, so a server may answer
    /// a long `tools/call` with a task that the service then follows to its end. Use it
    /// (or declare the extension yourself) for a client given to [`new`](Self::new).
    #[must_use]
    pub fn client_config() -> ClientConfig {
        let mut config = ClientConfig::default();
        // Set by hand: rmcp's capability builder is only built with its `server` feature.
        config
            .capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(TASKS_EXTENSION_ID.to_owned(), Default::default());
        config
    }

    /// Connects an `rmcp` client configured by [`client_config`](Self::client_config)
    /// over `transport` (a `tokio::io::duplex` half, a child process, a stream) and takes
    /// it over. Its handler forwards the server's progress notifications to the calls
    /// ([`WithProgress`]). A failed handshake is `CONNECTION_FAILED`, its message cut at
    /// [`MAX_MESSAGE`](crate::MAX_MESSAGE) bytes (it may quote the server's answer); so
    /// is a server that chose a protocol version rmcp does not know
    /// (`ProtocolVersion::KNOWN_VERSIONS`): the connection is closed, as the MCP
    /// lifecycle asks of a client.
    pub async fn connect<T, E, A>(transport: T) -> Result<Self, ToolError>
    where
        T: IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let handler = WithProgress::new(Self::client_config());
        let router = handler.router().clone();
        let client = handler.serve(transport).await.map_err(|e| {
            // rmcp quotes the server's answer in its handshake error: cut, as any text
            // from a server is, so a server cannot make the error any size.
            let message = format!("mcp handshake failed: {}", capped(&e.to_string()));
            ToolError::new(ErrorKind::ConnectionFailed, message).with_source(e)
        })?;
        // MCP lifecycle: a client that does not support the version the server chose
        // should disconnect. rmcp takes whatever the server answers.
        let chosen = client.peer_info().map(|info| info.protocol_version.clone());
        if let Some(version) = chosen.filter(|v| !ProtocolVersion::KNOWN_VERSIONS.contains(v)) {
            let message = format!(
                "mcp handshake failed: the server chose protocol version `{}`, which this \
                 client does not support",
                capped(version.as_str())
            );
            // Closes the transport; how the service loop ended tells nothing more.
            let _ = client.cancel().await;
            return Err(ToolError::new(ErrorKind::ConnectionFailed, message));
        }
        Ok(McpClientService::new(client).with_progress_router(router))
    }

    /// Registers each call's progress token (and task) in `router` while the call runs,
    /// so the progress notifications that the client's handler gives `router` reach the
    /// call. Use the router of the [`WithProgress`] handler of this service's client (one
    /// router per connection).
    #[must_use]
    pub fn with_progress_router(mut self, router: ProgressRouter) -> Self {
        self.progress = Some(router);
        self
    }

    /// The router this service registers its calls in, if any.
    pub fn progress_router(&self) -> Option<&ProgressRouter> {
        self.progress.as_ref()
    }

    /// Strips `{server}__` from tool names before calling (the MCP-style names of
    /// `RouterBuilder::server`).
    #[must_use]
    pub fn with_server(mut self, server: &str) -> Self {
        self.server = Some(Arc::from(format!("{server}__")));
        self
    }

    /// Sets what an `isError: true` result becomes (default: [`IsErrorPolicy::Keep`]).
    #[must_use]
    pub fn is_error_policy(mut self, policy: IsErrorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The client peer.
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// The name sent to the server for a call of `tool`.
    pub fn mcp_name<'a>(&self, tool: &'a str) -> &'a str {
        match &self.server {
            Some(prefix) => tool.strip_prefix(&**prefix).unwrap_or(tool),
            None => tool,
        }
    }

    /// A service that always calls `tool` on this server, whatever the request's name.
    pub fn tool(&self, tool: &str) -> McpTool {
        McpTool {
            client: self.clone(),
            name: Arc::from(tool),
        }
    }

    fn call_named(&self, name: &str, req: ToolRequest) -> McpFuture {
        let peer = self.peer.clone();
        // The future keeps the connection alive too: `oneshot` drops the service first.
        let keep_alive = self.keep_alive.clone();
        let policy = self.policy;
        let progress_router = self.progress.clone();
        let name = name.to_owned();
        Box::pin(async move {
            let arguments = match req.payload() {
                Value::Object(map) => Some(map.clone()),
                Value::Null => None,
                _ => {
                    return Err(ToolError::invalid_input(format!(
                        "mcp tool `{name}` takes an object of arguments"
                    )))
                }
            };
            // A transport closed before the call sends nothing: safe to repeat, whatever
            // the kind. Closed after this point, the server may have the request.
            if peer.is_transport_closed() {
                return Err(ToolError::new(
                    ErrorKind::ConnectionFailed,
                    format!("mcp transport closed before calling `{name}`"),
                ));
            }
            let token = req.attempt_token();
            // Cancelled before sending: nothing to tell the server.
            if token.is_cancelled() {
                return Err(ToolError::cancelled(format!(
                    "mcp call of `{name}` cancelled"
                )));
            }
            // Set by the idempotency layer on a call it claimed; see docs/mcp.md, "Resuming
            // a task after a crash".
            let resume = req.call_state().and_then(CallState::resume);
            // A takeover of a claim whose owner died while following a task: follow that
            // task, never call the tool again.
            if let Some(task_id) = resume.and_then(|r| r.resume_from()) {
                // No request token to watch: the task's polls and status notifications
                // are its heartbeats.
                let progress = ProgressWatch::new(progress_router.as_ref(), req.progress());
                let task = TaskCall {
                    peer: &peer,
                    name: &name,
                    token,
                    deadline: req.deadline_at(),
                    kind: req.call_kind(),
                    policy,
                    progress: &progress,
                    resume,
                };
                return task.resume(task_id).await;
            }
            let mut params = CallToolRequestParams::new(name.clone());
            params.arguments = arguments;
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let kind = req.call_kind();
            let handle = peer
                .send_cancellable_request(request, PeerRequestOptions::no_options())
                .await
                .map_err(|e| map_call_error(&name, e, kind))?;
            // From here the server may be working on it: until the answer arrives, a fired
            // token or a dropped future sends `notifications/cancelled` (once).
            let mut notice = CancelNotice::new(peer.clone(), handle.id.clone());
            // Until the call ends (a task too: its reports keep this token) or its future
            // is dropped, the server's reports for this token reach the call's handle.
            let mut progress = ProgressWatch::new(progress_router.as_ref(), req.progress());
            progress.call(&handle.progress_token);
            let answer = tokio::select! {
                // The answer first: one already in when the token fires is returned, not
                // thrown away (the tool ran; a mutation's result would be lost to an
                // unknown outcome), and the server is never told to cancel a request it
                // has answered.
                biased;
                r = handle.await_response() => r,
                () = token.cancelled() => {
                    notice.cancel();
                    return Err(ToolError::cancelled(format!(
                        "mcp call of `{name}` cancelled"
                    )))
                }
            };
            notice.disarm();
            let response = match answer {
                Ok(ServerResult::CallToolResult(result)) => map_result(&name, result, policy),
                Ok(ServerResult::CreateTaskResult(created)) => {
                    TaskCall {
                        peer: &peer,
                        name: &name,
                        token,
                        deadline: req.deadline_at(),
                        kind,
                        policy,
                        progress: &progress,
                        resume,
                    }
                    .follow(created)
                    .await
                }
                Ok(ServerResult::InputRequiredResult(_)) => {
                    Err(ToolError::execution_failed(format!(
                    "mcp tool `{name}` asked for client input, which this client does not support"
                )))
                }
                Ok(_) => {
                    let message = format!(
                        "mcp tool `{name}` answered with something other than a tool result"
                    );
                    // The server took the call: a mutation may have run, so its key is
                    // kept (a plain failure would free it for a repeat to run it again).
                    Err(if kind == CallKind::Mutating {
                        ToolError::new(ErrorKind::OutcomeUnknown, message)
                    } else {
                        ToolError::execution_failed(message)
                    })
                }
                Err(e) => Err(map_call_error(&name, e, kind)),
            };
            drop(progress);
            drop(keep_alive);
            response
        })
    }
}

impl Service<ToolRequest> for McpClientService {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = McpFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        // A closed connection is reported by `call` (CONNECTION_FAILED), never here:
        // an error from `poll_ready` is fatal to `Buffer` and friends.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> McpFuture {
        let name = self.mcp_name(req.tool()).to_owned();
        self.call_named(&name, req)
    }
}

/// One tool of an MCP server: calls that tool whatever the request's name (register it
/// under a local name with `RouterBuilder::tool`). Made by [`McpClientService::tool`].
#[derive(Clone, Debug)]
pub struct McpTool {
    client: McpClientService,
    name: Arc<str>,
}

impl McpTool {
    /// The MCP tool name this service calls.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client it calls through.
    pub fn get_ref(&self) -> &McpClientService {
        &self.client
    }
}

impl Service<ToolRequest> for McpTool {
    type Response = ToolResponse;
    type Error = ToolError;
    type Future = McpFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> McpFuture {
        self.client.call_named(&self.name, req)
    }
}
