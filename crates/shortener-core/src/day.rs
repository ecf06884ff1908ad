//! UTC days, the unit of analytics.

use std::fmt;
use time::{Date, OffsetDateTime};

/// Seconds since the Unix epoch, UTC.
pub type UnixSeconds = i64;

const SECONDS_PER_DAY: i64 = 86_400;

/// Days of history that analytics keep and report.
pub const ANALYTICS_DAYS: u32 = 30;

/// A UTC calendar day, counted in days since 1970-01-01.
///
/// ```
/// use shortener_core::day::Day;
/// let day = Day::from_unix(1_700_000_000);
/// assert_eq!(day.to_string(), "2023-11-14");
/// assert_eq!(Day::from_unix(-1).to_string(), "1969-12-31");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(i32);

impl Day {
    /// The day that contains the instant `secs`. Inline: the click fold asks for every click.
    #[inline]
    pub fn from_unix(secs: UnixSeconds) -> Self {
        // Any i64 / 86400 fits i32 for instants up to year 5.8 million; clamp for the rest.
        let days = secs.div_euclid(SECONDS_PER_DAY);
        Self(days.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
    }

    /// From the stored day number.
    pub const fn from_number(days_since_epoch: i32) -> Self {
        Self(days_since_epoch)
    }

    /// The stored day number.
    pub const fn number(self) -> i32 {
        self.0
    }

    /// The day `n` days before this one.
    pub const fn minus(self, n: u32) -> Self {
        Self(self.0.saturating_sub(n as i32))
    }

    /// The calendar date; `None` only for days outside the calendar `time` supports.
    pub fn date(self) -> Option<Date> {
        let midnight = i64::from(self.0) * SECONDS_PER_DAY;
        OffsetDateTime::from_unix_timestamp(midnight)
            .ok()
            .map(|t| t.date())
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.date() {
            Some(d) => write!(
                f,
                "{:04}-{:02}-{:02}",
                d.year(),
                u8::from(d.month()),
                d.day()
            ),
            None => write!(f, "day{}", self.0),
        }
    }
}

/// The `ANALYTICS_DAYS` days ending with `today`, oldest first.
///
/// ```
/// use shortener_core::day::{window_days, Day};
/// let today = Day::from_number(100);
/// let window: Vec<Day> = window_days(today).collect();
/// assert_eq!(window.len(), 30);
/// assert_eq!(window[29], today);
/// assert_eq!(window[0], Day::from_number(71));
/// ```
pub fn window_days(today: Day) -> impl Iterator<Item = Day> {
    (today.minus(ANALYTICS_DAYS - 1).0..=today.0).map(Day)
}

/// Formats an instant as RFC 3339 in UTC with a `Z` suffix and whole seconds.
///
/// ```
/// use shortener_core::day::rfc3339;
/// assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
/// ```
pub fn rfc3339(secs: UnixSeconds) -> String {
    let Ok(t) = OffsetDateTime::from_unix_timestamp(secs) else {
        return String::from("invalid-time");
    };
    // `time` knows years up to 9999: only negative ones need more than four digits.
    let Ok(year) = u32::try_from(t.year()) else {
        return formatted(t);
    };
    // Digits put in place: every create answers with two instants, and `format!` cost more
    // than the rest of its JSON.
    let mut out = *b"0000-00-00T00:00:00Z";
    let fields = [
        (0..4, year),
        (5..7, u32::from(u8::from(t.month()))),
        (8..10, u32::from(t.day())),
        (11..13, u32::from(t.hour())),
        (14..16, u32::from(t.minute())),
        (17..19, u32::from(t.second())),
    ];
    for (at, mut n) in fields {
        for digit in out[at].iter_mut().rev() {
            *digit = b'0' + u8::try_from(n % 10).unwrap_or(0);
            n /= 10;
        }
    }
    // ASCII digits and separators: one copy (collecting them as chars cost ~500 instructions).
    String::from_utf8_lossy(&out).into_owned()
}

/// [`rfc3339`] of a year before 0 (four digits and a sign).
fn formatted(t: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Parses an RFC 3339 instant (any offset) into Unix seconds, dropping fractions.
///
/// ```
/// use shortener_core::day::parse_rfc3339;
/// assert_eq!(parse_rfc3339("1970-01-01T00:01:00Z"), Some(60));
/// assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
/// assert_eq!(parse_rfc3339("yesterday"), None);
/// ```
pub fn parse_rfc3339(text: &str) -> Option<UnixSeconds> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(OffsetDateTime::unix_timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_writes_what_format_writes_and_parses_back() {
        let instants = [
            0,
            1,
            59,
            951_782_400 + 86_399, // 2000-02-29T23:59:59Z
            1_764_633_600,
            4_102_444_799,
            -62_135_596_800,                // 0001-01-01
            253_402_300_799,                // 9999-12-31T23:59:59Z
            -62_167_219_200 - 86_400 * 366, // year -1: the fallback
        ];
        for secs in instants
            .into_iter()
            .chain((0..400).map(|i| i * 7_919_993 - 1_000_000_000))
        {
            let t = OffsetDateTime::from_unix_timestamp(secs).unwrap();
            assert_eq!(rfc3339(secs), formatted(t), "{secs}");
            if (0..=9999).contains(&t.year()) {
                assert_eq!(parse_rfc3339(&rfc3339(secs)), Some(secs), "{secs}");
            }
        }
        assert_eq!(rfc3339(i64::MAX), "invalid-time");
    }

    #[test]
    fn day_boundaries_are_utc_midnight() {
        assert_eq!(Day::from_unix(86_399), Day(0));
        assert_eq!(Day::from_unix(86_400), Day(1));
        assert_eq!(Day::from_unix(951_782_400).to_string(), "2000-02-29");
    }

    #[test]
    fn the_window_is_thirty_consecutive_days() {
        let w: Vec<Day> = window_days(Day(1000)).collect();
        assert_eq!((w.len(), w[0], w[29]), (30, Day(971), Day(1000)));
        assert!(w.windows(2).all(|p| p[1].0 == p[0].0 + 1));
    }
}
