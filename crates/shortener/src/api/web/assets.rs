//! The stylesheet and scripts, compiled into the binary.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Name, content type, content.
const ASSETS: [(&str, &str, &str); 3] = [
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
