//! The start page (create a link), "My links", and signing in and out.

use super::super::App;
use super::super::AppState;
use super::super::auth::{client_ip, principal_of};
use super::super::error::ApiError;
use super::super::links::{CreateLink, admit, count_create, create_link, short_url};
use super::super::listing::{ListParams, page as list_page};
use super::layout::{error_box, page, see_other, send};
use super::session::{Visitor, admit_sign_in, sign, verify};
use super::{Page, given, link::copy_button};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;
use service_edge::Integer;
use shortener_core::alias::could_be_code;
use shortener_core::link::EXPIRES_IN_DAYS;
use shortener_core::token::TokenHash;
use std::net::SocketAddr;

/// The fields of the create form, as typed.
#[derive(Debug, Default, Deserialize)]
pub(super) struct CreateForm {
    csrf: Option<String>,
    long_url: Option<String>,
    custom_alias: Option<String>,
    expires_in_days: Option<String>,
    altcha: Option<String>,
}

/// The start page's query: the link just created, signed so that nobody can link people
/// to a page claiming to have created something.
#[derive(Debug, Deserialize)]
pub(super) struct Created {
    created: Option<String>,
    sig: Option<String>,
}

fn create_form(
    app: &App,
    visitor: &Visitor,
    form: &CreateForm,
    error: Option<&str>,
    focus: bool,
) -> Markup {
    let anonymous = visitor.who.is_none();
    html! {
        (error_box(error))
        @if anonymous && app.no_anonymous {
            p { "Anonymous links are turned off here. " a href="/_/signin" { "Sign in" } " to create links." }
        } @else {
            form.card method="post" action="/_/links" {
                input type="hidden" name="csrf" value=(visitor.csrf);
                div.field {
                    label for="long_url" { "Destination URL" }
                    input #long_url type="url" name="long_url" required maxlength="2048"
                        placeholder="https://example.com/a/long/path" value=[form.long_url.as_deref()]
                        autofocus[focus];
                }
                div.row {
                    div.field {
                        label for="custom_alias" { "Custom alias " span.hint { "(optional)" } }
                        input #custom_alias type="text" name="custom_alias" maxlength="30"
                            pattern="[A-Za-z0-9\\-]{4,30}" aria-describedby="alias-hint"
                            value=[form.custom_alias.as_deref()];
                        p.hint #alias-hint { "4 to 30 letters, digits or dashes." }
                    }
                    div.field {
                        label for="expires_in_days" { "Expires after (days) " span.hint { "(optional)" } }
                        input #expires_in_days type="number" name="expires_in_days"
                            min=(EXPIRES_IN_DAYS.start()) max=(EXPIRES_IN_DAYS.end())
                            placeholder="1825" value=[form.expires_in_days.as_deref()];
                    }
                }
                @if anonymous && app.captcha.may_ask() {
                    // The ALTCHA widget solves the challenge as the page loads and puts its
                    // solution into the form as the hidden field `altcha`.
                    div.captcha {
                        link rel="stylesheet" href="/_/assets/altcha.css";
                        altcha-widget challengeurl="/api/v1/challenge"
                            workerurl="/_/assets/altcha-worker.js" auto="onload" name="altcha" {}
                        noscript {
                            p.hint { "Busy anonymous creators are asked to prove they are people; that check needs JavaScript." }
                        }
                    }
                    script src="/_/assets/altcha.js" defer {}
                }
                button type="submit" { "Shorten" }
            }
        }
    }
}

/// The start page: the create form, and the link just created.
pub(super) async fn home(
    State(app): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Created>, QueryRejection>,
) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    let created = query
        .ok()
        .and_then(|Query(c)| Some((c.created?, c.sig?)))
        .filter(|(code, sig)| could_be_code(code) && verify(&app.web_key, "created", code, sig))
        .map(|(code, _)| code);
    let body = html! {
        @if let Some(code) = &created {
            section.card.created role="status" aria-labelledby="created-h" {
                h2 #created-h { "Your short link" }
                p.short {
                    a href=(short_url(&app, code)) { (short_url(&app, code)) }
                    " " (copy_button(&short_url(&app, code)))
                }
                @if visitor.who.is_some() {
                    p { a href={ "/_/links/" (code) } { "Open its page" } " (destination, analytics, QR code)" }
                }
            }
        }
        (create_form(&app, &visitor, &CreateForm::default(), None, created.is_none()))
    };
    Ok(send(
        &visitor,
        StatusCode::OK,
        page("Shorten a link", &visitor, body),
    ))
}

