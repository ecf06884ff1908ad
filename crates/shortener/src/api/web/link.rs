//! A link's page: its destination (editable), status, QR code and analytics; disable and
//! enable. Every change goes through the API's own functions (`changes::apply`).

use super::super::auth::origin;
use super::super::changes::{EditRequest, apply, disable_change};
use super::super::error::ApiError;
use super::super::links::{csv_download, link_info, visible_link};
use super::super::{App, AppState};
use super::analytics;
use super::layout::{error_box, notice, page, see_other, send};
use super::session::Visitor;
use super::{Fail, Page};
use crate::analytics::{Analytics, link_analytics};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use shortener_core::day::Day;
use shortener_core::link::{Link, LinkChange};
use shortener_core::people::Dimension;
use shortener_core::token::Principal;
use std::net::SocketAddr;

/// A button that copies `text` (shown by the script; without it the text is there to select).
pub(super) fn copy_button(text: &str) -> Markup {
    html! {
        button.copy type="button" data-copy=(text) hidden {
            "Copy" span.visually-hidden { " " (text) }
        }
    }
}

/// An RFC 3339 instant of the API as people read it: `2026-12-01 17:22 UTC`.
pub(super) fn when(rfc3339: &str) -> String {
    match (rfc3339.get(..10), rfc3339.get(11..16)) {
        (Some(day), Some(time)) if rfc3339.ends_with('Z') => format!("{day} {time} UTC"),
        _ => rfc3339.to_owned(),
    }
}

/// Every handler's start: the visitor, who they are and the link `code` if they may see
/// it; else the response that sends them to sign in, or the API's 404.
async fn visit(
    app: &App,
    headers: &HeaderMap,
    code: &str,
) -> Result<(Visitor, Principal, Link), Fail> {
    let visitor = Visitor::of(app, headers).await?;
    let Some(who) = visitor.who.clone() else {
        return Err(Fail::new(see_other(&visitor, "/_/signin")));
    };
    let link = visible_link(app, code, &who).await?;
    Ok((visitor, who, link))
}

/// Which form of the page an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Destination,
    State,
}

/// What the page shows besides the link: a refused form's error and typed value, a notice.
#[derive(Debug, Default)]
struct Extras<'a> {
    error: Option<(Option<Part>, String)>,
    typed_destination: Option<&'a str>,
    notice: Option<&'static str>,
}

async fn render(
    app: &App,
    visitor: &Visitor,
    link: Link,
    status: StatusCode,
    extras: Extras<'_>,
) -> Page {
    let analytics = page_analytics(app, &link).await?;
    let info = link_info(app, link);
    let error_for = |form: Part| {
        extras
            .error
            .as_ref()
            .filter(|(f, _)| *f == Some(form))
            .map(|(_, m)| m.as_str())
    };
    let code = &info.short_code;
    let body = html! {
        (notice(extras.notice))
        (error_box(extras.error.as_ref().filter(|(f, _)| f.is_none()).map(|(_, m)| m.as_str())))
        div.linkhead {
            dl.facts {
                dt { "Short link" }
                dd.short { a href=(info.short_url) { (info.short_url) } " " (copy_button(&info.short_url)) }
                dt { "Status" }
                dd {
                    span class={ "status status-" (info.status) } #link-status { (info.status) }
                    @if let Some(d) = &info.disabled {
                        " — " (d.reason) " (by " (d.by) ", " (d.at.get(..10).unwrap_or(&d.at)) ")"
                    }
                }
                dt { "Destination" }
                dd.dest #destination { (info.long_url) }
                dt { "Created" } dd { (when(&info.created_at)) }
                dt { "Expires" } dd { (when(&info.expires_at)) }
                @if let Some(owner) = &info.owner { dt { "Owner" } dd { (owner) } }
            }
            figure.qr {
                img src={ "/_/links/" (code) "/qr.svg" } width="160" height="160" alt={ "QR code of " (info.short_url) };
                figcaption { a href={ "/_/links/" (code) "/qr.svg" } download={ (code) ".svg" } { "Download QR code" } }
            }
        }
        (analytics::section(code, &analytics))
        @if info.status != "deleted" {
            section.card aria-labelledby="edit-h" {
                h2 #edit-h { "Change the destination" }
                (error_box(error_for(Part::Destination)))
                form method="post" action={ "/_/links/" (code) "/destination" } {
                    input type="hidden" name="csrf" value=(visitor.csrf);
                    div.field {
                        label for="long_url" { "New destination URL" }
                        input #long_url type="url" name="long_url" required maxlength="2048"
                            value=(extras.typed_destination.unwrap_or(&info.long_url));
                    }
                    button type="submit" { "Save destination" }
                }
            }
            section.card aria-labelledby="state-h" {
                h2 #state-h { @if info.status == "disabled" { "Enable" } @else { "Disable" } }
                (error_box(error_for(Part::State)))
                @if info.status == "disabled" {
                    form method="post" action={ "/_/links/" (code) "/enable" } {
                        input type="hidden" name="csrf" value=(visitor.csrf);
                        p { "The link answers 410 Gone until it is enabled again." }
                        button type="submit" { "Enable link" }
                    }
                } @else {
                    form method="post" action={ "/_/links/" (code) "/disable" } {
                        input type="hidden" name="csrf" value=(visitor.csrf);
                        div.field {
                            label for="reason" { "Reason" }
                            input #reason type="text" name="reason" required maxlength="500";
                        }
                        button.danger type="submit" { "Disable link" }
                    }
                }
            }
        }
    };
    let title = format!("Link {code}");
    Ok(send(visitor, status, page(&title, visitor, body)))
}

