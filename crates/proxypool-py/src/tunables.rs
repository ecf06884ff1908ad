//! Tunables by name: the library's `PoolConfig` from a JSON object of overrides, durations in
//! seconds. Shared by the Python and the Node bindings (the Node crate includes this file), so
//! that both read tunables one way.

use std::time::Duration;

use proxypool::{PoolConfig, Strategy};
use serde_json::{Map, Value};

/// A strategy by its JSON name (`"weighted"`, `"round_robin"`, `"least_connections"`).
pub(crate) fn strategy(name: &str) -> Result<Strategy, String> {
    serde_json::from_value(Value::String(name.to_owned())).map_err(|_| {
        format!("unknown strategy {name:?}: expected weighted, round_robin or least_connections")
    })
}

/// The library's defaults with the tunables laid over them. Tunables are named as the fields of
/// `PoolConfig` (nested ones as dicts: `health={"window": 20}`); durations are seconds.
pub(crate) fn pool_config(tunables: Value) -> Result<PoolConfig, String> {
    let mut config = serde_json::to_value(PoolConfig::default()).map_err(|e| e.to_string())?;
    overlay(&mut config, tunables, "")?;
    serde_json::from_value(config).map_err(|e| format!("invalid tunable: {e}"))
}

fn overlay(base: &mut Value, given: Value, path: &str) -> Result<(), String> {
    let (Value::Object(base), Value::Object(given)) = (base, given) else {
        return Err(format!("{path} must be a dict"));
    };
    for (name, value) in given {
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let Some(slot) = base.get_mut(&name) else {
            let mut known: Vec<&str> = base.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "unknown tunable {here:?} (known here: {})",
                known.join(", ")
            ));
        };
        if is_duration(slot) {
            *slot = seconds(&value, &here)?;
        } else if slot.is_object() {
            overlay(slot, value, &here)?;
        } else {
            *slot = value;
        }
    }
    Ok(())
}

/// serde's spelling of a `Duration`: `{"secs": …, "nanos": …}`.
fn is_duration(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|o| o.len() == 2 && o.contains_key("secs") && o.contains_key("nanos"))
}

fn seconds(v: &Value, name: &str) -> Result<Value, String> {
    let d = v
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{name} is a duration in seconds (a number >= 0), not {v}"))?;
    let mut o = Map::new();
    o.insert("secs".into(), d.as_secs().into());
    o.insert("nanos".into(), d.subsec_nanos().into());
    Ok(Value::Object(o))
}
