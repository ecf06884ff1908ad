//! The web app under `/_/` (`_` is outside the alias alphabet, so no code collides with it):
//! server-rendered pages over the same functions the API uses, a session cookie instead of
//! a bearer token, plain forms with POST-redirect-GET, assets embedded in the binary.
//! Scripts only add to pages that work without them (copy buttons; the CAPTCHA solver).

mod admin;
mod analytics;
mod assets;
mod layout;
mod link;
mod links;
mod session;

use super::AppState;
use super::error::ApiError;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

/// Largest form accepted: a destination of 2048 characters, percent-encoded, and the rest.
const FORM_LIMIT: usize = 16 * 1024;

/// No inline script or style, nothing from elsewhere; forms post only here; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A page that could not be rendered: the response to send instead.
#[derive(Debug)]
pub(super) struct Fail(Box<Response>);

impl Fail {
    pub(super) fn new(response: Response) -> Self {
        Self(Box::new(response))
    }
}

impl From<ApiError> for Fail {
    fn from(e: ApiError) -> Self {
        Self::new(layout::bare_error(e.status(), e.message()))
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// A form or query field as given: trimmed, and `None` when empty (an empty field means
/// "not given").
pub(super) fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// What a page handler answers.
pub(super) type Page = Result<Response, Fail>;

/// The web app's routes; `/` sends people here.
pub(super) fn routes() -> Router<AppState> {
    let pages = Router::new()
        .route("/_/", get(links::home))
        .route("/_/links", get(links::mine).post(links::create))
        .route("/_/links/{code}", get(link::show))
        .route(
            "/_/links/{code}/destination",
            post(link::change::<link::Destination>),
        )
        .route(
            "/_/links/{code}/disable",
            post(link::change::<link::Disable>),
        )
        .route("/_/links/{code}/enable", post(link::change::<link::Enable>))
        .route("/_/links/{code}/qr.svg", get(link::qr))
        .route("/_/links/{code}/analytics.csv", get(link::csv))
        .route("/_/signin", get(links::sign_in_form).post(links::sign_in))
        .route("/_/signout", post(links::sign_out))
        .route("/_/admin", get(admin::show))
        .route("/_/admin/reports/{id}/resolve", post(admin::resolve))
        .route("/_/assets/{name}", get(assets::serve))
        .route("/_/{*rest}", get(not_found))
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::map_response(security_headers));
    Router::new()
        .route("/", get(|| async { Redirect::to("/_/") }))
        .route("/_", get(|| async { Redirect::to("/_/") }))
        .merge(pages)
}

async fn not_found() -> Fail {
    Fail::new(layout::bare_error(
        StatusCode::NOT_FOUND,
        "There is no such page.",
    ))
}

/// Headers of every page, asset and redirect of the web app.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Destinations must not learn which page of ours linked to them.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
