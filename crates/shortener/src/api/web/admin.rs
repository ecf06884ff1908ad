//! The admin page: the report queue (resolve; disable or enable the link with a reason) and
//! the audit trail, through the functions behind `/api/v1/reports` and `/api/v1/audit`.

use super::super::audit::{AuditParams, page as audit_page};
use super::super::reports::{ReportParams, queue_page, resolve_as};
use super::super::{App, AppState};
use super::layout::{error_box, notice, page, see_other, send};
use super::link::when;
use super::session::Visitor;
use super::{Fail, Page, given};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use maud::html;
use serde::Deserialize;
use shortener_core::audit::AuditAction;
use shortener_core::token::Principal;

/// Audit rows per page here.
const AUDIT_ROWS: &str = "50";

/// The admin page's query.
#[derive(Debug, Default, Deserialize)]
pub(super) struct AdminQuery {
    /// Reports: `open` (default) or `resolved`.
    status: Option<String>,
    cursor: Option<String>,
    /// Audit filters and page.
    code: Option<String>,
    actor: Option<String>,
    action: Option<String>,
    audit_cursor: Option<String>,
    done: Option<String>,
}

fn admin(visitor: &Visitor) -> Result<Principal, Fail> {
    match &visitor.who {
        Some(who) if who.admin => Ok(who.clone()),
        Some(_) => Err(Fail::new(send(
            visitor,
            StatusCode::FORBIDDEN,
            page(
                "Admin",
                visitor,
                error_box(Some("This page is for admins.")),
            ),
        ))),
        None => Err(Fail::new(see_other(visitor, "/_/signin"))),
    }
}

