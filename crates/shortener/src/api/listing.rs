//! `GET /api/v1/links`: the caller's links (an admin's: everyone's), newest first, a page at
//! a time behind an opaque cursor.

use super::auth::required_principal;
use super::error::{ApiError, ErrorBody};
use super::links::{LinkInfo, link_info};
use super::{App, AppState};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use shortener_core::day::parse_rfc3339;
use shortener_core::link::LinkStatus;
use shortener_core::listing::{CursorCipher, LinkCursor, LinkQuery, MAX_PAGE};
use shortener_core::token::Principal;
use utoipa::{IntoParams, ToSchema};

/// Links per page unless `limit` says otherwise.
const DEFAULT_PAGE: usize = 20;

/// A page of links.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LinkPage {
    /// Newest first; never a deleted link.
    pub links: Vec<LinkInfo>,
    /// Pass as `cursor` for the next (older) page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The query string of `GET /api/v1/links`; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListParams {
    /// Only this user's links (admins only; others may name only themselves).
    #[param(pattern = "^[^\\x00]*$")]
    owner: Option<String>,
    /// Only links whose code or destination contains this text (case-sensitive).
    #[param(pattern = "^[^\\x00]*$")]
    q: Option<String>,
    /// Only links in this state.
    #[param(value_type = Option<String>, pattern = "^(active|disabled|expired)$")]
    status: Option<String>,
    /// Created at or after this instant, RFC 3339.
    #[param(format = DateTime)]
    created_after: Option<String>,
    /// Created before this instant, RFC 3339.
    #[param(format = DateTime)]
    created_before: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[0-9a-f]{16}_[0-9a-f]{16}$")]
    cursor: Option<String>,
    /// Links per page (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
}

/// The cursor after a link: its creation instant and its place in the store's creation order
/// (`seq`) hidden ([`CursorCipher`]), 16 hex digits each around an underscore. Cursors of
/// earlier versions (an instant and a code; an instant and `seq` in clear around a dot) are
/// not of that form.
fn encode_cursor(cipher: &CursorCipher, cursor: &LinkCursor) -> String {
    // The bits of the i64, as u64: instants before 1970 round-trip too.
    format!(
        "{:016x}_{:016x}",
        cursor.created_at as u64,
        cipher.hide(cursor.seq)
    )
}

/// Why a cursor is refused.
#[derive(Debug, PartialEq, Eq)]
enum BadCursor {
    /// Not of the documented form: 400.
    Malformed,
    /// Of the form, but its hidden part is not one this deployment's key gives (altered, or
    /// another deployment's): 422, a fact no schema can state.
    NotGivenOut,
}

fn decode_cursor(cipher: &CursorCipher, text: &str) -> Result<LinkCursor, BadCursor> {
    let hex = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (at, hidden) = text
        .split_once('_')
        .and_then(|(at, hidden)| Some((hex(at)?, hex(hidden)?)))
        .ok_or(BadCursor::Malformed)?;
    Ok(LinkCursor {
        created_at: at as i64,
        seq: cipher.reveal(hidden).ok_or(BadCursor::NotGivenOut)?,
    })
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_query", message)
}

impl ListParams {
    /// The parameters of the web app's search form, where an empty field means "any".
    pub(super) fn from_form(
        q: Option<String>,
        status: Option<String>,
        cursor: Option<String>,
    ) -> Self {
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        Self {
            owner: None,
            q: given(q),
            status: given(status),
            created_after: None,
            created_before: None,
            cursor: given(cursor),
            limit: None,
        }
    }

    /// The store query these parameters ask for on behalf of `user` (`admin` or not), their
    /// cursor read with `cipher`.
    fn query(self, user: &str, admin: bool, cipher: &CursorCipher) -> Result<LinkQuery, ApiError> {
        // PostgreSQL refuses NUL in text; no code, destination or user name holds one.
        if [&self.owner, &self.q]
            .into_iter()
            .flatten()
            .any(|text| text.contains('\0'))
        {
            return Err(invalid("owner and q must not contain NUL characters"));
        }
        let owner = match self.owner {
            Some(owner) if admin || owner == user => Some(owner),
            Some(_) => {
                return Err(invalid(
                    "owner may only name another user with an admin token",
                ));
            }
            None if admin => None,
            None => Some(user.to_owned()),
        };
        let instant = |name: &str, value: Option<String>| {
            value
                .map(|v| {
                    parse_rfc3339(&v).ok_or_else(|| {
                        invalid(format!(
                            "{name} must be an RFC 3339 instant such as 2026-12-01T00:00:00Z"
                        ))
                    })
                })
                .transpose()
        };
        let status = match self.status.as_deref() {
            None => None,
            Some("active") => Some(LinkStatus::Active),
            Some("disabled") => Some(LinkStatus::Disabled),
            Some("expired") => Some(LinkStatus::Expired),
            Some(_) => return Err(invalid("status must be active, disabled or expired")),
        };
        let limit = match self.limit.as_deref().map(str::parse::<usize>) {
            None => DEFAULT_PAGE,
            Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
            Some(_) => return Err(invalid(format!("limit must be between 1 and {MAX_PAGE}"))),
        };
        let after = self
            .cursor
            .map(|c| {
                decode_cursor(cipher, &c).map_err(|bad| match bad {
                    BadCursor::Malformed => ApiError::bad_request(
                        "invalid_cursor",
                        "cursor is not one this API gave out",
                    ),
                    BadCursor::NotGivenOut => ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_cursor",
                        "cursor was not given out by this service (altered, or another deployment's): start again from the first page",
                    ),
                })
            })
            .transpose()?;
        Ok(LinkQuery {
            contains: self.q.filter(|q| !q.is_empty()),
            status,
            created_after: instant("created_after", self.created_after)?,
            created_before: instant("created_before", self.created_before)?,
            after,
            ..LinkQuery::new(owner, crate::now(), limit)
        })
    }
}

