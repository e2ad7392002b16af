//! The JSON-lines event file: a writer thread fed by a bounded channel, so a transition
//! (which emits its event with the breaker's transition lock held) never waits on the disk.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;

/// Lines queued for the writer before new events are dropped (and counted).
pub(crate) const QUEUE: usize = 1024;

pub(crate) enum Message {
    Line(String),
    /// Answered once every line queued before it is written and flushed.
    Flush(mpsc::Sender<()>),
}

/// The sending half; the writer thread ends when it is dropped, after writing what is
/// queued.
#[derive(Clone)]
pub(crate) struct EventLog {
    tx: SyncSender<Message>,
}

/// Why a line was not queued.
pub(crate) enum NotQueued {
    /// The writer is [`QUEUE`] lines behind.
    Full,
    /// The writer thread is gone.
    Closed,
}

impl EventLog {
    /// Starts the writer thread for `file`.
    pub(crate) fn start(file: File) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        thread::Builder::new()
            .name("toolshield-breaker-events".into())
            .spawn(move || write_lines(&rx, file))?;
        Ok(EventLog { tx })
    }

    /// Queues one line without waiting.
    pub(crate) fn try_send(&self, line: String) -> Result<(), NotQueued> {
        self.tx.try_send(Message::Line(line)).map_err(|e| match e {
            TrySendError::Full(_) => NotQueued::Full,
            TrySendError::Disconnected(_) => NotQueued::Closed,
        })
    }

    /// Blocks until every line queued before this call is written and flushed.
    pub(crate) fn flush(&self) {
        let (ack, done) = mpsc::channel();
        if self.tx.send(Message::Flush(ack)).is_ok() {
            // An error means the writer is gone: nothing more will be written.
            let _ = done.recv();
        }
    }
}

fn write_lines(rx: &Receiver<Message>, file: File) {
    let mut out = BufWriter::new(file);
    while let Ok(first) = rx.recv() {
        // Write what is queued already, then flush once.
        let mut next = Some(first);
        let mut acks = Vec::new();
        let mut result = Ok(());
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => {
                    if result.is_ok() {
                        result = out.write_all(line.as_bytes());
                    }
                }
                Message::Flush(ack) => acks.push(ack),
            }
            next = rx.try_recv().ok();
        }
        if let Err(error) = result.and_then(|()| out.flush()) {
            tracing::warn!(target: "toolshield::breaker", %error, "cannot append to the breaker event log");
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

#[cfg(test)]
impl EventLog {
    /// A log whose lines nobody writes: the receiver is handed back to the test.
    pub(crate) fn detached() -> (Self, Receiver<Message>) {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        (EventLog { tx }, rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_without_waiting_and_a_closed_one_says_so() {
        let (log, rx) = EventLog::detached();
        for i in 0..QUEUE {
            assert!(log.try_send(format!("{i}\n")).is_ok());
        }
        assert!(matches!(log.try_send("x\n".into()), Err(NotQueued::Full)));
        drop(rx);
        assert!(matches!(log.try_send("x\n".into()), Err(NotQueued::Closed)));
    }

    #[test]
    fn the_writer_appends_every_line_and_flush_waits_for_them() {
        let path = std::env::temp_dir().join(format!(
            "toolshield-event-log-{}-{}.jsonl",
            std::process::id(),
            line!()
        ));
        let _ = std::fs::remove_file(&path);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let log = EventLog::start(file).unwrap();
        for i in 0..100 {
            assert!(log.try_send(format!("{i}\n")).is_ok());
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let expected: String = (0..100).map(|i| format!("{i}\n")).collect();
        assert_eq!(text, expected);
        let _ = std::fs::remove_file(&path);
    }
}
