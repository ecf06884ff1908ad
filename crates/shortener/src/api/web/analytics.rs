//! How a link's page shows its analytics: stacked bars of people and bots, a line of unique
//! visitors, the breakdowns as tables. The chart is SVG drawn here, so it needs no script.

use crate::analytics::{Analytics, BreakdownEntry, DailyClicks};
use maud::{Markup, html};

/// Chart geometry, in SVG units (the image scales to its box).
const WIDTH: u64 = 720;
const HEIGHT: u64 = 200;
const LEFT: u64 = 40;
const BOTTOM: u64 = 24;
const TOP: u64 = 8;

/// A stacked series of the chart: CSS class, legend, the day's value.
struct Series {
    class: &'static str,
    label: &'static str,
    value: fn(&DailyClicks) -> u64,
}

fn series() -> [Series; 2] {
    [
        Series {
            class: "people",
            label: "People",
            value: |d| d.clicks,
        },
        Series {
            class: "bots",
            label: "Bots and previews",
            value: |d| d.bot_clicks,
        },
    ]
}

/// The analytics section of the page of `code`.
pub(super) fn section(code: &str, analytics: &Analytics) -> Markup {
    let series = series();
    html! {
        section.card aria-labelledby="analytics-h" {
            h2 #analytics-h { "Clicks, last 30 days" }
            p.totals {
                "All time: " strong #total-people { (analytics.total_clicks) } " by people, "
                strong #total-bots { (analytics.bot_clicks) } " by bots and link previews. "
                "Last 30 days: " strong #unique-visitors { (analytics.unique_visitors) }
                @if analytics.unique_visitors == 1 { " unique visitor." } @else { " unique visitors." }
            }
            (chart(&analytics.daily_clicks, &series))
            ul.legend {
                @for s in &series { li { span class={ "swatch " (s.class) } {} (s.label) } }
                li { span class="swatch visitors" {} "Unique visitors" }
            }
            details {
                summary { "The numbers, day by day" }
                table.daily {
                    thead { tr {
                        th scope="col" { "Date" }
                        @for s in &series { th scope="col" class="num" { (s.label) } }
                        th scope="col" class="num" { "Unique visitors" }
                    } }
                    tbody {
                        @for day in analytics.daily_clicks.iter().rev() {
                            tr {
                                td { (day.date) }
                                @for s in &series { td.num { ((s.value)(day)) } }
                                td.num { (day.unique_visitors) }
                            }
                        }
                    }
                }
            }
            p { a href={ "/_/links/" (code) "/analytics.csv" } download { "Download as CSV" } }
        }
        (breakdowns(analytics))
    }
}

/// The breakdowns the analytics carry, one table each (people only, merged over 30 days).
fn breakdowns(analytics: &Analytics) -> Markup {
    let tables: Vec<(&str, &str, &Vec<BreakdownEntry>)> = [
        ("referrers", "Referrers", &analytics.referrers),
        ("browsers", "Browsers", &analytics.browsers),
        ("os", "Operating systems", &analytics.os),
        ("devices", "Devices", &analytics.devices),
        ("countries", "Countries", &analytics.countries),
    ]
    .into_iter()
    .filter_map(|(id, title, list)| list.as_ref().map(|l| (id, title, l)))
    .collect();
    html! {
        @if !tables.is_empty() {
            section.card aria-labelledby="sources-h" {
                h2 #sources-h { "Where people come from, last 30 days" }
                div.breakdowns {
                    @for (id, title, list) in &tables {
                        table.breakdown id={ "breakdown-" (id) } {
                            caption { (title) }
                            thead { tr { th scope="col" { "Name" } th scope="col" class="num" { "Clicks" } } }
                            tbody {
                                @if list.is_empty() { tr { td colspan="2" { "No clicks by people yet" } } }
                                @for entry in list.iter() {
                                    tr { td { (entry.name) } td.num { (entry.clicks) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Stacked bars, one per day, oldest on the left; each day's numbers in its `<title>` and
/// `data-*` attributes.
fn chart(days: &[DailyClicks], series: &[Series]) -> Markup {
    let total = |d: &DailyClicks| series.iter().map(|s| (s.value)(d)).sum::<u64>();
    let top = days.iter().map(total).max().unwrap_or(0).max(1);
    let plot_height = HEIGHT - BOTTOM - TOP;
    let slot = (WIDTH - LEFT) / u64::try_from(days.len().max(1)).unwrap_or(1);
    let bar = slot.saturating_sub(4).max(1);
    let scaled = |v: u64| v * plot_height / top;
    let summary = format!(
        "{} clicks by people and {} by bots over the last {} days",
        days.iter().map(|d| d.clicks).sum::<u64>(),
        days.iter().map(|d| d.bot_clicks).sum::<u64>(),
        days.len()
    );
    html! {
        svg.chart #chart viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-labelledby="chart-title" {
            title #chart-title { (summary) }
            line.axis x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) {}
            text.tick x=(LEFT - 6) y=(TOP + 10) text-anchor="end" { (top) }
            text.tick x=(LEFT - 6) y=(HEIGHT - BOTTOM) text-anchor="end" { "0" }
            polyline.visitors points=(visitor_points(days, slot, bar, &scaled)) {}
            @for (i, day) in days.iter().enumerate() {
                @let x = LEFT + u64::try_from(i).unwrap_or(0) * slot + 2;
                g.day data-date=(day.date) data-people=(day.clicks) data-bots=(day.bot_clicks) data-visitors=(day.unique_visitors) {
                    title { (day.date) ": " (day.clicks) " by people (" (day.unique_visitors) " unique), " (day.bot_clicks) " by bots" }
                    @for (class, y, h) in stack(day, series, &scaled) {
                        rect class=(class) x=(x) y=(y) width=(bar) height=(h) {}
                    }
                    // Room for the whole day, so that hovering an empty day shows its numbers.
                    rect.hit x=(x) y=(TOP) width=(bar) height=(plot_height) {}
                }
                @if i == 0 || i + 1 == days.len() || i == days.len() / 2 {
                    text.tick x=(x + bar / 2) y=(HEIGHT - 6) text-anchor="middle" { (day.date.get(5..).unwrap_or(&day.date)) }
                }
            }
        }
    }
}

/// The unique-visitors line, through the middle of each day's bar.
fn visitor_points(
    days: &[DailyClicks],
    slot: u64,
    bar: u64,
    scaled: &dyn Fn(u64) -> u64,
) -> String {
    days.iter()
        .enumerate()
        .map(|(i, day)| {
            let x = LEFT + u64::try_from(i).unwrap_or(0) * slot + 2 + bar / 2;
            format!("{x},{}", HEIGHT - BOTTOM - scaled(day.unique_visitors))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The day's bars bottom up: class, top edge and height of each non-empty series.
fn stack(
    day: &DailyClicks,
    series: &[Series],
    scaled: &dyn Fn(u64) -> u64,
) -> Vec<(&'static str, u64, u64)> {
    let mut base = HEIGHT - BOTTOM;
    let mut bars = Vec::new();
    for s in series {
        let h = scaled((s.value)(day));
        if h > 0 {
            base -= h;
            bars.push((s.class, base, h));
        }
    }
    bars
}