/// The caller's links (an admin's: everyone's, or one `owner`'s), newest first.
#[utoipa::path(
    get, path = "/api/v1/links", tag = "links", operation_id = "list_links",
    params(ListParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of links", body = LinkPage),
        (status = 400, description = "Unknown parameter, a status other than active/disabled/expired, a time that is not RFC 3339, limit outside 1-100, another user's owner without an admin token, NUL in q or owner (`invalid_query`); a cursor not of the documented form (`invalid_cursor`)", body = ErrorBody),
        (status = 422, description = "A cursor of the documented form that this deployment did not give out: altered, or made under another deployment's key (`invalid_cursor`); a fact no schema can state", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn list(
    State(app): State<AppState>,
    headers: HeaderMap,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<axum::Json<LinkPage>, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let Query(params) = params.map_err(|e| invalid(e.body_text()))?;
    Ok(axum::Json(page(&app, &who, params).await?))
}

/// The page of links `params` ask for on behalf of `who`: the API's listing and the web
/// app's "My links".
pub(super) async fn page(
    app: &App,
    who: &Principal,
    params: ListParams,
) -> Result<LinkPage, ApiError> {
    let query = params.query(&who.user, who.admin, &app.cursor_cipher)?;
    let page = app.store.list_links(&query).await?;
    Ok(LinkPage {
        links: page.links.into_iter().map(|l| link_info(app, l)).collect(),
        next_cursor: page.next.map(|c| encode_cursor(&app.cursor_cipher, &c)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shortener_core::listing::SEQ_BOUND;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let cipher = CursorCipher::new([1; 16]);
        for (created_at, seq) in [
            (0, 1),
            (1_780_000_000, 42),
            (-1, -7),
            (i64::MAX, 1 - SEQ_BOUND),
        ] {
            let cursor = LinkCursor { created_at, seq };
            assert_eq!(
                decode_cursor(&cipher, &encode_cursor(&cipher, &cursor)),
                Ok(cursor)
            );
        }
        for bad in [
            "",
            "abc",
            "0000000000000000",
            "0000000000000000_",
            "0000000000000000abcdefg",
            "0000000000000000.0000000000000001",
            "0000000000000000_000000000000000G",
            "0000000000000000_000000000000000",
            "0000000000000000_00000000000000000",
            "+000000000000000_0000000000000001",
            "0000000000000000_+000000000000001",
            "0000000000000000_000000000000000A",
            "000000000000000_00000000000000001",
        ] {
            assert_eq!(
                decode_cursor(&cipher, bad),
                Err(BadCursor::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cursor_shows_its_instant_but_not_the_creation_order() {
        let cipher = CursorCipher::new([1; 16]);
        let texts: Vec<String> = (100..103)
            .map(|seq| {
                let cursor = LinkCursor {
                    created_at: 0x1234,
                    seq,
                };
                encode_cursor(&cipher, &cursor)
            })
            .collect();
        for text in &texts {
            assert!(text.starts_with("0000000000001234_"), "{text}");
        }
        // Consecutive places in the order: far apart under this key.
        let hidden: Vec<u64> = texts
            .iter()
            .map(|t| u64::from_str_radix(t.split_once('_').unwrap().1, 16).unwrap())
            .collect();
        assert!(
            hidden.windows(2).all(|w| w[0].abs_diff(w[1]) > 1 << 32),
            "{hidden:x?}"
        );
        // Under another key (another deployment's cursor): refused, not read as another place.
        let other = CursorCipher::new([2; 16]);
        assert_eq!(
            decode_cursor(&other, &texts[0]),
            Err(BadCursor::NotGivenOut)
        );
    }
}
