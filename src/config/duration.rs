//! Durations in the config are human strings: `"250ms"`, `"2s"`, `"5m"`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?} ({e}); write e.g. \"250ms\", \"2s\", \"5m\""
        ))
    })
}

pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
