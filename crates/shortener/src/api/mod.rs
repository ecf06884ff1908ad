//! The HTTP API: routes, shared state, and the handlers of each path.

pub(crate) mod audit;
mod auth;
mod challenge;
mod changes;
mod error;
mod json;
mod links;
mod listing;
mod openapi;
mod ops;
mod qr;
pub(crate) mod redirect;
mod reports;
mod web;

use crate::allocator::CodeAllocator;
use crate::bots::BotDetector;
use crate::cache::LinkCache;
use crate::clicks::ClickRecorder;
use crate::feeds::{LoadedFeeds, Swapped};
use crate::metrics::Metrics;
use crate::ratelimit::CreateLimits;
use crate::store::Store;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderValue;
use axum::routing::{get, post};
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct App {
    pub store: Arc<dyn Store>,
    pub cache: LinkCache,
    pub bots: BotDetector,
    /// Bots' clicks are not recorded at all (instead of counted apart).
    pub drop_bot_clicks: bool,
    /// `--geoip` was given: analytics has a `countries` breakdown.
    pub countries: bool,
    pub allocator: CodeAllocator,
    pub clicks: ClickRecorder,
    pub limits: CreateLimits,
    pub policy: shortener_core::long_url::UrlPolicy,
    /// Threat feeds: destinations nobody may link to.
    pub threats: Swapped<LoadedFeeds>,
    /// Links to these domains are never disabled automatically.
    pub trusted_domains: Swapped<shortener_core::long_url::Blocklist>,
    /// The CAPTCHA of anonymous creation.
    pub captcha: crate::captcha::Captcha,
    /// When reports disable a link.
    pub auto_disable: shortener_core::report::AutoDisable,
    pub metrics: Arc<Metrics>,
    /// Prefix of short URLs, without a trailing slash.
    pub base_url: String,
    pub no_anonymous: bool,
    pub trust_forwarded_for: bool,
    /// 302, or 301 with an edge cache TTL (`--edge-status`).
    pub redirect_status: axum::http::StatusCode,
    /// `Cache-Control` of redirects.
    pub cache_control: HeaderValue,
    /// The shared parts, in the scale-out mode.
    pub scaleout: Option<crate::scaleout::Scaleout>,
    /// The read replicas, when there are any (`/readyz` names those in use).
    pub replicas: Option<Arc<crate::store::replicas::Replicated>>,
    /// Largest accepted API request body (`--max-body-bytes`).
    pub max_body_bytes: usize,
    /// Tokens whose last use this process recorded lately.
    pub token_uses: auth::TokenUses,
    /// Tokens found in the store less than [`auth::TOKEN_TTL`] ago.
    pub tokens: auth::TokenCache,
    /// Signs the web app's session and CSRF cookies; kept in the store, so every instance
    /// accepts the sessions of every other.
    pub web_key: Vec<u8>,
    /// Hides the creation order in the link list's cursors, under a key kept in the store
    /// (every instance reads every other's cursors).
    pub cursor_cipher: shortener_core::listing::CursorCipher,
}

pub(crate) type AppState = Arc<App>;

/// The store's name of [`App::web_key`].
pub(crate) const WEB_KEY_NAME: &str = "web_session_key";

/// The store's name of the key of [`App::cursor_cipher`].
pub(crate) const CURSOR_KEY_NAME: &str = "link_cursor_key";

pub(crate) use changes::check_reason;

/// The whole router.
/// Single-segment paths the router serves itself; every other `GET`/`HEAD /{segment}` is a
/// redirect, answered before the router (see `server.rs`).
pub(crate) const OWN_SINGLE_SEGMENT_PATHS: [&str; 4] = ["healthz", "readyz", "metrics", "_"];

pub(crate) fn router(app: AppState) -> Router {
    // Only the API reads bodies; the redirect route skips the body-limit layer's per-request
    // bookkeeping.
    let api = Router::new()
        .route("/api/v1/links", post(links::create).get(listing::list))
        .route(
            "/api/v1/links/{code}",
            get(links::info)
                .delete(changes::delete)
                .patch(changes::edit),
        )
        .route("/api/v1/links/{code}/disable", post(changes::disable))
        .route("/api/v1/links/{code}/enable", post(changes::enable))
        .route("/api/v1/links/{code}/analytics", get(links::analytics))
        .route(
            "/api/v1/links/{code}/analytics.csv",
            get(links::analytics_csv),
        )
        .route("/api/v1/links/{code}/qr", get(qr::image))
        .route("/api/v1/audit", get(audit::list))
        .route("/api/v1/challenge", get(challenge::issue))
        .route("/api/v1/links/{code}/reports", post(reports::file))
        .route("/api/v1/reports", get(reports::queue))
        .route("/api/v1/reports/{id}/resolve", post(reports::resolve))
        .route("/api/v1/openapi.json", get(ops::openapi))
        .layer(DefaultBodyLimit::max(app.max_body_bytes));
    Router::new()
        .merge(api)
        .merge(web::routes())
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/{code}", get(redirect::follow))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(CatchPanicLayer::custom(error::panic_response))
        .with_state(app)
}
