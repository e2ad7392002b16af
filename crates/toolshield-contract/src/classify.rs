//! Classification, kept apart from action: a [`Classify`] turns the result of a call into
//! an [`Outcome`]; retry and breaker act on the outcome.

use std::time::Duration;

use crate::{ErrorKind, ShieldResponse, ToolError};

/// A failed call, as the layers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The canonical kind.
    pub kind: ErrorKind,
    /// Whether calling again may succeed.
    pub retriable: bool,
    /// Whether a circuit breaker counts it against the tool.
    pub counts_for_breaker: bool,
    /// The wait the tool asked for, if any.
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// A failure with the kind's own retry and breaker rules.
    pub const fn of_kind(kind: ErrorKind) -> Failure {
        Failure {
            kind,
            retriable: kind.is_retriable(),
            counts_for_breaker: kind.counts_for_breaker(),
            retry_after: None,
        }
    }
}

/// What a call's result means to the layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded.
    Success,
    /// The call failed.
    Failure(Failure),
    /// The call failed in a way that says nothing about the tool's health and must not be
    /// repeated (invalid input, not found, a circuit-open rejection): neither retried nor
    /// counted.
    Ignored,
    /// The caller cancelled the call: never retried, never counted.
    Cancelled,
}

impl Outcome {
    /// Whether the call succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success)
    }

    /// Whether a retry may help.
    pub fn is_retriable(&self) -> bool {
        matches!(self, Outcome::Failure(f) if f.retriable)
    }

    /// Whether a circuit breaker counts this as a failure.
    pub fn counts_as_failure(&self) -> bool {
        matches!(self, Outcome::Failure(f) if f.counts_for_breaker)
    }

    /// The wait the tool asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Failure(f) => f.retry_after,
            _ => None,
        }
    }

    /// The error kind of a failure.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Outcome::Failure(f) => Some(f.kind),
            Outcome::Cancelled => Some(ErrorKind::Cancelled),
            _ => None,
        }
    }
}

/// Turns the result of a call into an [`Outcome`].
///
/// Implemented by [`DefaultClassifier`] and by any `Fn(&Result<Res, ToolError>) -> Outcome`,
/// so a user can, say, retry on an output that failed validation without forking a layer.
pub trait Classify<Res> {
    /// Classifies one result.
    fn classify(&self, result: &Result<Res, ToolError>) -> Outcome;
}

impl<Res, F> Classify<Res> for F
where
    F: Fn(&Result<Res, ToolError>) -> Outcome,
{
    fn classify(&self, result: &Result<Res, ToolError>) -> Outcome {
        self(result)
    }
}

/// The default rules: an error is classified by its [`ErrorKind`]; a successful response
/// that carries an in-band failure (an MCP `isError: true`, an HTTP 503) is a failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl DefaultClassifier {
    /// Classifies an error by its kind.
    pub fn classify_error(error: &ToolError) -> Outcome {
        let kind = error.kind();
        if kind == ErrorKind::Cancelled {
            return Outcome::Cancelled;
        }
        if !kind.is_retriable() && !kind.counts_for_breaker() {
            return Outcome::Ignored;
        }
        Outcome::Failure(Failure {
            retry_after: error.retry_after(),
            ..Failure::of_kind(kind)
        })
    }
}

impl<Res: ShieldResponse> Classify<Res> for DefaultClassifier {
    #[inline]
    fn classify(&self, result: &Result<Res, ToolError>) -> Outcome {
        match result {
            Ok(res) => match res.in_band_failure() {
                None => Outcome::Success,
                Some(f) => Outcome::Failure(Failure {
                    retry_after: f.retry_after,
                    ..Failure::of_kind(f.kind)
                }),
            },
            Err(e) => DefaultClassifier::classify_error(e),
        }
    }
}
