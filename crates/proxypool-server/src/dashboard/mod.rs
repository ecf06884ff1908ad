//! The dashboard: one HTML page with a little JavaScript that polls `GET /v1/snapshot` and
//! draws it. Served from the binary; no build step.

use axum::response::Html;

const PAGE: &str = include_str!("index.html");

/// `GET /`.
pub(crate) async fn page() -> Html<&'static str> {
    Html(PAGE)
}
