//! The demo's headline table: one row per balancer.

use super::fleet::PrefixCache;
use crate::bench::Figures;

#[derive(Debug, Clone)]
pub struct DemoRow {
    pub balancer: String,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub completed: u64,
    pub failed: u64,
    /// Fleet prefix-cache hit rate from the replicas' own metrics.
    pub prefix_hit_rate: Option<f64>,
    /// Busiest replica's request count over the mean.
    pub max_over_mean: Option<f64>,
}

impl DemoRow {
    pub fn new(balancer: &str, f: &Figures, cache: PrefixCache) -> DemoRow {
        DemoRow {
            balancer: balancer.to_string(),
            ttft_p50_ms: f.ttft_ms.p50,
            ttft_p99_ms: f.ttft_ms.p99,
            output_tokens_per_s: f.output_throughput,
            requests_per_s: f.request_throughput,
            completed: f.completed,
            failed: f.failed,
            prefix_hit_rate: cache.hit_rate(),
            max_over_mean: f.replica_max_over_mean,
        }
    }
}

pub fn render(rows: &[DemoRow]) -> String {
    let header = [
        "balancer",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "req/s",
        "out tok/s",
        "prefix hits",
        "max/mean load",
        "ok/failed",
    ];
    let body: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.balancer.clone(),
                format!("{:.1}", r.ttft_p50_ms),
                format!("{:.1}", r.ttft_p99_ms),
                format!("{:.2}", r.requests_per_s),
                format!("{:.0}", r.output_tokens_per_s),
                r.prefix_hit_rate
                    .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
                r.max_over_mean.map_or("-".into(), |m| format!("{m:.2}")),
                format!("{}/{}", r.completed, r.failed),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &body {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    out.push_str(&"-".repeat(out.len() - 1));
    for row in &body {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_rows() {
        let row = DemoRow {
            balancer: "jsq".into(),
            ttft_p50_ms: 12.345,
            ttft_p99_ms: 80.0,
            output_tokens_per_s: 1234.4,
            requests_per_s: 3.5,
            completed: 10,
            failed: 0,
            prefix_hit_rate: Some(0.5),
            max_over_mean: None,
        };
        let text = render(&[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].starts_with("jsq"));
        assert!(
            lines[2].contains("12.3") && lines[2].contains("50.0%") && lines[2].contains("10/0")
        );
        assert_eq!(lines[0].len(), lines[2].len());
    }
}