async fn render(
    app: &App,
    visitor: &Visitor,
    q: &AdminQuery,
    status: StatusCode,
    error: Option<&str>,
) -> Page {
    let open = q.status.as_deref() != Some("resolved");
    let reports = queue_page(
        app,
        ReportParams {
            status: Some(if open { "open" } else { "resolved" }.to_owned()),
            cursor: given(&q.cursor).map(str::to_owned),
            limit: None,
        },
    )
    .await;
    let trail = audit_page(
        app,
        AuditParams {
            code: given(&q.code).map(str::to_owned),
            actor: given(&q.actor).map(str::to_owned),
            action: given(&q.action).map(str::to_owned),
            since: None,
            until: None,
            cursor: given(&q.audit_cursor).map(str::to_owned),
            limit: Some(AUDIT_ROWS.to_owned()),
        },
    )
    .await;
    let mut problems: Vec<String> = error.map(str::to_owned).into_iter().collect();
    let reports = match reports {
        Ok(r) => Some(r),
        Err(e) if e.status().is_client_error() => {
            problems.push(e.message().to_owned());
            None
        }
        Err(e) => return Err(e.into()),
    };
    let trail = match trail {
        Ok(t) => Some(t),
        Err(e) if e.status().is_client_error() => {
            problems.push(e.message().to_owned());
            None
        }
        Err(e) => return Err(e.into()),
    };
    let status = if problems.is_empty() || status != StatusCode::OK {
        status
    } else {
        StatusCode::BAD_REQUEST
    };
    let done = match q.done.as_deref() {
        Some("resolved") => Some("The report is resolved."),
        Some("disabled") => Some("The link is disabled."),
        Some("enabled") => Some("The link is enabled again."),
        _ => None,
    };
    let action = q.action.as_deref().unwrap_or("");
    let body = html! {
        (notice(done))
        @for problem in &problems { (error_box(Some(problem))) }
        section.card aria-labelledby="reports-h" {
            h2 #reports-h { "Reports" }
            nav.tabs aria-label="Report status" {
                a href="/_/admin" aria-current=[open.then_some("page")] { "Open" }
                a href="/_/admin?status=resolved" aria-current=[(!open).then_some("page")] { "Resolved" }
            }
            @if let Some(reports) = &reports {
                @if reports.reports.is_empty() {
                    p.empty { "No " (if open { "open" } else { "resolved" }) " reports." }
                } @else {
                    table.reports {
                        thead { tr { th scope="col" { "Link" } th scope="col" { "Report" } th scope="col" { "Link state" } th scope="col" { "Actions" } } }
                        tbody {
                            @for r in &reports.reports {
                                tr data-report=(r.id) {
                                    td.code { a href={ "/_/links/" (r.code) } { (r.code) } }
                                    td {
                                        strong { (r.category) } " · " (when(&r.at)) " · from " (r.ip)
                                        @if let Some(c) = &r.comment { p.comment { (c) } }
                                        @if let Some(res) = &r.resolution {
                                            p.resolution { "Resolved by " (r.resolved_by.as_deref().unwrap_or("?")) ": " (res) }
                                        }
                                    }
                                    td {
                                        span class={ "status status-" (r.link_status) } { (r.link_status) }
                                        @if let Some(reason) = &r.link_disabled_reason {
                                            p.hint { (reason) " (" (r.link_disabled_by.as_deref().unwrap_or("?")) ")" }
                                        }
                                    }
                                    td.actions {
                                        @if r.link_status == "active" {
                                            form method="post" action={ "/_/links/" (r.code) "/disable" } {
                                                input type="hidden" name="csrf" value=(visitor.csrf);
                                                input type="hidden" name="back" value="admin";
                                                label for={ "reason-" (r.id) } { "Reason" }
                                                input id={ "reason-" (r.id) } type="text" name="reason" required maxlength="500";
                                                button.danger type="submit" { "Disable " span.visually-hidden { (r.code) } }
                                            }
                                        } @else if r.link_status == "disabled" {
                                            form method="post" action={ "/_/links/" (r.code) "/enable" } {
                                                input type="hidden" name="csrf" value=(visitor.csrf);
                                                input type="hidden" name="back" value="admin";
                                                button type="submit" { "Enable " span.visually-hidden { (r.code) } }
                                            }
                                        }
                                        @if r.status == "open" {
                                            form method="post" action={ "/_/admin/reports/" (r.id) "/resolve" } {
                                                input type="hidden" name="csrf" value=(visitor.csrf);
                                                label for={ "resolution-" (r.id) } { "Resolution" }
                                                input id={ "resolution-" (r.id) } type="text" name="resolution" required maxlength="500";
                                                button type="submit" { "Resolve " span.visually-hidden { "report " (r.id) } }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @if let Some(next) = &reports.next_cursor {
                        nav.pages aria-label="Report pages" {
                            a rel="next" href={ "/_/admin?status=" (if open { "open" } else { "resolved" }) "&cursor=" (next) } { "Older reports →" }
                        }
                    }
                }
            }
        }
        section.card aria-labelledby="audit-h" {
            h2 #audit-h { "Audit trail" }
            form.search method="get" action="/_/admin" {
                div.field { label for="a-code" { "Code" } input #a-code type="text" name="code" value=[q.code.as_deref()]; }
                div.field { label for="a-actor" { "Actor" } input #a-actor type="text" name="actor" value=[q.actor.as_deref()]; }
                div.field {
                    label for="a-action" { "Action" }
                    select #a-action name="action" {
                        option value="" selected[action.is_empty()] { "Any" }
                        @for a in AuditAction::ALL { option value=(a.as_str()) selected[action == a.as_str()] { (a.as_str()) } }
                    }
                }
                button type="submit" { "Filter" }
            }
            @if let Some(trail) = &trail {
                table.audit {
                    thead { tr { th scope="col" { "When" } th scope="col" { "Actor" } th scope="col" { "Action" } th scope="col" { "Code" } th scope="col" { "Details" } } }
                    tbody {
                        @for e in &trail.entries {
                            tr {
                                td { (when(&e.at)) }
                                td { (e.actor) @if let Some(ip) = &e.ip { br; span.hint { (ip) } } }
                                td { (e.action) }
                                td.code { @if let Some(code) = &e.code { a href={ "/_/links/" (code) } { (code) } } }
                                td.dest {
                                    @match (&e.old_url, &e.new_url) {
                                        (Some(old), Some(new)) => { span.hint { "from " } (old) br; span.hint { "to " } (new) br; }
                                        (Some(at), None) => { span.hint { "destination " } (at) br; }
                                        (None, Some(new)) => { span.hint { "to " } (new) br; }
                                        (None, None) => {}
                                    }
                                    @if let Some(detail) = &e.detail {
                                        @if let Some(label) = detail_label(e.action) { span.hint { (label) " " } }
                                        (detail)
                                    }
                                }
                            }
                        }
                    }
                }
                @if let Some(next) = &trail.next_cursor {
                    nav.pages aria-label="Audit pages" {
                        a rel="next" href={ "/_/admin?" (super::links::query_string(&[("code", q.code.as_deref()), ("actor", q.actor.as_deref()), ("action", q.action.as_deref()), ("audit_cursor", Some(next))])) } { "Older entries →" }
                    }
                }
            }
        }
    };
    Ok(send(visitor, status, page("Admin", visitor, body)))
}

/// What an audit row's detail is, where the detail is not a sentence of its own.
fn detail_label(action: &str) -> Option<&'static str> {
    match AuditAction::parse(action)? {
        AuditAction::Disabled => Some("reason"),
        AuditAction::Reported => Some("category"),
        _ => None,
    }
}

pub(super) async fn show(
    State(app): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<AdminQuery>, QueryRejection>,
) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    admin(&visitor)?;
    let q = query.map(|Query(q)| q).unwrap_or_default();
    render(&app, &visitor, &q, StatusCode::OK, None).await
}

/// The resolve form's fields.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ResolveForm {
    csrf: Option<String>,
    resolution: Option<String>,
}

pub(super) async fn resolve(
    State(app): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    form: Result<Form<ResolveForm>, FormRejection>,
) -> Page {
    let visitor = Visitor::of(&app, &headers).await?;
    let who = admin(&visitor)?;
    let form = form.map(|Form(f)| f).unwrap_or_default();
    let q = AdminQuery::default();
    if !visitor.csrf_ok(&app, &headers, form.csrf.as_deref()) {
        let message = "This form had expired, so nothing was changed. Please try again.";
        return render(&app, &visitor, &q, StatusCode::FORBIDDEN, Some(message)).await;
    }
    match resolve_as(
        &app,
        who.user,
        &id,
        form.resolution.as_deref().unwrap_or_default(),
    )
    .await
    {
        Ok(_) => Ok(see_other(&visitor, "/_/admin?done=resolved")),
        Err(e) if e.status().is_server_error() => Err(e.into()),
        Err(e) => render(&app, &visitor, &q, e.status(), Some(e.message())).await,
    }
}
