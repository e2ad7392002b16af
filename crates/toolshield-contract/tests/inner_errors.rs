//! `IntoToolError`: what the layers make of an inner service's error. Anything tower's
//! middleware takes (`Into<BoxError>`) is taken; a `ToolError` passes unchanged, other
//! errors are classified by what they hold.

use std::fmt;
use std::time::Duration;

use toolshield_contract::{BoxError, ErrorKind, IntoToolError, ToolError};

/// An error type of another crate: no `From` into `ToolError` exists or can be written.
#[derive(Debug)]
struct Foreign(&'static str, Option<std::io::Error>);

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Foreign {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_ref().map(|e| e as _)
    }
}

#[test]
fn a_tool_error_passes_with_every_field_kept() {
    let own = ToolError::new(ErrorKind::RateLimited, "slow down")
        .with_retry_after(Duration::from_secs(7))
        .with_attempts(3);
    let back = own.clone().into_tool_error();
    assert_eq!(back.kind(), ErrorKind::RateLimited);
    assert_eq!(back.message(), "slow down");
    assert_eq!(back.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(back.attempts(), 3);
}

#[test]
fn a_boxed_tool_error_comes_back_as_itself() {
    let boxed: BoxError = Box::new(ToolError::new(ErrorKind::NotFound, "no row"));
    let back = boxed.into_tool_error();
    assert_eq!(back.kind(), ErrorKind::NotFound);
    assert_eq!(back.message(), "no row");
}

#[test]
fn a_foreign_error_is_execution_failed_with_its_text_and_source() {
    let e = Foreign("the widget broke", None).into_tool_error();
    assert_eq!(e.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(e.message(), "the widget broke");
    let source = std::error::Error::source(&e).expect("the error is kept as the source");
    assert!(source.is::<Foreign>());
}

#[test]
fn a_foreign_error_holding_an_io_error_is_classified_by_it() {
    let e = Foreign(
        "connect failed",
        Some(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
    )
    .into_tool_error();
    assert_eq!(e.kind(), ErrorKind::ConnectionFailed);
    let timed_out = Foreign(
        "read failed",
        Some(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    )
    .into_tool_error();
    assert_eq!(timed_out.kind(), ErrorKind::Timeout);
}

#[test]
fn text_errors_are_taken_as_tower_takes_them() {
    assert_eq!(
        "no route to tool".into_tool_error().kind(),
        ErrorKind::ExecutionFailed
    );
    let e = String::from("upstream said no").into_tool_error();
    assert_eq!(e.message(), "upstream said no");
}

#[test]
fn tower_and_tokio_errors_keep_their_kinds() {
    let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
    assert_eq!(elapsed.into_tool_error().kind(), ErrorKind::Timeout);
    assert_eq!(
        tower::timeout::error::Elapsed::new()
            .into_tool_error()
            .kind(),
        ErrorKind::Timeout
    );
    assert_eq!(
        tower::load_shed::error::Overloaded::new()
            .into_tool_error()
            .kind(),
        ErrorKind::Overloaded
    );
}

#[cfg(feature = "serde_json")]
#[test]
fn a_json_error_is_invalid_input_without_the_values_it_quotes() {
    let json = serde_json::from_str::<u64>("\"4111-1111\"").unwrap_err();
    let e = json.into_tool_error();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(!e.message().contains("4111"), "{}", e.message());
}

/// An error whose chain of sources leads back to itself, as a faulty error
/// type's may.
#[derive(Debug)]
struct Loop;

impl fmt::Display for Loop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("loops")
    }
}

impl std::error::Error for Loop {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self)
    }
}

#[test]
fn a_chain_of_sources_that_loops_is_read_a_bounded_depth() {
    // Before the bound this never returned.
    let e = Loop.into_tool_error();
    assert_eq!(e.kind(), ErrorKind::ExecutionFailed);
    assert_eq!(e.message(), "loops");
}

/// An error whose text is a whole response body.
#[derive(Debug)]
struct Wordy(usize);

impl fmt::Display for Wordy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for _ in 0..self.0 {
            f.write_str("é")?;
        }
        Ok(())
    }
}

impl std::error::Error for Wordy {}

/// An error whose text never ends unless the writer refuses more.
#[derive(Debug)]
struct Endless;

impl fmt::Display for Endless {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        loop {
            f.write_str("again ")?;
        }
    }
}

impl std::error::Error for Endless {}

#[test]
fn an_inner_errors_text_becomes_a_message_of_bounded_size() {
    use toolshield_contract::MAX_SOURCE_MESSAGE;
    let long = Wordy(1_000_000).into_tool_error();
    assert!(long.message().len() <= MAX_SOURCE_MESSAGE + '…'.len_utf8());
    assert!(long.message().ends_with('…'));
    assert!(long.message().starts_with("éé"));
    let short = Wordy(3).into_tool_error();
    assert_eq!(short.message(), "ééé");
    let endless = Endless.into_tool_error();
    assert!(endless.message().len() <= MAX_SOURCE_MESSAGE + '…'.len_utf8());
    let io = std::io::Error::other(Wordy(100_000));
    let via_from = ToolError::from(io);
    assert!(via_from.message().len() <= MAX_SOURCE_MESSAGE + '…'.len_utf8());
}
