//! A link's analytics over the 30-day window: the one computation behind the JSON and CSV
//! answers of the API and the web pages. Days are zero-filled, unique visitors merge the
//! days' sketches, breakdowns sum the days' top values.

use crate::store::Store;
use serde::Serialize;
use shortener_core::day::{ANALYTICS_DAYS, Day, window_days};
use shortener_core::hll::Hll;
use shortener_core::link::Link;
use shortener_core::people::{Dimension, TopN};
use shortener_core::store::{DailyCount, StoreError};
use std::collections::HashMap;
use utoipa::ToSchema;

/// Clicks of one UTC day.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct DailyClicks {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// Clicks by people.
    pub clicks: u64,
    /// Clicks by known bots and link previews.
    pub bot_clicks: u64,
    /// Distinct people that day (HyperLogLog: within about 1 %).
    pub unique_visitors: u64,
}

/// One value of a breakdown and the clicks by people that had it; the last entry may be
/// `other` (every value outside the top 20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct BreakdownEntry {
    pub name: String,
    pub clicks: u64,
}

/// Click analytics of a link: totals, the last 30 days, and the breakdowns asked for.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Analytics {
    pub short_code: String,
    /// Clicks by people since the link was created.
    pub total_clicks: u64,
    /// Clicks by known bots and link previews, counted apart.
    pub bot_clicks: u64,
    /// Distinct people over the 30 days (HyperLogLog: within about 1 %); bots never count.
    pub unique_visitors: u64,
    /// The last 30 UTC days, oldest first, zero-filled.
    pub daily_clicks: Vec<DailyClicks>,
    /// Referrer domains (`direct`: no Referer), with `breakdown=referrers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub referrers: Option<Vec<BreakdownEntry>>,
    /// Browsers, with `breakdown=browsers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub browsers: Option<Vec<BreakdownEntry>>,
    /// Operating systems, with `breakdown=os`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<Vec<BreakdownEntry>>,
    /// `desktop`, `mobile`, `tablet`, `other`, with `breakdown=devices`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<BreakdownEntry>>,
    /// ISO 3166-1 country codes (`unknown`: not in the database), with
    /// `breakdown=countries` (needs `--geoip`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub countries: Option<Vec<BreakdownEntry>>,
}

impl Analytics {
    /// The daily rows as CSV: `date,clicks,bot_clicks,unique_visitors`, oldest first.
    pub(crate) fn to_csv(&self) -> String {
        let mut out = String::from("date,clicks,bot_clicks,unique_visitors\n");
        for d in &self.daily_clicks {
            out.push_str(&format!(
                "{},{},{},{}\n",
                d.date, d.clicks, d.bot_clicks, d.unique_visitors
            ));
        }
        out
    }
}

/// The analytics of `link` over the window ending `today`, with the `breakdowns` asked for.
pub(crate) async fn link_analytics(
    store: &dyn Store,
    link: &Link,
    today: Day,
    breakdowns: &[Dimension],
) -> Result<Analytics, StoreError> {
    let rows = store
        .daily_clicks(&link.code, today.minus(ANALYTICS_DAYS - 1))
        .await?;
    Ok(window(link, today, &rows, breakdowns))
}

fn window(link: &Link, today: Day, rows: &[DailyCount], breakdowns: &[Dimension]) -> Analytics {
    let first = today.minus(ANALYTICS_DAYS - 1);
    let by_day: HashMap<Day, &DailyCount> = rows
        .iter()
        .filter(|r| r.day >= first && r.day <= today)
        .map(|r| (r.day, r))
        .collect();
    let mut visitors = Hll::default();
    let daily_clicks = window_days(today)
        .map(|day| {
            let row = by_day.get(&day);
            if let Some(row) = row {
                visitors.merge(&row.people.visitors);
            }
            DailyClicks {
                date: day.to_string(),
                clicks: row.map_or(0, |r| r.human),
                bot_clicks: row.map_or(0, |r| r.bot),
                unique_visitors: row.map_or(0, |r| r.people.visitors.estimate()),
            }
        })
        .collect();
    let breakdown = |dimension: Dimension| {
        breakdowns.contains(&dimension).then(|| {
            TopN::sum_trimmed(by_day.values().map(|r| r.people.top(dimension)))
                .ranked()
                .into_iter()
                .map(|(name, clicks)| BreakdownEntry { name, clicks })
                .collect()
        })
    };
    Analytics {
        short_code: link.code.clone(),
        total_clicks: link.clicks,
        bot_clicks: link.bot_clicks,
        unique_visitors: visitors.estimate(),
        daily_clicks,
        referrers: breakdown(Dimension::Referrers),
        browsers: breakdown(Dimension::Browsers),
        os: breakdown(Dimension::Os),
        devices: breakdown(Dimension::Devices),
        countries: breakdown(Dimension::Countries),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use shortener_core::people::{People, visitor_hash};

    fn day(n: i32, human: u64, visitors: std::ops::Range<u8>, browser: &str) -> DailyCount {
        let mut people = People::default();
        for v in visitors {
            let hash = visitor_hash(&[5; 16], [192, 0, 2, v].into(), "UA");
            people.count(hash, &[(Dimension::Browsers, browser)]);
        }
        DailyCount {
            day: Day::from_number(n),
            human,
            bot: 1,
            people,
        }
    }

    #[test]
    fn the_window_merges_visitors_and_sums_breakdowns_over_its_days_only() {
        let link = Link::new("window", "https://example.com/", 0, i64::MAX);
        let today = Day::from_number(1_000);
        let rows = [
            day(1_000, 30, 0..30, "Firefox"),
            // Ten of yesterday's 20 came back today: 40 people over the window.
            day(999, 20, 20..40, "Safari"),
            // Outside the window: ignored.
            day(970, 5, 100..105, "Opera"),
        ];
        let a = window(&link, today, &rows, &[Dimension::Browsers]);
        assert_eq!(a.unique_visitors, 40);
        assert_eq!(a.daily_clicks.len(), 30);
        let last = &a.daily_clicks[29];
        assert_eq!(
            (last.clicks, last.bot_clicks, last.unique_visitors),
            (30, 1, 30)
        );
        assert_eq!(a.daily_clicks[28].unique_visitors, 20);
        assert_eq!(
            a.browsers.unwrap(),
            vec![
                BreakdownEntry {
                    name: "Firefox".into(),
                    clicks: 30
                },
                BreakdownEntry {
                    name: "Safari".into(),
                    clicks: 20
                },
            ]
        );
        assert!(a.referrers.is_none() && a.countries.is_none());
        let csv = window(&link, today, &rows, &[]).to_csv();
        assert_eq!(csv.lines().count(), 31);
        assert!(csv.ends_with(&format!("{today},30,1,30\n")));
    }
}
