//! The one reading of a JSON request body both APIs use: a JSON object (an array that serde
//! would map onto a struct's fields in order is refused), with refusals each API wraps in its
//! own error shape.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

/// Why a body was refused: the status, a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyRefusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// Reads the body as a JSON object of type `T`: 415 without `Content-Type: application/json`,
/// 413 past the router's body limit, 400 for anything else that is not such an object.
pub async fn read_json_object<T, S>(req: Request, state: &S) -> Result<T, BodyRefusal>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    let value = match axum::Json::<serde_json::Value>::from_request(req, state).await {
        Ok(axum::Json(value)) => value,
        Err(rejection) => return Err(refusal(&rejection)),
    };
    if !value.is_object() {
        return Err(invalid("the request body must be a JSON object".to_owned()));
    }
    T::deserialize(value).map_err(|e| invalid(format!("invalid request body: {e}")))
}

fn invalid(message: String) -> BodyRefusal {
    BodyRefusal {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_body",
        message,
    }
}

fn refusal(rejection: &JsonRejection) -> BodyRefusal {
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => BodyRefusal {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "payload_too_large",
            message: "request body is too large".to_owned(),
        },
        StatusCode::UNSUPPORTED_MEDIA_TYPE => BodyRefusal {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "unsupported_media_type",
            message: "request body must be JSON (Content-Type: application/json)".to_owned(),
        },
        // Syntax errors (400) and anything else axum refuses.
        _ => invalid(rejection.body_text()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::body::Body;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        #[allow(dead_code, reason = "only parsed")]
        a: Option<u32>,
    }

    async fn read(content_type: Option<&str>, body: &'static str) -> Result<Req, BodyRefusal> {
        let mut req = Request::builder().method("POST").uri("/");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        read_json_object::<Req, ()>(req.body(Body::from(body)).unwrap(), &()).await
    }

    #[tokio::test]
    async fn only_a_json_object_of_the_shape_passes() {
        let json = Some("application/json");
        assert!(read(json, r#"{"a": 1}"#).await.is_ok());
        assert!(read(json, "{}").await.is_ok());
        for bad in [
            "[null]",
            "[]",
            "null",
            "1",
            r#"{"b": 1}"#,
            r#"{"a": "x"}"#,
            "{",
        ] {
            let refusal = read(json, bad).await.unwrap_err();
            assert_eq!(
                (refusal.status, refusal.code),
                (StatusCode::BAD_REQUEST, "invalid_body"),
                "{bad}"
            );
        }
        let refusal = read(None, "{}").await.unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
