//! Integers as JSON Schema counts them: `87` and `87.0` are the same integer there, while
//! serde's integer types refuse the second. API documents say `integer`, so generated clients
//! (and JavaScript's `JSON.stringify` of computed values) may send either. The range is that
//! of an OpenAPI `int64`, what the documents state.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// An `int64` that also accepts a JSON number with a zero fraction.
///
/// ```
/// let a: service_edge::Integer = serde_json::from_str("-3").unwrap();
/// let b: service_edge::Integer = serde_json::from_str("-3.0").unwrap();
/// assert_eq!((a.0, b.0), (-3, -3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Integer(pub i64);

/// An integer in `0..=i64::MAX` that also accepts a JSON number with a zero fraction.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Req {
///     latency_ms: service_edge::WholeNumber,
/// }
/// let a: Req = serde_json::from_str(r#"{"latency_ms": 87}"#).unwrap();
/// let b: Req = serde_json::from_str(r#"{"latency_ms": 87.0}"#).unwrap();
/// assert_eq!((a.latency_ms.0, b.latency_ms.0), (87, 87));
/// assert!(serde_json::from_str::<Req>(r#"{"latency_ms": 87.5}"#).is_err());
/// assert!(serde_json::from_str::<Req>(r#"{"latency_ms": -1}"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WholeNumber(pub u64);

/// 2^63 as an `f64`: the floats with a zero fraction in `[-2^63, 2^63)` are the `i64`s.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

impl<'de> serde::Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Int;
        impl Visitor<'_> for Int {
            type Value = Integer;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer from -2^63 to 2^63 - 1")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Integer(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(Integer)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if v.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&v) {
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "checked just above: whole and in range"
                    )]
                    return Ok(Integer(v as i64));
                }
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }
        deserializer.deserialize_any(Int)
    }
}

impl<'de> serde::Deserialize<'de> for WholeNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Integer(v) = Integer::deserialize(deserializer)?;
        u64::try_from(v).map(WholeNumber).map_err(|_| {
            de::Error::invalid_value(de::Unexpected::Signed(v), &"a non-negative integer")
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn whole(json: &str) -> Option<u64> {
        serde_json::from_str::<WholeNumber>(json).ok().map(|w| w.0)
    }

    fn int(json: &str) -> Option<i64> {
        serde_json::from_str::<Integer>(json).ok().map(|w| w.0)
    }

    #[test]
    fn integers_in_either_spelling_and_nothing_else() {
        assert_eq!(whole("0"), Some(0));
        assert_eq!(whole("0.0"), Some(0));
        assert_eq!(whole("-0.0"), Some(0));
        assert_eq!(
            whole("9223372036854775807"),
            Some(9_223_372_036_854_775_807)
        );
        assert_eq!(whole("9223372036854775808"), None);
        assert_eq!(
            whole("9.2233720368547748e18"),
            Some(9_223_372_036_854_774_784)
        );
        assert_eq!(whole("9.223372036854775808e18"), None);
        assert_eq!(whole("1e3"), Some(1000));
        assert_eq!(whole("1.5"), None);
        assert_eq!(whole("-3"), None);
        assert_eq!(whole("\"5\""), None);
        assert_eq!(whole("null"), None);
        assert_eq!(int("-3.0"), Some(-3));
        assert_eq!(int("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(int("-9.223372036854775808e18"), Some(i64::MIN));
        assert_eq!(int("-9.3e18"), None);
        assert_eq!(int("0.5"), None);
    }

    /// A whole float the document's `integer` allows is read exactly, not one step off
    /// (serde_json's default float parsing can land an ulp away: found by schemathesis, which
    /// sent `3874509258295714.0` and was told `3874509258295713.5` is not an integer).
    #[test]
    fn large_whole_floats_are_read_exactly() {
        assert_eq!(whole("3874509258295714.0"), Some(3_874_509_258_295_714));
        assert_eq!(whole("3874509258295713.5"), None);
    }
}
