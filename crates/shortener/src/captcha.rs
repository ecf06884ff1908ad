//! The CAPTCHA of anonymous creation: when it is asked for, ALTCHA challenges signed with a
//! key kept in the store (so every instance shares it), and refusal of replayed solutions —
//! in Redis in the scale-out mode (every instance refuses a solution any instance took), in
//! this process otherwise or while Redis does not answer.

use crate::ratelimit::Budget;
use crate::scaleout::redis::Redis;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use shortener_core::altcha::{self, Challenge, Solution};
use shortener_core::day::UnixSeconds;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How long a challenge may be solved.
pub(crate) const CHALLENGE_SECONDS: i64 = 600;
/// The store's name of the HMAC key.
pub(crate) const KEY_NAME: &str = "captcha_key";
/// Local replay memory is pruned of expired entries once it holds this many.
const PRUNE_AT: usize = 10_000;

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
    used: Mutex<HashMap<String, UnixSeconds>>,
    redis: Option<Arc<Redis>>,
}

impl Captcha {
    pub(crate) fn new(key: Vec<u8>, settings: CaptchaSettings, redis: Option<Arc<Redis>>) -> Self {
        Self {
            key,
            settings,
            used: Mutex::default(),
            redis,
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
    pub(crate) async fn check(&self, payload: &str, now: UnixSeconds) -> Result<(), String> {
        let json = STANDARD
            .decode(payload.trim())
            .map_err(|_| "the CAPTCHA payload is not base64".to_owned())?;
        let p: Payload = serde_json::from_slice(&json)
            .map_err(|e| format!("the CAPTCHA payload is not the expected JSON: {e}"))?;
        let solution = Solution {
            algorithm: p.algorithm,
            challenge: p.challenge,
            number: p.number,
            salt: p.salt,
            signature: p.signature,
        };
        let expires = altcha::verify(&self.key, &solution, now).map_err(|e| e.to_string())?;
        if self.take(&solution.challenge, expires, now).await {
            Ok(())
        } else {
            Err("the CAPTCHA solution was used already".to_owned())
        }
    }

    /// Marks a challenge used until it expires; `false` if it was used before.
    async fn take(&self, challenge: &str, expires: UnixSeconds, now: UnixSeconds) -> bool {
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
                Ok(taken) => return taken.is_some(),
                Err(e) => {
                    tracing::debug!(error = %e, "CAPTCHA replay check on Redis failed; checking locally")
                }
            }
        }
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if used.len() >= PRUNE_AT {
            used.retain(|_, until| *until > now);
        }
        used.insert(challenge.to_owned(), expires).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captcha(mode: CaptchaMode) -> Captcha {
        let settings = CaptchaSettings {
            mode,
            after: 0.8,
            max_number: 50,
        };
        Captcha::new(vec![3; 32], settings, None)
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

    #[test]
    fn auto_asks_past_the_fraction_of_the_budget() {
        let auto = captcha(CaptchaMode::Auto);
        let after = |remaining| {
            Some(Budget {
                limit: 10,
                remaining,
            })
        };
        assert!(!auto.required(after(2)));
        assert!(auto.required(after(1)));
        assert!(captcha(CaptchaMode::Always).required(after(9)));
        assert!(!captcha(CaptchaMode::Off).required(after(0)));
    }

    #[tokio::test]
    async fn a_solution_is_good_once() {
        let c = captcha(CaptchaMode::Always);
        let challenge = c.challenge(1_000);
        let number = altcha::solve(&challenge).unwrap();
        assert_eq!(c.check(&payload(&challenge, number), 1_001).await, Ok(()));
        assert!(c.check(&payload(&challenge, number), 1_002).await.is_err());
        assert!(c.check("%%%", 1_002).await.is_err());
        assert!(c.check(&STANDARD.encode("{}"), 1_002).await.is_err());
    }
}