fn refused_form(
    app: &App,
    visitor: &Visitor,
    form: &CreateForm,
    status: StatusCode,
    message: &str,
) -> Page {
    let body = create_form(app, visitor, form, Some(message), true);
    Ok(send(visitor, status, page("Shorten a link", visitor, body)))
}

const EXPIRED_FORM: &str = "This form had expired, so nothing was done. Please submit it again.";

/// `POST /_/links`: create, then show the new link (POST-redirect-GET).
pub(super) async fn create(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<CreateForm>, FormRejection>,
) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    let form = form.map(|Form(f)| f).unwrap_or_default();
    if !visitor.csrf_ok(&app, &headers, form.csrf.as_deref()) {
        return refused_form(&app, &visitor, &form, StatusCode::FORBIDDEN, EXPIRED_FORM);
    }
    let expires_in_days = match given(&form.expires_in_days).map(str::parse::<i64>) {
        None => None,
        Some(Ok(days)) => Some(Integer(days)),
        Some(Err(_)) => {
            let message = format!(
                "Expiry must be a whole number of days from {} to {}.",
                EXPIRES_IN_DAYS.start(),
                EXPIRES_IN_DAYS.end()
            );
            return refused_form(&app, &visitor, &form, StatusCode::BAD_REQUEST, &message);
        }
    };
    let request = CreateLink {
        long_url: given(&form.long_url).unwrap_or_default().to_owned(),
        custom_alias: given(&form.custom_alias).map(str::to_owned),
        expires_in_days,
        altcha: given(&form.altcha).map(str::to_owned),
    };
    let who = visitor.who.clone();
    let result = async {
        let budget = admit(&app, who.as_ref(), client_ip(&app, peer, &headers)).await?;
        create_link(&app, peer, &headers, who, budget, request).await
    }
    .await;
    count_create(&app, result.as_ref().err());
    match result {
        Ok(link) => {
            let sig = sign(&app.web_key, "created", &link.code);
            Ok(see_other(
                &visitor,
                &format!("/_/?created={}&sig={sig}", link.code),
            ))
        }
        Err(e) => {
            let message = match e.code() {
                "captcha_required" | "captcha_invalid" => format!(
                    "Please let the “are you a person” check finish, then submit again ({}).",
                    e.message()
                ),
                _ => e.message().to_owned(),
            };
            refused_form(&app, &visitor, &form, e.status(), &message)
        }
    }
}

/// The query of "My links": the search form's fields and the page.
#[derive(Debug, Deserialize)]
pub(super) struct Search {
    q: Option<String>,
    status: Option<String>,
    cursor: Option<String>,
}

pub(super) fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            s.append_pair(name, value);
        }
    }
    s.finish()
}

/// "My links" (an admin's: everyone's): search, status filter, a page at a time.
pub(super) async fn mine(
    State(app): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Search>, QueryRejection>,
) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    let Some(who) = visitor.who.clone() else {
        return Ok(see_other(&visitor, "/_/signin"));
    };
    let search = match query {
        Ok(Query(search)) => search,
        Err(_) => Search {
            q: None,
            status: None,
            cursor: None,
        },
    };
    let params = ListParams::from_form(
        search.q.clone(),
        search.status.clone(),
        search.cursor.clone(),
    );
    let (links, error) = match list_page(&app, &who, params).await {
        Ok(page) => (Some(page), None),
        Err(e) if e.status().is_client_error() => (None, Some(e)),
        Err(e) => return Err(e.into()),
    };
    let status = search.status.as_deref().unwrap_or("");
    let body = html! {
        form.search role="search" method="get" action="/_/links" {
            div.field {
                label for="q" { "Search code or destination" }
                input #q type="search" name="q" value=[search.q.as_deref()];
            }
            div.field {
                label for="status" { "Status" }
                select #status name="status" {
                    @for (value, label) in [("", "Any"), ("active", "Active"), ("disabled", "Disabled"), ("expired", "Expired")] {
                        option value=(value) selected[status == value] { (label) }
                    }
                }
            }
            button type="submit" { "Search" }
        }
        (error_box(error.as_ref().map(ApiError::message)))
        @if let Some(links) = &links {
            @if links.links.is_empty() {
                p.empty { "No links match." " " a href="/_/" { "Create one" } }
            } @else {
                table.links {
                    caption.visually-hidden { "Your links, newest first" }
                    thead { tr { th scope="col" { "Short link" } th scope="col" { "Destination" } th scope="col" { "Status" } th scope="col" class="num" { "Clicks" } th scope="col" { "Created" } th scope="col" { span.visually-hidden { "Actions" } } } }
                    tbody {
                        @for l in &links.links {
                            tr data-code=(l.short_code) {
                                td.code { a href={ "/_/links/" (l.short_code) } { (l.short_code) } }
                                td.dest title=(l.long_url) { (l.long_url) }
                                td { span class={ "status status-" (l.status) } { (l.status) } }
                                td.num { (l.total_clicks) }
                                td { (l.created_at.get(..10).unwrap_or(&l.created_at)) }
                                td.actions {
                                    (copy_button(&l.short_url))
                                    " "
                                    a href={ "/_/links/" (l.short_code) "/qr.svg" } { "QR" span.visually-hidden { " code of " (l.short_code) } }
                                }
                            }
                        }
                    }
                }
            }
            nav.pages aria-label="Pages" {
                @if search.cursor.as_deref().is_some_and(|c| !c.is_empty()) {
                    a href={ "/_/links?" (query_string(&[("q", search.q.as_deref()), ("status", search.status.as_deref())])) } { "← Newest" }
                }
                @if let Some(next) = &links.next_cursor {
                    a rel="next" href={ "/_/links?" (query_string(&[("q", search.q.as_deref()), ("status", search.status.as_deref()), ("cursor", Some(next))])) } { "Older links →" }
                }
            }
        }
    };
    // The API's status for what it refused (400 for a bad filter, 422 for a cursor this
    // deployment did not give out): one decision, in `list_page`.
    let status = error.as_ref().map_or(StatusCode::OK, ApiError::status);
    Ok(send(&visitor, status, page("My links", &visitor, body)))
}

