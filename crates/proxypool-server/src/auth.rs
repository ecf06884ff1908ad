//! Client credentials: the `--auth-file` (`user:password` per line) and Basic authorization
//! headers. Without an auth file the server only listens on loopback (checked in `config.rs`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::collections::HashMap;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Who may use the gateway and the API.
#[derive(Debug, Default)]
pub(crate) struct Credentials {
    users: HashMap<String, String>,
}

impl Credentials {
    /// Reads the file; bad lines are reported with their number and skipped.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read auth file {}: {e}", path.display()))?;
        let creds = Self::parse(&text, |line, why| {
            tracing::warn!(
                "auth file {} line {line}: {why}; line skipped",
                path.display()
            );
        });
        if creds.users.is_empty() {
            anyhow::bail!("auth file {} has no `user:password` line", path.display());
        }
        Ok(creds)
    }

    fn parse(text: &str, mut bad: impl FnMut(usize, &str)) -> Self {
        let mut users = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(':') {
                Some((user, pass)) if !user.is_empty() && !pass.is_empty() => {
                    users.insert(user.to_owned(), pass.to_owned());
                }
                _ => bad(i + 1, "expected user:password"),
            }
        }
        Self { users }
    }

    /// Whether `user` (the account name, without session parts) has this password.
    pub(crate) fn check(&self, user: &str, password: &str) -> bool {
        self.users
            .get(user)
            // Constant time, so response times do not reveal how much of a password matched.
            .is_some_and(|p| bool::from(p.as_bytes().ct_eq(password.as_bytes())))
    }
}

/// Decodes `Basic base64(user:password)`.
pub(crate) fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, pass) = decoded.split_once(':')?;
    Some((user.to_owned(), pass.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_header() {
        let mut bad_lines = Vec::new();
        let c = Credentials::parse(
            "# users\nalice:s3cret\nbroken\n\nbob:pw:with:colons\n",
            |l, _| bad_lines.push(l),
        );
        assert_eq!(bad_lines, [3]);
        assert!(c.check("alice", "s3cret"));
        assert!(!c.check("alice", "s3cre"));
        assert!(c.check("bob", "pw:with:colons"));
        assert!(!c.check("carol", "x"));
        let header = format!("Basic {}", STANDARD.encode("alice-session-7:s3cret"));
        assert_eq!(
            parse_basic(header.as_bytes()),
            Some(("alice-session-7".into(), "s3cret".into()))
        );
        assert_eq!(parse_basic(b"Bearer abc"), None);
    }
}
