//! The frame of every page, and how pages and redirects are sent. Text goes into pages
//! through maud, which escapes it; nothing is pasted in as raw HTML.

use super::session::Visitor;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// A page: `title`, the navigation for `visitor`, then `body`.
pub(super) fn page(title: &str, visitor: &Visitor, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Shortener" }
                link rel="stylesheet" href="/_/assets/app.css";
                script src="/_/assets/app.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    nav aria-label="Main" {
                        a.brand href="/_/" { "Shortener" }
                        a href="/_/" { "New link" }
                        @if let Some(who) = &visitor.who {
                            a href="/_/links" { "My links" }
                            @if who.admin { a href="/_/admin" { "Admin" } }
                            span.who { "Signed in as " strong { (who.user) } }
                            form.inline method="post" action="/_/signout" {
                                input type="hidden" name="csrf" value=(visitor.csrf);
                                button.link type="submit" { "Sign out" }
                            }
                        } @else {
                            a href="/_/signin" { "Sign in" }
                        }
                    }
                }
                main id="main" tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// An error people can read, announced by screen readers.
pub(super) fn error_box(message: Option<&str>) -> Markup {
    html! {
        @if let Some(message) = message {
            p.error role="alert" { (message) }
        }
    }
}

/// A notice after a change went through.
pub(super) fn notice(message: Option<&str>) -> Markup {
    html! {
        @if let Some(message) = message {
            p.notice role="status" { (message) }
        }
    }
}

/// Sends `markup` with `status` and the visitor's cookies.
pub(super) fn send(visitor: &Visitor, status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    for cookie in visitor.cookie_headers() {
        headers.append(header::SET_COOKIE, cookie);
    }
    response
}

/// 303 to `location` (a path of ours), with the visitor's cookies: the R of POST-redirect-GET.
pub(super) fn see_other(visitor: &Visitor, location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    for cookie in visitor.cookie_headers() {
        headers.append(header::SET_COOKIE, cookie);
    }
    response
}

/// A page that only says what went wrong (no visitor known: the store failed, say).
pub(super) fn bare_error(status: StatusCode, message: &str) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Error · Shortener" }
                link rel="stylesheet" href="/_/assets/app.css";
            }
            body { main id="main" { h1 { "Something went wrong" } (error_box(Some(message))) p { a href="/_/" { "Back to the start" } } } }
        }
    };
    let mut response = (status, markup.into_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}
