//! The server's progress reaches the call: `notifications/progress` for a call's progress
//! token, and `notifications/tasks` for its task, are forwarded to the call's
//! [`Progress`] handle, which resets the idle limit of the attempt timeout and is counted
//! for provenance.
//!
//! rmcp hands every notification to the client's handler, not to the request that caused
//! it; [`ProgressRouter`] maps the progress token (and the task id) of each call in
//! flight to that call's handle, and [`WithProgress`] is the handler that feeds it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

// Sampling, roots and logging are deprecated in rmcp; the handler still delegates them.
use rmcp::model::{
    CancelledNotificationParam, ClientConfig, CustomNotification, CustomRequest, CustomResult,
    ElicitRequestParams, ElicitResult, ProgressNotificationParam, ProgressToken,
    ResourceUpdatedNotificationParam, SubscriptionsAcknowledgedNotificationParams, TaskPayload,
    TaskStatusNotificationParams,
};
#[allow(deprecated)]
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, ListRootsResult,
    LoggingMessageNotificationParam,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData};
use toolshield_core::Progress;

/// One registered call (or task): its handle, and the registration that put it there, so
/// that a guard removes its own entry and never a later one.
struct Route {
    id: u64,
    progress: Progress,
}

#[derive(Default)]
struct Routes {
    next_id: u64,
    calls: HashMap<ProgressToken, Route>,
    tasks: HashMap<String, Route>,
}

/// Where a connection's progress notifications go: from a progress token (or a task id)
/// to the [`Progress`] handle of the call in flight that owns it.
///
/// [`McpClientService`](crate::McpClientService) registers each `tools/call` it sends
/// under the request's progress token, and the task it follows under the task id, for as
/// long as the call runs: the registration is removed when the call ends, is cancelled or
/// its future is dropped. A notification whose token or task nobody registered (another
/// request's, a finished call's, a made-up one) is dropped, and nothing is kept for it:
/// the map holds the calls in flight and nothing else.
///
/// Cheap to clone: clones share one map. One router per connection: progress tokens are
/// numbered per connection, so two connections sharing a router would mix their calls.
/// [`McpClientService::connect`](crate::McpClientService::connect) makes one; for a
/// client you build yourself, see [`WithProgress`].
#[derive(Clone, Default)]
pub struct ProgressRouter {
    routes: Arc<Mutex<Routes>>,
}

impl fmt::Debug for ProgressRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (calls, tasks) = {
            let routes = self.lock();
            (routes.calls.len(), routes.tasks.len())
        };
        f.debug_struct("ProgressRouter")
            .field("calls", &calls)
            .field("tasks", &tasks)
            .finish()
    }
}

impl ProgressRouter {
    /// An empty router.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many registrations are live: the progress tokens of calls in flight plus the
    /// tasks being followed.
    pub fn len(&self) -> usize {
        let routes = self.lock();
        routes.calls.len() + routes.tasks.len()
    }

    /// Whether no call is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forwards a `notifications/progress` to the call that owns its token, as
    /// `report(progress, total, message)`. Returns whether a call in flight took it.
    pub fn route_progress(&self, params: &ProgressNotificationParam) -> bool {
        let progress = self
            .lock()
            .calls
            .get(&params.progress_token)
            .map(|route| route.progress.clone());
        // Reported outside the lock: the report runs the caller's callback.
        match progress {
            Some(progress) => {
                progress.report(params.progress, params.total, params.message.as_deref());
                true
            }
            None => false,
        }
    }

