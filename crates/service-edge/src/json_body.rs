//! The one reading of a JSON request body both APIs use: a JSON object (an array that serde
//! would map onto a struct's fields in order is refused), with refusals each API wraps in its
//! own error shape.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

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
    // Straight into `T`: a `serde_json::Value` first cost a create ~6 % of its worker
    // instructions (BENCHMARKS.md).
    match axum::Json::<Object<T>>::from_request(req, state).await {
        Ok(axum::Json(Object(value))) => Ok(value),
        Err(rejection) => Err(refusal(&rejection)),
    }
}

/// A `T` read only from a JSON object: serde would otherwise map an array onto a struct's
/// fields in order.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the request body as a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(Fields(PhantomData))
            .map(Object)
    }
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
        // Syntax errors, bodies of another shape (axum's 422) and anything else axum refuses.
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
            r#"{"a": 1} {}"#,
            "{",
        ] {
            let refusal = read(json, bad).await.unwrap_err();
            assert_eq!(
                (refusal.status, refusal.code),
                (StatusCode::BAD_REQUEST, "invalid_body"),
                "{bad}"
            );
        }
        // An array is refused as not an object, not read as the fields in order.
        let refusal = read(json, "[1]").await.unwrap_err();
        assert!(
            refusal.message.contains("JSON object"),
            "{}",
            refusal.message
        );
        let refusal = read(None, "{}").await.unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
