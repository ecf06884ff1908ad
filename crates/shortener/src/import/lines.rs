//! One line of an import file, read as CSV or as a JSON object; the field rules come after
//! (`new_link`).

use crate::config::ImportFormat;
use serde::Deserialize;

/// A line's fields, not yet validated.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Fields {
    pub long_url: String,
    #[serde(default)]
    pub custom_alias: Option<String>,
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// What a line holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Line {
    /// Nothing (blank), or a CSV header: skipped, not refused.
    Skip,
    Link(Fields),
}

/// The format named by the file's extension, else by its first line (`{` means JSON).
pub(super) fn sniff(path: &std::path::Path, first_line: &str) -> ImportFormat {
    match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => ImportFormat::Csv,
        Some("jsonl" | "ndjson") => ImportFormat::JsonLines,
        _ if first_line.trim_start().starts_with('{') => ImportFormat::JsonLines,
        _ => ImportFormat::Csv,
    }
}

/// Parses one line (without its line break). `first` marks line 1, where a CSV header may be.
pub(super) fn parse(format: ImportFormat, text: &str, first: bool) -> Result<Line, String> {
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.trim().is_empty() {
        return Ok(Line::Skip);
    }
    match format {
        ImportFormat::JsonLines => serde_json::from_str::<Fields>(text)
            .map(|f| {
                Line::Link(Fields {
                    custom_alias: f.custom_alias.filter(|a| !a.is_empty()),
                    expires_at: f.expires_at.filter(|e| !e.is_empty()),
                    ..f
                })
            })
            .map_err(|e| format!("not a JSON object of long_url, custom_alias, expires_at: {e}")),
        ImportFormat::Csv => {
            let mut fields = csv_fields(text)?.into_iter();
            let long_url = fields.next().unwrap_or_default();
            if first && long_url.trim() == "long_url" {
                return Ok(Line::Skip);
            }
            let mut optional = || fields.next().filter(|f| !f.is_empty());
            let (custom_alias, expires_at) = (optional(), optional());
            if fields.next().is_some() {
                return Err("more than 3 fields (long_url,custom_alias,expires_at)".into());
            }
            Ok(Line::Link(Fields {
                long_url,
                custom_alias,
                expires_at,
            }))
        }
    }
}

/// Splits a CSV record (RFC 4180: a field in double quotes may hold commas, `""` is a quote).
fn csv_fields(text: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("a quoted field is not closed".into()),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(_) => return Err("text after a quoted field".into()),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err("a quote inside an unquoted field".into()),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(text: &str) -> Result<Line, String> {
        parse(ImportFormat::Csv, text, false)
    }

    fn link(url: &str, alias: Option<&str>, at: Option<&str>) -> Line {
        Line::Link(Fields {
            long_url: url.into(),
            custom_alias: alias.map(Into::into),
            expires_at: at.map(Into::into),
        })
    }

    #[test]
    fn csv_lines_take_one_to_three_fields_quoted_or_not() {
        assert_eq!(
            csv("https://a.example/"),
            Ok(link("https://a.example/", None, None))
        );
        assert_eq!(
            csv("https://a.example/,promo\r"),
            Ok(link("https://a.example/", Some("promo"), None))
        );
        assert_eq!(
            csv("\"https://a.example/?q=1,2\",,2030-01-01T00:00:00Z"),
            Ok(link(
                "https://a.example/?q=1,2",
                None,
                Some("2030-01-01T00:00:00Z")
            ))
        );
        assert_eq!(
            csv("\"say \"\"hi\"\"\",x"),
            Ok(link("say \"hi\"", Some("x"), None))
        );
        assert!(csv("a,b,c,d").is_err());
        assert!(csv("\"open").is_err());
        assert!(csv("a\"b").is_err());
        assert_eq!(csv("   "), Ok(Line::Skip));
        assert_eq!(
            parse(ImportFormat::Csv, "long_url,custom_alias,expires_at", true),
            Ok(Line::Skip)
        );
    }

    #[test]
    fn json_lines_are_objects_of_the_three_fields() {
        let json = |t| parse(ImportFormat::JsonLines, t, false);
        assert_eq!(
            json(r#"{"long_url": "https://a.example/", "custom_alias": null}"#),
            Ok(link("https://a.example/", None, None))
        );
        assert_eq!(
            json(
                r#"{"long_url": "https://a.example/", "custom_alias": "promo", "expires_at": "2030-01-01T00:00:00Z"}"#
            ),
            Ok(link(
                "https://a.example/",
                Some("promo"),
                Some("2030-01-01T00:00:00Z")
            ))
        );
        assert!(json(r#"{"long_url": "https://a.example/", "other": 1}"#).is_err());
        assert!(json("https://a.example/").is_err());
    }

    #[test]
    fn the_format_comes_from_the_extension_then_the_first_line() {
        use std::path::Path;
        assert_eq!(sniff(Path::new("a.csv"), "{"), ImportFormat::Csv);
        assert_eq!(sniff(Path::new("a.jsonl"), "x"), ImportFormat::JsonLines);
        assert_eq!(
            sniff(Path::new("a.txt"), " {\"long_url\""),
            ImportFormat::JsonLines
        );
        assert_eq!(sniff(Path::new("a"), "https://x/"), ImportFormat::Csv);
    }
}
