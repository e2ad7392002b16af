//! [`LogCapture`]: what a `fmt` subscriber writes, kept for the test to read.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

/// A writer that keeps every byte written to it; clones share the buffer. Give a clone
/// to `tracing_subscriber::fmt().with_writer(move || capture.clone())` and read the log
/// back with [`text`](Self::text).
///
/// ```
/// use std::io::Write;
/// use toolshield_test::LogCapture;
///
/// let logs = LogCapture::default();
/// let mut writer = logs.clone();
/// writeln!(writer, "WARN idempotency: running without dedupe").unwrap();
/// assert!(logs.text().contains("without dedupe"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything written so far.
    ///
    /// # Panics
    ///
    /// If what was written is not UTF-8 (a `fmt` subscriber writes UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8(self.lock().clone()).expect("the captured log is UTF-8")
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
