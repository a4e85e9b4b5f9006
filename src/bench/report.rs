//! A run's report: what was run, every figure, the raw records; rendered as
//! a side-by-side table or written as JSON.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::BenchError;
use super::record::RequestRecord;
use super::stats::{Figures, Summary};

/// Everything one run measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// When the run started (RFC 3339, UTC, to the millisecond).
    #[serde(default)]
    pub date: String,
    /// The llmlb version that ran it.
    #[serde(default)]
    pub version: String,
    /// The command line, with secrets (`--api-key`, header values) masked.
    #[serde(default)]
    pub args: Vec<String>,
    pub target: String,
    pub model: String,
    pub workload: String,
    pub arrivals: String,
    pub seed: u64,
    #[serde(flatten)]
    pub figures: Figures,
    /// One entry per request sent, in the order they finished.
    pub requests: Vec<RequestRecord>,
}

impl RunReport {
    pub fn write_json(&self, path: &Path) -> Result<(), BenchError> {
        let text = serde_json::to_string_pretty(self).expect("reports always serialize");
        std::fs::write(path, text).map_err(|source| BenchError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    pub fn read_json(path: &Path) -> Result<RunReport, BenchError> {
        let err = |reason: String| BenchError::ReadReport {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| err(e.to_string()))
    }
}

fn dist_rows(
    rows: &mut Vec<(String, Vec<String>)>,
    name: &str,
    key: &str,
    of: &[&Figures],
    pick: fn(&Figures) -> &Summary,
    extra: &[String],
) {
    let cell = |count: usize, v: Option<f64>| match v {
        Some(v) if count > 0 => format!("{v:.2}"),
        _ => "-".into(),
    };
    rows.push((
        format!("{name} mean (ms)"),
        of.iter()
            .map(|f| cell(pick(f).count, Some(pick(f).mean)))
            .collect(),
    ));
    if extra.is_empty() {
        for (label, p) in [
            ("p50", (|s: &Summary| s.p50) as fn(&Summary) -> f64),
            ("p90", |s| s.p90),
            ("p99", |s| s.p99),
        ] {
            rows.push((
                format!("{name} {label} (ms)"),
                of.iter()
                    .map(|f| cell(pick(f).count, Some(p(pick(f)))))
                    .collect(),
            ));
        }
        return;
    }
    for label in extra {
        rows.push((
            format!("{name} {label} (ms)"),
            of.iter()
                .map(|f| {
                    let v = f.percentiles.get(key).and_then(|m| m.get(label)).copied();
                    cell(pick(f).count, v)
                })
                .collect(),
        ));
    }
}

/// The `--metric-percentiles` labels any run carries, in numeric order.
fn extra_labels(of: &[&Figures]) -> Vec<String> {
    let mut labels: Vec<String> = of
        .iter()
        .flat_map(|f| f.percentiles.values().flat_map(|m| m.keys().cloned()))
        .collect();
    let num = |l: &String| l[1..].parse::<f64>().unwrap_or(0.0);
    labels.sort_by(|a, b| num(a).total_cmp(&num(b)));
    labels.dedup();
    labels
}

/// A comparison table with one column per named run.
pub fn render_table(reports: &[(String, RunReport)]) -> String {
    let f: Vec<&Figures> = reports.iter().map(|(_, r)| &r.figures).collect();
    let col = |g: &dyn Fn(&Figures) -> String| f.iter().map(|x| g(x)).collect::<Vec<_>>();
    let mut rows: Vec<(String, Vec<String>)> = vec![
        (
            "workload".into(),
            reports.iter().map(|(_, r)| r.workload.clone()).collect(),
        ),
        (
            "arrivals".into(),
            reports.iter().map(|(_, r)| r.arrivals.clone()).collect(),
        ),
        (
            "completed / sent".into(),
            col(&|x| format!("{} / {}", x.completed, x.sent)),
        ),
        (
            "duration (s)".into(),
            col(&|x| format!("{:.2}", x.duration_s)),
        ),
        (
            "requests/s".into(),
            col(&|x| format!("{:.2}", x.request_throughput)),
        ),
        (
            "output tokens/s".into(),
            col(&|x| format!("{:.1}", x.output_throughput)),
        ),
        (
            "total tokens/s".into(),
            col(&|x| format!("{:.1}", x.total_token_throughput)),
        ),
    ];
    if f.iter().any(|x| x.goodput.is_some()) {
        rows.push((
            "goodput (req/s)".into(),
            col(&|x| match (x.goodput, x.good_requests) {
                (Some(g), Some(n)) => format!("{g:.2} ({n} ok)"),
                _ => "-".into(),
            }),
        ));
    }
    let extra = extra_labels(&f);
    dist_rows(&mut rows, "TTFT", "ttft_ms", &f, |x| &x.ttft_ms, &extra);
    dist_rows(&mut rows, "TPOT", "tpot_ms", &f, |x| &x.tpot_ms, &extra);
    dist_rows(&mut rows, "ITL", "itl_ms", &f, |x| &x.itl_ms, &extra);
    dist_rows(&mut rows, "E2E", "e2e_ms", &f, |x| &x.e2e_ms, &extra);
    rows.push(("429s".into(), col(&|x| x.rejected_429.to_string())));
    rows.push((
        "errors".into(),
        col(&|x| {
            if x.errors.is_empty() {
                "none".into()
            } else {
                x.errors
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        }),
    ));
    if f.iter().any(|x| !x.replicas.is_empty()) {
        rows.push((
            "replicas (max/mean)".into(),
            col(&|x| match x.replica_max_over_mean {
                Some(r) => format!("{} ({r:.2})", x.replicas.len()),
                None => "-".into(),
            }),
        ));
        rows.push((
            "requests per replica".into(),
            col(&|x| {
                x.replicas
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }),
        ));
    }
    let header: Vec<String> = reports.iter().map(|(n, _)| n.clone()).collect();
    let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0).max(6);
    let widths: Vec<usize> = (0..reports.len())
        .map(|i| {
            rows.iter()
                .map(|(_, v)| v[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, label: &str, cells: &[String]| {
        let _ = write!(out, "{label:<label_w$}");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(out, "  {c:>w$}");
        }
        out.push('\n');
    };
    line(&mut out, "metric", &header);
    let rule = "-".repeat(label_w + widths.iter().map(|w| w + 2).sum::<usize>());
    out.push_str(&rule);
    out.push('\n');
    for (label, cells) in &rows {
        line(&mut out, label, cells);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::Outcome;
    use crate::bench::spec::Slo;

    fn report(ttfts: &[f64]) -> RunReport {
        let requests: Vec<RequestRecord> = ttfts
            .iter()
            .map(|&t| RequestRecord {
                start_ms: 0.0,
                ttft_ms: Some(t),
                e2e_ms: t + 90.0,
                itl_ms: vec![10.0; 9],
                input_tokens: 5,
                output_tokens: 10,
                outcome: Outcome::Ok,
                replica: Some("a".into()),
                error: None,
            })
            .collect();
        RunReport {
            workload: "random".into(),
            arrivals: "closed loop, concurrency 1".into(),
            figures: Figures::compute(&requests, 1.0, &"ttft=15".parse::<Slo>().unwrap()),
            requests,
            ..RunReport::default()
        }
    }

    #[test]
    fn table_has_one_column_per_run() {
        let t = render_table(&[
            ("direct".into(), report(&[10.0, 20.0])),
            ("via-llmlb".into(), report(&[12.0])),
        ]);
        let header = t.lines().next().unwrap();
        assert!(header.contains("direct") && header.contains("via-llmlb"));
        let ttft = t.lines().find(|l| l.starts_with("TTFT p50")).unwrap();
        assert!(ttft.contains("15.00") && ttft.contains("12.00"), "{ttft}");
        let good = t.lines().find(|l| l.starts_with("goodput")).unwrap();
        assert!(good.contains("1.00 (1 ok)"), "{good}");
        assert!(t.contains("requests per replica"));
    }

    #[test]
    fn json_round_trip_keeps_every_figure() {
        let r = report(&[10.0, 20.0, 30.0]);
        let dir = std::env::temp_dir().join(format!("llmlb-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        r.write_json(&path).unwrap();
        let back = RunReport::read_json(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back.figures, r.figures);
        assert_eq!(back.requests.len(), 3);
        assert_eq!(back.requests[0].ttft_ms, Some(10.0));
    }
}