    /// Forwards a `notifications/tasks` that says the task is still working, as a
    /// heartbeat (with the task's status message, if any) to the call that follows the
    /// task. Returns whether a call took it; other statuses are left to the call's next
    /// poll, which reads the outcome.
    pub fn route_task_status(&self, params: &TaskStatusNotificationParams) -> bool {
        if !matches!(params.task.payload, TaskPayload::Working) {
            return false;
        }
        let progress = self
            .lock()
            .tasks
            .get(&params.task.task.task_id)
            .map(|route| route.progress.clone());
        match progress {
            Some(progress) => {
                progress.report(None, None, params.task.task.status_message.as_deref());
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Routes> {
        // Nothing panics under this lock; a poisoned map is still consistent.
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register_call(&self, token: ProgressToken, progress: &Progress) -> u64 {
        self.register(|r| &mut r.calls, token, progress)
    }

    fn register_task(&self, task_id: String, progress: &Progress) -> u64 {
        self.register(|r| &mut r.tasks, task_id, progress)
    }

    fn remove_call(&self, token: &ProgressToken, id: u64) {
        self.remove(|r| &mut r.calls, token, id);
    }

    fn remove_task(&self, task_id: &str, id: u64) {
        self.remove(|r| &mut r.tasks, task_id, id);
    }

    /// Puts `progress` under `key` in the map `pick` chooses, replacing any earlier
    /// registration; the id of this one.
    fn register<K: Hash + Eq>(
        &self,
        pick: impl FnOnce(&mut Routes) -> &mut HashMap<K, Route>,
        key: K,
        progress: &Progress,
    ) -> u64 {
        let mut routes = self.lock();
        let id = next_id(&mut routes);
        let route = Route {
            id,
            progress: progress.clone(),
        };
        let replaced = pick(&mut routes).insert(key, route);
        // Handles are dropped outside the lock.
        drop(routes);
        drop(replaced);
        id
    }

    /// Removes the registration `id` of `key`, and nothing registered after it.
    fn remove<K, Q>(
        &self,
        pick: impl FnOnce(&mut Routes) -> &mut HashMap<K, Route>,
        key: &Q,
        id: u64,
    ) where
        K: Hash + Eq + Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut routes = self.lock();
        let map = pick(&mut routes);
        let removed = if map.get(key).is_some_and(|r| r.id == id) {
            map.remove(key)
        } else {
            None
        };
        drop(routes);
        drop(removed);
    }
}

fn next_id(routes: &mut Routes) -> u64 {
    routes.next_id = routes.next_id.wrapping_add(1);
    routes.next_id
}

/// The progress side of one call: the call's handle, and its registrations in the
/// router, removed when this is dropped (the call ended, was cancelled, or its future was
/// dropped).
pub(crate) struct ProgressWatch {
    progress: Progress,
    /// `None` when nothing would come of a report (no router, or nobody observes the call
    /// and no idle limit runs): then nothing is registered.
    router: Option<ProgressRouter>,
    call: Option<(ProgressToken, u64)>,
}

impl ProgressWatch {
    /// The watch of a call whose request carries `progress`.
    pub(crate) fn new(router: Option<&ProgressRouter>, progress: &Progress) -> Self {
        let useful = progress.is_observed() || progress.idle_clock().is_some();
        ProgressWatch {
            progress: progress.clone(),
            router: router.filter(|_| useful).cloned(),
            call: None,
        }
    }

    /// Routes the reports carrying `token` (the `tools/call`'s progress token) to the call,
    /// until this watch is dropped. MCP keeps the token valid for the life of a task the
    /// call turns into, so it stays registered while the task is followed.
    pub(crate) fn call(&mut self, token: &ProgressToken) {
        if let Some(router) = &self.router {
            if let Some((old, id)) = self.call.take() {
                router.remove_call(&old, id);
            }
            let id = router.register_call(token.clone(), &self.progress);
            self.call = Some((token.clone(), id));
        }
    }

    /// Routes the working status notifications of `task_id` to the call, until the
    /// returned guard is dropped.
    pub(crate) fn task(&self, task_id: &str) -> TaskWatch {
        let route = self.router.as_ref().map(|router| {
            (
                router.clone(),
                router.register_task(task_id.to_owned(), &self.progress),
            )
        });
        TaskWatch {
            route,
            task_id: task_id.to_owned(),
        }
    }

    /// A poll showed the task still working: a heartbeat, with the task's status message.
    pub(crate) fn working(&self, message: Option<&str>) {
        self.progress.report(None, None, message);
    }
}

impl Drop for ProgressWatch {
    fn drop(&mut self) {
        if let (Some(router), Some((token, id))) = (&self.router, &self.call) {
            router.remove_call(token, *id);
        }
    }
}

/// Removes a task's registration when dropped.
#[must_use = "dropping the guard at once stops the task's status notifications"]
pub(crate) struct TaskWatch {
    route: Option<(ProgressRouter, u64)>,
    task_id: String,
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        if let Some((router, id)) = &self.route {
            router.remove_task(&self.task_id, *id);
        }
    }
}

/// A client handler that forwards the server's progress to the calls of a
/// [`McpClientService`](crate::McpClientService), and otherwise behaves exactly as `H`.
///
/// `on_progress` and `on_task_status` give the notification to the [`ProgressRouter`]
/// first, then to `H`; every other method is `H`'s. [`McpClientService::connect`]
/// uses `WithProgress<ClientConfig>`. With a handler of your own:
///
/// ```
/// # async fn demo(transport: tokio::io::DuplexStream) -> Result<(), Box<dyn std::error::Error>> {
/// use rmcp::ServiceExt;
/// use toolshield_mcp::{McpClientService, WithProgress};
///
/// let handler = WithProgress::new(McpClientService::client_config()); // or your own handler
/// let router = handler.router().clone();
/// let client = handler.serve(transport).await?;
/// let service = McpClientService::new(client).with_progress_router(router);
/// # drop(service); Ok(()) }
/// ```
///
/// [`McpClientService::connect`]: crate::McpClientService::connect
#[derive(Clone, Debug, Default)]
pub struct WithProgress<H> {
    inner: H,
    router: ProgressRouter,
}

impl<H> WithProgress<H> {
    /// Wraps `inner`, with a new router.
    #[must_use]
    pub fn new(inner: H) -> Self {
        WithProgress {
            inner,
            router: ProgressRouter::new(),
        }
    }

    /// The router to give the service ([`McpClientService::with_progress_router`](crate::McpClientService::with_progress_router)).
    pub fn router(&self) -> &ProgressRouter {
        &self.router
    }

    /// The wrapped handler.
    pub fn get_ref(&self) -> &H {
        &self.inner
    }

    /// The wrapped handler, mutably.
    pub fn get_mut(&mut self) -> &mut H {
        &mut self.inner
    }

    /// Unwraps the handler.
    pub fn into_inner(self) -> H {
        self.inner
    }
}

#[allow(deprecated)]
impl<H: ClientHandler> ClientHandler for WithProgress<H> {
    fn ping(
        &self,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.ping(context)
    }

    fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<CreateMessageResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.create_message(params, context)
    }

    fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ListRootsResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.list_roots(context)
    }

    fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ElicitResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.create_elicitation(request, context)
    }

    fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<CustomResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.on_custom_request(request, context)
    }

    fn on_cancelled(
        &self,
        params: CancelledNotificationParam,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_cancelled(params, context)
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.router.route_progress(&params);
        self.inner.on_progress(params, context)
    }

    fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_logging_message(params, context)
    }

    fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_resource_updated(params, context)
    }

    fn on_resource_list_changed(
        &self,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_resource_list_changed(context)
    }

    fn on_tool_list_changed(
        &self,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_tool_list_changed(context)
    }

    fn on_prompt_list_changed(
        &self,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_prompt_list_changed(context)
    }

    fn on_subscriptions_acknowledged(
        &self,
        params: SubscriptionsAcknowledgedNotificationParams,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_subscriptions_acknowledged(params, context)
    }

    fn on_task_status(
        &self,
        params: TaskStatusNotificationParams,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.router.route_task_status(&params);
        self.inner.on_task_status(params, context)
    }

    fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_custom_notification(notification, context)
    }

    fn get_info(&self) -> ClientConfig {
        self.inner.get_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{DetailedTask, NumberOrString, Task, TaskStatus};

    fn token(n: i64) -> ProgressToken {
        ProgressToken(NumberOrString::Number(n))
    }

    fn observed() -> Progress {
        let mut p = Progress::new();
        p.observe();
        p
    }

    fn status(id: &str, payload: TaskPayload) -> TaskStatusNotificationParams {
        let stamp = "2026-01-01T00:00:00Z";
        TaskStatusNotificationParams::new(DetailedTask::new(
            Task::new(id, TaskStatus::Working, stamp, stamp),
            payload,
        ))
    }

    #[test]
    fn reports_reach_only_the_call_that_owns_the_token() {
        let router = ProgressRouter::new();
        let (a, b) = (observed(), observed());
        let mut wa = ProgressWatch::new(Some(&router), &a);
        wa.call(&token(1));
        let mut wb = ProgressWatch::new(Some(&router), &b);
        wb.call(&token(2));

        assert!(router.route_progress(&ProgressNotificationParam::new(token(1), 0.5)));
        assert!(!router.route_progress(&ProgressNotificationParam::new(token(3), 0.5)));
        assert_eq!((a.reports(), b.reports()), (1, 0));

        drop(wa);
        assert!(!router.route_progress(&ProgressNotificationParam::new(token(1), 0.7)));
        assert_eq!(a.reports(), 1, "nothing after the call ended");
        assert_eq!(router.len(), 1);
        drop(wb);
        assert!(router.is_empty());
    }

    #[test]
    fn unknown_tokens_and_tasks_grow_nothing() {
        let router = ProgressRouter::new();
        for n in 0..10_000 {
            router.route_progress(&ProgressNotificationParam::new(token(n), 1.0));
            router.route_task_status(&status(&n.to_string(), TaskPayload::Working));
        }
        assert!(router.is_empty());
    }

    #[test]
    fn a_replaced_registration_is_not_removed_by_the_old_guard() {
        // A server that reuses a task id: the later call keeps its registration.
        let router = ProgressRouter::new();
        let (first, second) = (observed(), observed());
        let w1 = ProgressWatch::new(Some(&router), &first);
        let w2 = ProgressWatch::new(Some(&router), &second);
        let t1 = w1.task("same");
        let t2 = w2.task("same");
        drop(t1);
        assert!(router.route_task_status(&status("same", TaskPayload::Working)));
        assert_eq!((first.reports(), second.reports()), (0, 1));
        drop(t2);
        assert!(router.is_empty());
    }

    #[test]
    fn only_a_working_status_is_a_heartbeat() {
        let router = ProgressRouter::new();
        let p = observed();
        let watch = ProgressWatch::new(Some(&router), &p);
        let _task = watch.task("t");
        assert!(!router.route_task_status(&status("t", TaskPayload::Cancelled)));
        assert!(router.route_task_status(&status("t", TaskPayload::Working)));
        assert_eq!(p.reports(), 1);
    }

    #[test]
    fn an_unobserved_call_without_an_idle_clock_is_not_registered() {
        let router = ProgressRouter::new();
        let mut watch = ProgressWatch::new(Some(&router), &Progress::new());
        watch.call(&token(1));
        let _task = watch.task("t");
        assert!(router.is_empty());
    }
}
