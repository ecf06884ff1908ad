//! Rows the store tests write: links, the origin of their changes, clicks.

use shortener_core::audit::Origin;
use shortener_core::day::Day;
use shortener_core::link::Link;
use shortener_core::store::ClickDelta;

/// A link under `code` (an alias when `alias`), created 2023-11-14, expiring in 2030.
pub fn link_at(code: &str, long_url: &str, alias: bool) -> Link {
    Link {
        custom_alias: alias,
        ..Link::new(code, long_url, 1_700_000_000, 1_900_000_000)
    }
}

/// The changes' author: the system, as the CLI's.
pub fn origin() -> Origin {
    Origin::system("test")
}

/// Clicks of `code` on day number `day`, no people.
pub fn delta(code: &str, day: i32, human: u64, bot: u64) -> ClickDelta {
    ClickDelta {
        code: code.into(),
        day: Day::from_number(day),
        human,
        bot,
        people: Default::default(),
    }
}
