//! A JSON body extractor whose every rejection has the API's error shape.

use super::error::ApiError;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

/// Like `axum::Json`, for a JSON object only, with 400 / 413 / 415 errors in the API's shape
/// (the one reading is `service_edge::read_json_object`).
#[derive(Debug)]
pub(super) struct ApiJson<T>(pub(super) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        service_edge::read_json_object(req, state)
            .await
            .map(Self)
            .map_err(|r| ApiError::new(r.status, r.code, r.message))
    }
}
