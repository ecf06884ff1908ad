//! The CAPTCHA of anonymous creation: when it is asked for, ALTCHA challenges signed with a
//! key kept in the store (so every instance shares it), and refusal of replayed solutions by
//! every process on the store — in Redis in the scale-out mode, in the store otherwise or
//! while Redis does not answer.

use crate::ratelimit::Budget;
use crate::scaleout::redis::Redis;
use crate::store::Store;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use shortener_core::altcha::{self, Challenge, Solution};
use shortener_core::day::UnixSeconds;
use shortener_core::store::StoreError;
use std::sync::Arc;

/// How long a challenge may be solved.
pub(crate) const CHALLENGE_SECONDS: i64 = 600;
/// The store's name of the HMAC key.
pub(crate) const KEY_NAME: &str = "captcha_key";

/// Why a payload was not accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// Malformed, forged, expired or replayed: the client's fault (400 `captcha_invalid`).
    #[error("{0}")]
    Invalid(String),
    /// The store could not say whether the solution was used.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// When anonymous creates need a solved challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptchaMode {
    /// Never.
    Off,
    /// Once the client used `--captcha-after` of its hourly budget.
    Auto,
    /// Always.
    Always,
}

impl std::str::FromStr for CaptchaMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            _ => Err(format!("captcha must be off, auto or always, not {s:?}")),
        }
    }
}

/// The settings of the CAPTCHA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CaptchaSettings {
    pub(crate) mode: CaptchaMode,
    /// Fraction of the hourly budget used before a challenge is asked for (auto).
    pub(crate) after: f64,
    /// Difficulty: the secret number is at most this.
    pub(crate) max_number: u64,
}

/// The payload of the `X-Altcha` header or the `altcha` body field, once base64-decoded.
#[derive(Debug, Deserialize)]
struct Payload {
    algorithm: String,
    challenge: String,
    number: u64,
    salt: String,
    signature: String,
}

/// Issues and checks challenges.
#[derive(Debug)]
pub(crate) struct Captcha {
    key: Vec<u8>,
    settings: CaptchaSettings,
    redis: Option<Arc<Redis>>,
    store: Arc<dyn Store>,
}

impl Captcha {
    pub(crate) fn new(
        key: Vec<u8>,
        settings: CaptchaSettings,
        redis: Option<Arc<Redis>>,
        store: Arc<dyn Store>,
    ) -> Self {
        Self {
            key,
            settings,
            redis,
            store,
        }
    }

    /// Whether an anonymous create, with `budget` left after it, needs a solved challenge:
    /// in auto mode once the client had used `after` of its budget before it.
    pub(crate) fn required(&self, budget: Option<Budget>) -> bool {
        match self.settings.mode {
            CaptchaMode::Off => false,
            CaptchaMode::Always => true,
            CaptchaMode::Auto => budget.is_some_and(|b| {
                // Used before this create (the budget already counts it).
                let used = f64::from(b.limit.saturating_sub(b.remaining).saturating_sub(1));
                used >= self.settings.after * f64::from(b.limit)
            }),
        }
    }

    /// Whether anonymous creates may ever be asked for a solution (the web app then runs the
    /// solver on its form).
    pub(crate) fn may_ask(&self) -> bool {
        self.settings.mode != CaptchaMode::Off
    }

    /// A fresh challenge, valid for [`CHALLENGE_SECONDS`] from `now`.
    pub(crate) fn challenge(&self, now: UnixSeconds) -> Challenge {
        let number = rand::random_range(0..=self.settings.max_number);
        altcha::create(
            &self.key,
            rand::random(),
            number,
            self.settings.max_number,
            now + CHALLENGE_SECONDS,
        )
    }

    /// Accepts a payload once: a solution of one of our challenges, unexpired, never seen.
    pub(crate) async fn check(&self, payload: &str, now: UnixSeconds) -> Result<(), Refused> {
        let json = STANDARD
            .decode(payload.trim())
            .map_err(|_| Refused::Invalid("the CAPTCHA payload is not base64".to_owned()))?;
        let p: Payload = serde_json::from_slice(&json).map_err(|e| {
            Refused::Invalid(format!("the CAPTCHA payload is not the expected JSON: {e}"))
        })?;
        let solution = Solution {
            algorithm: p.algorithm,
            challenge: p.challenge,
            number: p.number,
            salt: p.salt,
            signature: p.signature,
        };
        let expires = altcha::verify(&self.key, &solution, now)
            .map_err(|e| Refused::Invalid(e.to_string()))?;
        if self.take(&solution.challenge, expires, now).await? {
            Ok(())
        } else {
            Err(Refused::Invalid(
                "the CAPTCHA solution was used already".to_owned(),
            ))
        }
    }

    /// Marks a challenge used until it expires; `false` if any process used it before.
    async fn take(
        &self,
        challenge: &str,
        expires: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        if let Some(redis) = &self.redis {
            let ms = u64::try_from(expires - now).unwrap_or(1).max(1) * 1000;
            let set: Result<Option<String>, _> = redis
                .query(
                    redis::cmd("SET")
                        .arg(format!("shortener:altcha:{challenge}"))
                        .arg(1)
                        .arg("NX")
                        .arg("PX")
                        .arg(ms),
                )
                .await;
            match set {
                Ok(taken) => return Ok(taken.is_some()),
                Err(e) => {
                    tracing::debug!(error = %e, "CAPTCHA replay check on Redis failed; checking in the store")
                }
            }
        }
        self.store.spend_once(challenge, expires, now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CAPTCHA on a fresh embedded store in `dir`.
    fn captcha(mode: CaptchaMode, dir: &tempfile::TempDir) -> Captcha {
        let settings = CaptchaSettings {
            mode,
            after: 0.8,
            max_number: 50,
        };
        let store = crate::store::sqlite::SqliteStore::open(dir.path()).unwrap();
        Captcha::new(vec![3; 32], settings, None, Arc::new(store))
    }

    fn payload(c: &Challenge, number: u64) -> String {
        STANDARD.encode(
            serde_json::json!({
                "algorithm": c.algorithm, "challenge": c.challenge, "number": number,
                "salt": c.salt, "signature": c.signature,
            })
            .to_string(),
        )
    }

    #[tokio::test]
    async fn auto_asks_past_the_fraction_of_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let auto = captcha(CaptchaMode::Auto, &dir);
        let after = |remaining| {
            Some(Budget {
                limit: 10,
                remaining,
            })
        };
        assert!(!auto.required(after(2)));
        assert!(auto.required(after(1)));
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        assert!(captcha(CaptchaMode::Always, &a).required(after(9)));
        assert!(!captcha(CaptchaMode::Off, &b).required(after(0)));
    }

    #[tokio::test]
    async fn a_solution_is_good_once() {
        let dir = tempfile::tempdir().unwrap();
        let c = captcha(CaptchaMode::Always, &dir);
        let challenge = c.challenge(1_000);
        let number = altcha::solve(&challenge).unwrap();
        let good = payload(&challenge, number);
        assert!(c.check(&good, 1_001).await.is_ok());
        let invalid = |r: Result<(), Refused>| matches!(r, Err(Refused::Invalid(_)));
        assert!(invalid(c.check(&good, 1_002).await));
        assert!(invalid(c.check("%%%", 1_002).await));
        assert!(invalid(c.check(&STANDARD.encode("{}"), 1_002).await));
    }
}
