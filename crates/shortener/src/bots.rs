//! Telling people from bots and link-preview crawlers.

use axum::http::{HeaderMap, Method, header};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Verdicts remembered per worker thread. Real traffic repeats a few hundred user agents, so
/// nearly every request is answered from here: no regex run, no allocation.
const MEMO_CAPACITY: usize = 4096;

thread_local! {
    static MEMO: RefCell<(std::collections::hash_map::RandomState, HashMap<u64, bool>)> =
        RefCell::new(Default::default());
}

/// Classifies requests by method and `User-Agent`, with the pattern list maintained by the
/// `isbot` crate.
#[derive(Default)]
pub(crate) struct BotDetector {
    patterns: isbot::Bots,
}

impl std::fmt::Debug for BotDetector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BotDetector")
    }
}

impl BotDetector {
    /// Whether a redirect request came from a bot rather than a person. `HEAD` fetches no page
    /// (monitors, unfurlers); a browser always sends a `User-Agent`, so a missing or empty one
    /// is a script.
    pub(crate) fn is_bot(&self, method: &Method, headers: &HeaderMap) -> bool {
        if method == Method::HEAD {
            return true;
        }
        match headers.get(header::USER_AGENT).map(|v| v.to_str()) {
            Some(Ok(ua)) if !ua.trim().is_empty() => self.is_bot_agent(ua),
            _ => true,
        }
    }

    fn is_bot_agent(&self, ua: &str) -> bool {
        MEMO.with(|memo| {
            let mut memo = memo.borrow_mut();
            let (hasher, seen) = &mut *memo;
            let mut h = hasher.build_hasher();
            h.write(ua.as_bytes());
            let key = h.finish();
            if let Some(&verdict) = seen.get(&key) {
                return verdict;
            }
            let verdict = self.patterns.is_bot(ua);
            if seen.len() >= MEMO_CAPACITY {
                // Crude but bounded: a flood of unique agents only costs a regex run each.
                seen.clear();
            }
            seen.insert(key, verdict);
            verdict
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn ua(s: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::USER_AGENT, HeaderValue::from_static(s));
        h
    }

    #[test]
    fn browsers_are_people_crawlers_and_previews_are_not() {
        let d = BotDetector::default();
        let get = Method::GET;
        for person in [
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0",
        ] {
            assert!(!d.is_bot(&get, &ua(person)), "{person}");
        }
        for bot in [
            "Googlebot/2.1 (+http://www.google.com/bot.html)",
            "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
            "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
            "Twitterbot/1.0",
            "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
            "WhatsApp/2.23.20.0 A",
            "curl/8.5.0",
            "python-requests/2.32.3",
        ] {
            assert!(d.is_bot(&get, &ua(bot)), "{bot}");
        }
        // Asked again, from the memo: same answers.
        assert!(!d.is_bot(
            &get,
            &ua("Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0")
        ));
        assert!(d.is_bot(&get, &ua("Twitterbot/1.0")));
        assert!(d.is_bot(&get, &HeaderMap::new()));
        assert!(d.is_bot(&get, &ua("  ")));
        assert!(d.is_bot(
            &Method::HEAD,
            &ua("Mozilla/5.0 (X11; Linux x86_64; rv:131.0) Gecko/20100101 Firefox/131.0")
        ));
    }
}