/// The page's query: which change just went through.
#[derive(Debug, Deserialize)]
pub(super) struct Done {
    done: Option<String>,
}

pub(super) async fn show(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
    query: Result<Query<Done>, QueryRejection>,
) -> Page {
    let (visitor, _, link) = visit(&app, &headers, &code).await?;
    let notice = match query.ok().and_then(|Query(d)| d.done).as_deref() {
        Some("edited") => Some(
            "The destination is changed; every instance redirects there within about a second.",
        ),
        Some("disabled") => Some("The link is disabled."),
        Some("enabled") => Some("The link is enabled again."),
        _ => None,
    };
    render(
        &app,
        &visitor,
        link,
        StatusCode::OK,
        Extras {
            notice,
            ..Extras::default()
        },
    )
    .await
}

/// The fields of the link page's forms.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ChangeForm {
    csrf: Option<String>,
    long_url: Option<String>,
    reason: Option<String>,
    /// `admin`: back to the admin page afterwards.
    back: Option<String>,
}

const EXPIRED_FORM: &str = "This form had expired, so nothing was changed. Please try again.";

/// One of the page's change forms: where its errors show and the change it asks for.
pub(super) trait FormAction {
    const PART: Part;
    fn change(app: &App, form: &ChangeForm) -> Result<LinkChange, ApiError>;
}

/// `POST /_/links/{code}/destination`.
pub(super) struct Destination;

impl FormAction for Destination {
    const PART: Part = Part::Destination;
    fn change(app: &App, form: &ChangeForm) -> Result<LinkChange, ApiError> {
        EditRequest {
            long_url: Some(
                form.long_url
                    .as_deref()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            ),
            expires_at: None,
            expires_in_days: None,
        }
        .change(app, crate::now())
    }
}

/// `POST /_/links/{code}/disable`.
pub(super) struct Disable;

impl FormAction for Disable {
    const PART: Part = Part::State;
    fn change(_: &App, form: &ChangeForm) -> Result<LinkChange, ApiError> {
        disable_change(form.reason.as_deref().unwrap_or_default())
    }
}

/// `POST /_/links/{code}/enable`.
pub(super) struct Enable;

impl FormAction for Enable {
    const PART: Part = Part::State;
    fn change(_: &App, _: &ChangeForm) -> Result<LinkChange, ApiError> {
        Ok(LinkChange::Enable)
    }
}

/// Checks the form, makes the change `A` asks for and redirects; a refusal shows the page
/// again with the error next to its form and nothing changed.
pub(super) async fn change<A: FormAction>(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(code): Path<String>,
    headers: HeaderMap,
    form: Result<Form<ChangeForm>, FormRejection>,
) -> Page {
    let (visitor, who, link) = visit(&app, &headers, &code).await?;
    let form = form.map(|Form(f)| f).unwrap_or_default();
    let typed = form.long_url.as_deref();
    let refuse = |status: StatusCode, message: String, link: Link| {
        render(
            &app,
            &visitor,
            link,
            status,
            Extras {
                error: Some((Some(A::PART), message)),
                typed_destination: typed,
                notice: None,
            },
        )
    };
    if !visitor.csrf_ok(&app, &headers, form.csrf.as_deref()) {
        return refuse(StatusCode::FORBIDDEN, EXPIRED_FORM.to_owned(), link).await;
    }
    let mut done = "";
    let result = match A::change(&app, &form) {
        Ok(change) => {
            done = match change {
                LinkChange::Edit { .. } => "edited",
                LinkChange::Disable { .. } => "disabled",
                LinkChange::Enable => "enabled",
                LinkChange::Delete => "deleted",
            };
            let origin = origin(&app, peer, &headers, Some(&who));
            apply(&app, &link.code, &change, &origin).await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(_) if form.back.as_deref() == Some("admin") && who.admin => {
            Ok(see_other(&visitor, &format!("/_/admin?done={done}")))
        }
        Ok(after) => Ok(see_other(
            &visitor,
            &format!("/_/links/{}?done={done}", after.code),
        )),
        Err(e) if e.status().is_server_error() => Err(e.into()),
        Err(e) => refuse(e.status(), e.message().to_owned(), link).await,
    }
}

/// The QR code of a link the visitor may see.
pub(super) async fn qr(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Fail> {
    let (_, _, link) = visit(&app, &headers, &code).await?;
    Ok(super::super::qr::svg(&app, &link)?)
}

/// The analytics as a CSV download.
pub(super) async fn csv(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Fail> {
    let (_, _, link) = visit(&app, &headers, &code).await?;
    let today = Day::from_unix(crate::now());
    let analytics = link_analytics(app.store.as_ref(), &link, today, &[])
        .await
        .map_err(ApiError::from)?;
    Ok(csv_download(&analytics))
}

/// The analytics a link's page shows: every breakdown the server can compute.
async fn page_analytics(app: &App, link: &Link) -> Result<Analytics, ApiError> {
    let dimensions: Vec<Dimension> = Dimension::ALL
        .into_iter()
        .filter(|d| *d != Dimension::Countries || app.countries)
        .collect();
    Ok(link_analytics(
        app.store.as_ref(),
        link,
        Day::from_unix(crate::now()),
        &dimensions,
    )
    .await?)
}
