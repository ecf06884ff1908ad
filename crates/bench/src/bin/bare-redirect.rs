//! The baseline of the redirect benchmarks: a bare hyper 1.x server that answers every
//! request with the same 302. Nothing a real shortener must do (routing, lookup, counting) —
//! the ceiling of this machine for an HTTP/1.1 redirect in Rust.

use bytes::Bytes;
use http_body_util::Empty;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let service = service_fn(|_request| async {
                let mut response = Response::new(Empty::<Bytes>::new());
                *response.status_mut() = StatusCode::FOUND;
                response.headers_mut().insert(
                    header::LOCATION,
                    header::HeaderValue::from_static("https://example.com/destination"),
                );
                Ok::<_, Infallible>(response)
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
