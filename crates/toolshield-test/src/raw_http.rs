//! A hostile or broken HTTP peer written by hand on a raw TCP socket (127.0.0.1:0), for
//! the tests of the HTTP adapters: it reads each request's head and body, then does what
//! its [`Script`] says (bytes as they are, an endless chunked body, or a close), one
//! thread per connection, so it never depends on the client's runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server does once it has read a request's head (and its body).
#[derive(Clone, Debug)]
pub enum Script {
    /// Writes these bytes, then closes.
    Write(Vec<u8>),
    /// Writes the head, then chunks of 16 KiB forever (until the client goes away).
    Endless(&'static str),
    /// Closes without a byte.
    Close,
}

impl Script {
    /// [`Script::Write`] of `text`.
    pub fn raw(text: &str) -> Script {
        Script::Write(text.as_bytes().to_vec())
    }
}

/// A running [`serve`]: its address, how many requests it read, and their heads
/// (lower-cased), in the order read.
#[derive(Clone, Debug)]
pub struct RawServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests read whole (head and body).
    pub requests: Arc<AtomicUsize>,
    /// The heads of those requests, lower-cased.
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl RawServer {
    /// How many requests it has read whole.
    pub fn seen(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The heads read so far (lower-cased).
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().map(|h| h.clone()).unwrap_or_default()
    }
}

/// Reads one request (head, then `content-length` bytes of body): its head, lower-cased,
/// or `None` when the client went away first.
fn read_request(sock: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match sock.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match sock.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(head)
}

/// Runs `script` on one accepted connection.
fn answer(mut sock: TcpStream, script: Script, server: &RawServer) {
    let _ = sock.set_read_timeout(Some(Duration::from_secs(20)));
    let _ = sock.set_write_timeout(Some(Duration::from_secs(20)));
    let Some(head) = read_request(&mut sock) else {
        return;
    };
    if let Ok(mut heads) = server.heads.lock() {
        heads.push(head);
    }
    server.requests.fetch_add(1, Ordering::SeqCst);
    match script {
        Script::Write(bytes) => {
            let _ = sock.write_all(&bytes);
            let _ = sock.flush();
            // Lets the client read before the close.
            std::thread::sleep(Duration::from_millis(5));
        }
        Script::Endless(head) => {
            if sock.write_all(head.as_bytes()).is_err() {
                return;
            }
            let data = vec![b'x'; 16 * 1024];
            let size = format!("{:x}\r\n", data.len());
            while sock.write_all(size.as_bytes()).is_ok()
                && sock.write_all(&data).is_ok()
                && sock.write_all(b"\r\n").is_ok()
            {}
        }
        Script::Close => {}
    }
    // Dropping the socket closes it.
}

/// A server on 127.0.0.1:0 that runs `script` on every connection.
///
/// # Panics
/// When no loopback port can be bound (a test setup failure).
pub fn serve(script: Script) -> RawServer {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let server = RawServer {
        addr: listener.local_addr().expect("local address"),
        requests: Arc::default(),
        heads: Arc::default(),
    };
    let shared = server.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(sock) = sock else { return };
            let script = script.clone();
            let server = shared.clone();
            std::thread::spawn(move || answer(sock, script, &server));
        }
    });
    server
}
