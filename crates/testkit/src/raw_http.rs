//! A raw TCP client for tests of misbehaving HTTP clients: half heads, trickled bodies,
//! oversized headers, pipelined requests — what no HTTP library sends.
//!
//! ```no_run
//! use std::io::Write;
//! let mut stream = testkit::raw_http::connect("127.0.0.1:8080");
//! stream.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
//! let answer = testkit::raw_http::read_to_close(&mut stream);
//! assert!(answer.starts_with("HTTP/1.1 "));
//! ```

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

/// Guard for reads: far beyond every limit a test sets, not a measurement.
pub const GUARD: Duration = Duration::from_secs(15);

/// A connection whose reads give up after [`GUARD`].
///
/// # Panics
/// When the connection cannot be made (a test helper).
pub fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(GUARD))
        .unwrap_or_else(|e| panic!("read timeout: {e}"));
    stream
}

/// Everything the server sends until it closes the connection.
///
/// # Panics
/// When the server keeps the connection open past [`GUARD`].
pub fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    match stream.read_to_end(&mut out) {
        Ok(_) => {}
        // A reset after bytes the server did not read counts as closed too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "the server kept the connection open ({e}); got {:?}",
            String::from_utf8_lossy(&out)
        ),
    }
    String::from_utf8_lossy(&out).into_owned()
}