/// The sign-in form's fields.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SignInForm {
    csrf: Option<String>,
    token: Option<String>,
}

fn sign_in_page(visitor: &Visitor, status: StatusCode, error: Option<&str>) -> Page {
    let body = html! {
        (error_box(error))
        form.card method="post" action="/_/signin" {
            input type="hidden" name="csrf" value=(visitor.csrf);
            div.field {
                label for="token" { "API token" }
                input #token type="password" name="token" required autocomplete="off"
                    spellcheck="false" aria-describedby="token-hint" autofocus;
                p.hint #token-hint { "Paste a token from " code { "shortener token create" } ". It is kept by the server only as a hash." }
            }
            button type="submit" { "Sign in" }
        }
    };
    Ok(send(visitor, status, page("Sign in", visitor, body)))
}

pub(super) async fn sign_in_form(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    sign_in_page(&visitor, StatusCode::OK, None)
}

/// `POST /_/signin`: a pasted token becomes a session (rate limited per client address).
pub(super) async fn sign_in(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Page {
    let mut visitor = Visitor::of(&app, &headers).await?;
    let form = form.map(|Form(f)| f).unwrap_or_default();
    if !visitor.csrf_ok(&app, &headers, form.csrf.as_deref()) {
        return sign_in_page(&visitor, StatusCode::FORBIDDEN, Some(EXPIRED_FORM));
    }
    if let Err(retry) = admit_sign_in(&app, peer, &headers).await {
        let message = format!(
            "Too many sign-in attempts from your address; try again in {} minutes.",
            retry.div_ceil(60)
        );
        return sign_in_page(&visitor, StatusCode::TOO_MANY_REQUESTS, Some(&message));
    }
    let Some(token) = given(&form.token) else {
        return sign_in_page(
            &visitor,
            StatusCode::BAD_REQUEST,
            Some("Paste a token to sign in."),
        );
    };
    let hash = TokenHash::of(token);
    match principal_of(&app, hash).await? {
        Some(_) => {
            visitor.start_session(&app, &hash);
            Ok(see_other(&visitor, "/_/links"))
        }
        None => sign_in_page(
            &visitor,
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid (or it was revoked)."),
        ),
    }
}

/// `POST /_/signout`.
pub(super) async fn sign_out(
    State(app): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Page {
    let mut visitor = Visitor::of(&app, &headers).await?;
    let form = form.map(|Form(f)| f).unwrap_or_default();
    if !visitor.csrf_ok(&app, &headers, form.csrf.as_deref()) {
        let body = html! { (error_box(Some(EXPIRED_FORM))) };
        return Ok(send(
            &visitor,
            StatusCode::FORBIDDEN,
            page("Sign out", &visitor, body),
        ));
    }
    visitor.end_session();
    Ok(see_other(&visitor, "/_/"))
}
