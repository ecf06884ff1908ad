//! Sessions named in the proxy username, as commercial rotating gateways do:
//! `NAME-session-ID[-ttl-MINUTES]`. The pool keeps a session's address (its sticky binding);
//! this table adds the per-session TTL: once a session has been idle longer than its TTL it
//! starts over under a new pool key, so it gets a fresh placement instead of its old binding.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a proxy username says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity<'a> {
    /// The account name the password belongs to.
    pub(crate) user: &'a str,
    /// The session, if the username names one.
    pub(crate) session: Option<SessionName<'a>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionName<'a> {
    /// `NAME-session-ID`: sessions of different users never share a key.
    pub(crate) key: &'a str,
    pub(crate) ttl: Option<Duration>,
}

/// The longest TTL a username may ask for (about 23 months); a `-ttl-` suffix outside
/// 1..=this is part of the session ID instead (it used to overflow the minutes' conversion).
pub(crate) const MAX_TTL_MINUTES: u64 = 1_000_000;

/// Splits a username; a username without `-session-` is a plain account name.
pub(crate) fn parse_username(username: &str) -> Identity<'_> {
    let Some(at) = username.find("-session-") else {
        return Identity {
            user: username,
            session: None,
        };
    };
    let user = &username[..at];
    let rest = &username[at + "-session-".len()..];
    let (id_len, ttl) = match rest.rfind("-ttl-") {
        Some(t) => match rest[t + 5..].parse::<u64>() {
            Ok(minutes) if (1..=MAX_TTL_MINUTES).contains(&minutes) => {
                (t, Some(Duration::from_secs(minutes * 60)))
            }
            _ => (rest.len(), None),
        },
        None => (rest.len(), None),
    };
    if user.is_empty() || id_len == 0 {
        return Identity {
            user: username,
            session: None,
        };
    }
    Identity {
        user,
        session: Some(SessionName {
            key: &username[..at + "-session-".len() + id_len],
            ttl,
        }),
    }
}

#[derive(Debug)]
struct Entry {
    /// Bumped when the session outlives its TTL: the pool key changes with it.
    generation: u32,
    pool_key: Arc<str>,
    ttl: Duration,
    idle_until: Instant,
}

/// Live sessions. Cheap to clone; clones share one table.
#[derive(Debug, Clone)]
pub(crate) struct SessionTable {
    default_ttl: Duration,
    entries: Arc<Mutex<HashMap<Box<str>, Entry>>>,
}

impl SessionTable {
    pub(crate) fn new(default_ttl: Duration) -> Self {
        Self {
            default_ttl,
            entries: Arc::default(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<Box<str>, Entry>> {
        match self.entries.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The pool key for a request of this session now; renews the session's idle deadline.
    pub(crate) fn pool_key(&self, session: &SessionName<'_>) -> Arc<str> {
        let now = Instant::now();
        let ttl = session.ttl.unwrap_or(self.default_ttl);
        let mut entries = self.entries();
        match entries.get_mut(session.key) {
            Some(e) => {
                if now > e.idle_until {
                    e.generation += 1;
                    e.pool_key = format!("{}~{}", session.key, e.generation).into();
                }
                e.ttl = ttl;
                e.idle_until = now + ttl;
                e.pool_key.clone()
            }
            None => {
                let key: Arc<str> = session.key.into();
                entries.insert(
                    session.key.into(),
                    Entry {
                        generation: 0,
                        pool_key: key.clone(),
                        ttl,
                        idle_until: now + ttl,
                    },
                );
                key
            }
        }
    }

    /// A live session's pool key, without renewing it.
    pub(crate) fn lookup(&self, session: &str) -> Option<Arc<str>> {
        let entries = self.entries();
        let e = entries.get(session)?;
        (Instant::now() <= e.idle_until).then(|| e.pool_key.clone())
    }

    /// Forgets sessions idle past their TTL.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.entries().retain(|_, e| now <= e.idle_until);
    }

    /// Live sessions.
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames() {
        assert_eq!(
            parse_username("alice"),
            Identity {
                user: "alice",
                session: None
            }
        );
        let id = parse_username("alice-session-abc123");
        assert_eq!(id.user, "alice");
        assert_eq!(
            id.session,
            Some(SessionName {
                key: "alice-session-abc123",
                ttl: None
            })
        );
        let id = parse_username("team-a-session-x-1-ttl-15");
        assert_eq!(id.user, "team-a");
        assert_eq!(
            id.session,
            Some(SessionName {
                key: "team-a-session-x-1",
                ttl: Some(Duration::from_secs(900))
            })
        );
        // A malformed TTL is part of the id, not silently dropped.
        let id = parse_username("bob-session-x-ttl-soon");
        assert_eq!(id.session.map(|s| s.key), Some("bob-session-x-ttl-soon"));
        assert_eq!(parse_username("-session-x").session, None);
        assert_eq!(parse_username("bob-session-").session, None);
    }

    #[test]
    fn a_session_idle_past_its_ttl_gets_a_new_key() {
        let table = SessionTable::new(Duration::from_secs(60));
        let s = SessionName {
            key: "a-session-1",
            ttl: Some(Duration::from_millis(30)),
        };
        let first = table.pool_key(&s);
        assert_eq!(&*first, "a-session-1");
        assert_eq!(table.pool_key(&s), first);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(&*table.pool_key(&s), "a-session-1~1");
        table.sweep();
        assert_eq!(table.len(), 1);
    }
}
