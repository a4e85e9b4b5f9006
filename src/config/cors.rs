//! `[server.cors]`: cross-origin access to the client listener, for browser
//! apps that call llmlb directly. Unset: no CORS headers at all, and
//! preflight `OPTIONS` requests get 405 like any other unknown method.

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins allowed to call llmlb, exactly as browsers send them
    /// (`https://app.example.com`), or `"*"` for any origin.
    pub allow_origins: Vec<String>,
    /// Request headers a browser may send (answered to preflights).
    pub allow_headers: Vec<String>,
    /// How long a browser may cache a preflight answer, in seconds.
    pub max_age_secs: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allow_origins: Vec::new(),
            allow_headers: ["authorization", "content-type", "x-request-id"]
                .map(String::from)
                .to_vec(),
            max_age_secs: 600,
        }
    }
}

impl CorsConfig {
    /// The `Access-Control-Allow-Origin` value for a request from `origin`,
    /// or `None` when that origin is not allowed.
    pub fn allow(&self, origin: &str) -> Option<String> {
        if self.allow_origins.iter().any(|o| o == "*") {
            return Some("*".into());
        }
        self.allow_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin))
            .then(|| origin.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_exactly_or_by_wildcard() {
        let mut c = CorsConfig {
            allow_origins: vec!["https://a.example".into()],
            ..CorsConfig::default()
        };
        assert_eq!(
            c.allow("https://a.example").as_deref(),
            Some("https://a.example")
        );
        assert_eq!(c.allow("https://b.example"), None);
        c.allow_origins.push("*".into());
        assert_eq!(c.allow("https://b.example").as_deref(), Some("*"));
    }
}
