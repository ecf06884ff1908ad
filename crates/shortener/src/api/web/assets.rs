//! The stylesheet and scripts, compiled into the binary.
//!
//! `altcha*` are the ALTCHA widget 2.3.0 from npm (`altcha@2.3.0`, tarball SHA-256
//! 559c584c…6c62c53d), copied unmodified from its `dist_external/`: the build whose styles
//! and proof-of-work worker are files of their own, so the strict policy needs no inline
//! style or `blob:` worker. 2.x, because 3.x speaks a newer challenge scheme than
//! `/api/v1/challenge`. Its licence ships beside it.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Name, content type, content.
const ASSETS: [(&str, &str, &str); 6] = [
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("assets/app.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    ),
    (
        "altcha.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/altcha.js"),
    ),
    (
        "altcha-worker.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/altcha-worker.js"),
    ),
    (
        "altcha.css",
        "text/css; charset=utf-8",
        include_str!("assets/altcha.css"),
    ),
    (
        "altcha-LICENSE.txt",
        "text/plain; charset=utf-8",
        include_str!("assets/altcha-LICENSE.txt"),
    ),
];

pub(super) async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => {
            let mut response = (*body).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            // Names do not change with the content: short enough that an upgrade shows soon.
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=300"),
            );
            response
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
