//! Per-client limits on link creation and on abuse reports (GCRA): in process, or shared by
//! every instance through Redis in the scale-out mode, with the local limiter as its
//! fallback.

use crate::scaleout::ratelimit::SharedLimits;
use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use governor::{DefaultKeyedRateLimiter, Quota};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

type Limiter<K> = DefaultKeyedRateLimiter<K, StateInformationMiddleware>;

/// Who is creating: an address for anonymous requests, a user otherwise; or an address
/// filing an abuse report (a budget of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Creator<'a> {
    Anonymous(IpAddr),
    User(&'a str),
    Reporter(IpAddr),
    /// An address trying a token on the web app's sign-in form.
    SignIn(IpAddr),
}

/// Sign-in attempts per address and hour: plenty for people, nothing for guessing (tokens
/// carry 192 random bits; the limit keeps the store from being hammered).
pub(crate) const SIGN_INS_PER_HOUR: u32 = 30;

/// The state of a client's budget, for the `RateLimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    pub limit: u32,
    pub remaining: u32,
}

/// A refused request: when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub limit: u32,
    pub retry_after: Duration,
}

/// Hourly budgets of link creation, one bucket per client.
#[derive(Debug)]
pub(crate) struct CreateLimits {
    anon: Limiter<IpAddr>,
    anon_per_hour: u32,
    user: Limiter<String>,
    user_per_hour: u32,
    reports: Limiter<IpAddr>,
    reports_per_hour: u32,
    sign_ins: Limiter<IpAddr>,
    shared: Option<SharedLimits>,
}

impl CreateLimits {
    pub(crate) fn new(
        anon_per_hour: NonZeroU32,
        user_per_hour: NonZeroU32,
        reports_per_hour: NonZeroU32,
    ) -> Self {
        Self {
            reports: DefaultKeyedRateLimiter::keyed(Quota::per_hour(reports_per_hour))
                .with_middleware(),
            reports_per_hour: reports_per_hour.get(),
            sign_ins: DefaultKeyedRateLimiter::keyed(Quota::per_hour(
                NonZeroU32::new(SIGN_INS_PER_HOUR).unwrap_or(NonZeroU32::MIN),
            ))
            .with_middleware(),
            anon: DefaultKeyedRateLimiter::keyed(Quota::per_hour(anon_per_hour)).with_middleware(),
            anon_per_hour: anon_per_hour.get(),
            user: DefaultKeyedRateLimiter::keyed(Quota::per_hour(user_per_hour)).with_middleware(),
            user_per_hour: user_per_hour.get(),
            shared: None,
        }
    }

    /// Budgets kept in Redis, shared with every instance; the local ones serve while Redis
    /// does not answer.
    pub(crate) fn shared(self, shared: SharedLimits) -> Self {
        Self {
            shared: Some(shared),
            ..self
        }
    }

    /// Takes one creation from the creator's budget, or says how long to wait.
    pub(crate) async fn check(&self, creator: Creator<'_>) -> Result<Budget, Refused> {
        if let Some(shared) = &self.shared {
            let (bucket, per_hour) = match creator {
                Creator::Anonymous(ip) => (format!("anon:{ip}"), self.anon_per_hour),
                Creator::User(user) => (format!("user:{user}"), self.user_per_hour),
                Creator::Reporter(ip) => (format!("report:{ip}"), self.reports_per_hour),
                Creator::SignIn(ip) => (format!("signin:{ip}"), SIGN_INS_PER_HOUR),
            };
            match shared.check(&bucket, per_hour).await {
                Ok(verdict) => return verdict,
                Err(e) => {
                    tracing::debug!(error = %e, "shared create limit unavailable; limiting locally")
                }
            }
        }
        self.check_local(creator)
    }

    fn check_local(&self, creator: Creator<'_>) -> Result<Budget, Refused> {
        match creator {
            Creator::Anonymous(ip) => check(&self.anon, &ip, self.anon_per_hour),
            Creator::User(user) => check(&self.user, &user.to_owned(), self.user_per_hour),
            Creator::Reporter(ip) => check(&self.reports, &ip, self.reports_per_hour),
            Creator::SignIn(ip) => check(&self.sign_ins, &ip, SIGN_INS_PER_HOUR),
        }
    }

    /// Forgets clients whose budget is full again, so memory follows the active clients.
    pub(crate) fn forget_idle(&self) {
        self.anon.retain_recent();
        self.anon.shrink_to_fit();
        self.user.retain_recent();
        self.user.shrink_to_fit();
        self.reports.retain_recent();
        self.reports.shrink_to_fit();
        self.sign_ins.retain_recent();
        self.sign_ins.shrink_to_fit();
    }
}

fn check<K>(limiter: &Limiter<K>, key: &K, limit: u32) -> Result<Budget, Refused>
where
    K: std::hash::Hash + Eq + Clone,
{
    match limiter.check_key(key) {
        Ok(state) => Ok(Budget {
            limit,
            remaining: state.remaining_burst_capacity(),
        }),
        Err(not_until) => Err(Refused {
            limit,
            retry_after: not_until.wait_time_from(limiter.clock().now()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_budget_runs_out_and_says_when_to_retry() {
        let limits = CreateLimits::new(
            NonZeroU32::new(3).unwrap(),
            NonZeroU32::new(10).unwrap(),
            NonZeroU32::new(10).unwrap(),
        );
        let ip = IpAddr::from([10, 0, 0, 1]);
        let remaining: Vec<u32> = (0..3)
            .map(|_| {
                limits
                    .check_local(Creator::Anonymous(ip))
                    .unwrap()
                    .remaining
            })
            .collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = limits.check_local(Creator::Anonymous(ip)).unwrap_err();
        assert_eq!(refused.limit, 3);
        // One cell of a 3-per-hour bucket comes back after 20 minutes.
        assert!(refused.retry_after > Duration::from_secs(19 * 60));
        assert!(refused.retry_after <= Duration::from_secs(20 * 60));
        // Another address and a user have budgets of their own.
        assert!(
            limits
                .check_local(Creator::Anonymous(IpAddr::from([10, 0, 0, 2])))
                .is_ok()
        );
        assert_eq!(
            limits
                .check_local(Creator::User("alice"))
                .unwrap()
                .remaining,
            9
        );
    }
}
