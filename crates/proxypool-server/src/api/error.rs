//! The one error shape of the API: `{"error": {"code": "...", "message": "..."}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use proxypool::{AcquireError, PoolError};
use serde::Serialize;
use utoipa::ToSchema;

/// Body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorBody {
    pub(super) error: ErrorDetail,
}

/// What went wrong, for machines (`code`) and people (`message`).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorDetail {
    /// Stable machine-readable code, e.g. `session_broken`.
    #[schema(example = "session_broken")]
    pub(super) code: &'static str,
    /// Human-readable explanation.
    pub(super) message: String,
}

/// An error response about to be sent.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u64>,
    authenticate: bool,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            authenticate: false,
        }
    }

    pub(super) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(super) fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub(super) fn unauthorized() -> Self {
        Self {
            authenticate: true,
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "credentials required (Authorization: Basic, a user of the auth file)",
            )
        }
    }
}

impl From<AcquireError> for ApiError {
    fn from(e: AcquireError) -> Self {
        let message = e.to_string();
        match e {
            AcquireError::SessionBroken { .. } => {
                Self::new(StatusCode::CONFLICT, "session_broken", message)
            }
            AcquireError::BoundAddressBusy { .. } => Self {
                retry_after: Some(1),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "session_busy", message)
            },
            AcquireError::BoundAddressCooling { retry_in, .. } => Self {
                retry_after: Some(retry_in.as_secs().max(1)),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "session_cooling", message)
            },
            AcquireError::UnknownSubPool(_) => Self::bad_request("unknown_sub_pool", message),
            AcquireError::StoreUnavailable(_) => Self {
                retry_after: Some(1),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    message,
                )
            },
            _ => Self::new(StatusCode::SERVICE_UNAVAILABLE, "no_address", message),
        }
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        let message = e.to_string();
        match e {
            PoolError::Address(_) => Self::bad_request("invalid_address", message),
            PoolError::Duplicate(_) => {
                Self::new(StatusCode::CONFLICT, "duplicate_address", message)
            }
            PoolError::UnknownAddress(_) => Self::not_found("unknown_address", message),
            _ => Self::bad_request("invalid_request", message),
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
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.authenticate {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"proxypool\""),
            );
        }
        response
    }
}

/// The router's answer for paths it does not serve.
pub(super) async fn no_route() -> ApiError {
    ApiError::not_found("not_found", "no such resource")
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
