//! `GET /api/v1/challenge`: an ALTCHA challenge for the CAPTCHA of anonymous creation, in the
//! format the `altcha` widget (2.x) reads unmodified.

use super::AppState;
use serde::Serialize;
use shortener_core::altcha::Challenge;
use utoipa::ToSchema;

/// An ALTCHA challenge: find `number` ≤ `maxnumber` with SHA-256(`salt` + `number`) =
/// `challenge`, then send `{algorithm, challenge, number, salt, signature}` as base64 JSON in
/// the `X-Altcha` header (or the `altcha` body field) of the create.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ChallengeJson {
    /// `SHA-256`.
    pub algorithm: &'static str,
    /// Hex SHA-256 of the salt followed by the secret number.
    pub challenge: String,
    pub maxnumber: u64,
    /// Random hex, then `?expires=UNIX` (10 minutes).
    pub salt: String,
    /// Hex HMAC-SHA-256 of the challenge with the server's key.
    pub signature: String,
}

impl From<Challenge> for ChallengeJson {
    fn from(c: Challenge) -> Self {
        Self {
            algorithm: c.algorithm,
            challenge: c.challenge,
            maxnumber: c.maxnumber,
            salt: c.salt,
            signature: c.signature,
        }
    }
}

/// A fresh challenge (anyone).
#[utoipa::path(
    get, path = "/api/v1/challenge", tag = "links",
    responses((status = 200, description = "A challenge, good for 10 minutes and one create", body = ChallengeJson))
)]
pub(super) async fn issue(
    axum::extract::State(app): axum::extract::State<AppState>,
) -> axum::Json<ChallengeJson> {
    axum::Json(app.captcha.challenge(crate::now()).into())
}
