//! Reading llmlb's admin `/metrics` text.

use super::*;

/// Reads the admin `/metrics` text.
pub async fn metrics_text(admin: SocketAddr) -> String {
    let req = get_request("/metrics", "admin");
    let (status, _, body) = call(admin, req).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(body.to_vec()).unwrap()
}

/// Sum of the samples of `name` whose label set contains every `label="value"` in `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' ']).next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of one Prometheus selector in `text`, written
/// `name{label="value",...}` (or a bare name): the sum of the samples
/// whose labels include every one given.
pub fn sample(text: &str, selector: &str) -> f64 {
    let (name, labels) = match selector.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}').expect("selector ends in }")),
        None => (selector, ""),
    };
    let pairs: Vec<(&str, &str)> = labels
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("label=\"value\"");
            (k.trim(), v.trim().trim_matches('"'))
        })
        .collect();
    metric_value(text, name, &pairs)
}
