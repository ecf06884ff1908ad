//! The one error shape of the API: `{"error": {"code": "...", "message": "..."}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use shortener_core::store::StoreError;
use utoipa::ToSchema;

/// Body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorBody {
    pub error: ErrorDetail,
    /// Only with 428 `captcha_required`: the challenge to solve.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::challenge::ChallengeJson>)]
    pub challenge: Option<serde_json::Value>,
}

/// What went wrong, for machines (`code`) and people (`message`).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorDetail {
    /// Stable machine-readable code, e.g. `alias_taken`.
    #[schema(example = "alias_taken")]
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

/// An error response about to be sent.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u64>,
    www_authenticate: bool,
    challenge: Option<serde_json::Value>,
}

impl From<crate::new_link::Refused> for ApiError {
    fn from(refused: crate::new_link::Refused) -> Self {
        let status = match refused {
            crate::new_link::Refused::ExpiryOutOfWindow(_) => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, refused.code(), refused.to_string())
    }
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            www_authenticate: false,
            challenge: None,
        }
    }

    /// 428 with the challenge to solve.
    pub(super) fn captcha_required(challenge: serde_json::Value) -> Self {
        Self {
            challenge: Some(challenge),
            ..Self::new(
                StatusCode::PRECONDITION_REQUIRED,
                "captcha_required",
                "solve the challenge and send the payload in X-Altcha (or the altcha field)",
            )
        }
    }

    pub(super) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(super) fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such link")
    }

    pub(super) fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            www_authenticate: true,
            ..Self::new(StatusCode::UNAUTHORIZED, code, message)
        }
    }

    pub(super) fn rate_limited(retry_after_secs: u64) -> Self {
        Self {
            retry_after: Some(retry_after_secs),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("too many links created; retry in {retry_after_secs} s"),
            )
        }
    }

    pub(super) fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code, e.g. `alias_taken`.
    pub(super) fn code(&self) -> &'static str {
        self.code
    }

    /// The explanation for people.
    pub(super) fn message(&self) -> &str {
        &self.message
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => {
                tracing::warn!(error = %e, "store unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the link store is unavailable; try again shortly",
                )
            }
            StoreError::IdSpaceExhausted => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "id_space_exhausted",
                "no generated codes are left; use a custom alias",
            ),
            StoreError::Backend(_) => {
                tracing::error!(error = %e, "store error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
            challenge: self.challenge,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.www_authenticate {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Error bodies of the redirect path, serialised once: unknown codes come in floods
/// (scanners, typos, expired campaigns) and must cost no more than a redirect.
pub(crate) const NOT_FOUND_BODY: &str =
    r#"{"error":{"code":"not_found","message":"no such link"}}"#;
pub(crate) const EXPIRED_BODY: &str =
    r#"{"error":{"code":"not_found","message":"this link has expired"}}"#;
pub(crate) const GONE_BODY: &str =
    r#"{"error":{"code":"gone","message":"this link has been disabled"}}"#;
pub(crate) const DELETED_BODY: &str =
    r#"{"error":{"code":"gone","message":"this link has been deleted"}}"#;

/// The router's answer for paths it does not serve.
pub(super) async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
}

/// The router's answer for a known path with the wrong method.
pub(super) async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this resource",
    )
}

/// Turns a panic in a handler into a JSON 500 instead of a dropped connection.
pub(super) fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("handler panicked");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_bodies_have_the_error_shape() {
        for body in [NOT_FOUND_BODY, EXPIRED_BODY, GONE_BODY, DELETED_BODY] {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(v["error"]["code"].is_string() && v["error"]["message"].is_string());
        }
    }
}
