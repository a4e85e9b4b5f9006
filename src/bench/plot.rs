//! Latency CDFs as a self-contained SVG: one panel for TTFT, one for
//! end-to-end latency, one curve per run, on a logarithmic time axis (so a
//! 5 ms proxy and a 5 s queue fit one picture). Hand-written SVG, no
//! plotting dependency.
//!
//! Each curve is the empirical CDF of the run's completed requests, drawn
//! as a step line through at most 400 points (evenly spaced ranks).

use std::fmt::Write as _;
use std::path::Path;

use super::error::BenchError;
use super::report::RunReport;

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 60.0;
const MARGIN_T: f64 = 50.0;
const MAX_POINTS: usize = 400;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Sorted positive values (a zero latency cannot sit on a log axis; it is
/// drawn at the axis' left edge).
fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Decades covering every value: (log10 low, log10 high).
fn decades(all: &[&[f64]]) -> (f64, f64) {
    let pos = all
        .iter()
        .flat_map(|v| v.iter())
        .copied()
        .filter(|x| *x > 0.0);
    let (lo, hi) = pos.fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(x), h.max(x)));
    if lo > hi {
        return (0.0, 3.0);
    }
    let (lo, hi) = (lo.log10().floor(), hi.log10().ceil());
    (lo, if hi > lo { hi } else { lo + 1.0 })
}

fn panel(out: &mut String, x0: f64, title: &str, curves: &[(usize, Vec<f64>)]) {
    let refs: Vec<&[f64]> = curves.iter().map(|(_, v)| v.as_slice()).collect();
    let (lo, hi) = decades(&refs);
    let px = |ms: f64| {
        let l = if ms > 0.0 { ms.log10() } else { lo };
        x0 + (l.clamp(lo, hi) - lo) / (hi - lo) * PANEL_W
    };
    let py = |f: f64| MARGIN_T + (1.0 - f) * PANEL_H;
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
        x0 + PANEL_W / 2.0,
        MARGIN_T - 10.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{x0:.1}" y="{MARGIN_T:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#444"/>"##
    );
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let y = py(q);
        let _ = writeln!(
            out,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{q}</text>"##,
            x0 + PANEL_W,
            x0 - 5.0,
            y + 4.0
        );
    }
    let mut d = lo;
    while d <= hi + 1e-9 {
        let x = px(10f64.powf(d));
        let label = decade_label(d as i32);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{MARGIN_T:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            MARGIN_T + PANEL_H,
            MARGIN_T + PANEL_H + 16.0
        );
        d += 1.0;
    }
    for (color, values) in curves {
        if values.is_empty() {
            continue;
        }
        let n = values.len();
        let step = n.div_ceil(MAX_POINTS).max(1);
        let mut points = String::new();
        let mut prev_y = py(0.0);
        let mut ranks: Vec<usize> = (0..n).step_by(step).collect();
        if ranks.last() != Some(&(n - 1)) {
            ranks.push(n - 1);
        }
        for i in ranks {
            let x = px(values[i]);
            let y = py((i + 1) as f64 / n as f64);
            let _ = write!(points, "{x:.1},{prev_y:.1} {x:.1},{y:.1} ");
            prev_y = y;
        }
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.8" points="{}"/>"#,
            COLORS[color % COLORS.len()],
            points.trim_end()
        );
    }
}

/// `10^e` milliseconds, written without float noise.
fn decade_label(e: i32) -> String {
    match e {
        e if e >= 3 => format!("{} s", 10u64.pow((e - 3) as u32)),
        e if e >= 0 => format!("{} ms", 10u64.pow(e as u32)),
        e => format!("{:.*} ms", (-e) as usize, 10f64.powi(e)),
    }
}

/// One curve's data: latencies of completed requests, in ms.
#[derive(Debug, Clone, Default)]
pub struct Curves {
    pub name: String,
    pub ttft_ms: Vec<f64>,
    pub e2e_ms: Vec<f64>,
    pub completed: u64,
}

/// The SVG text for `runs`.
pub fn svg(runs: &[(String, RunReport)]) -> String {
    let curves: Vec<Curves> = runs
        .iter()
        .map(|(name, r)| {
            let ok = || r.requests.iter().filter(|q| q.outcome.is_ok());
            Curves {
                name: name.clone(),
                ttft_ms: ok().filter_map(|q| q.ttft_ms).collect(),
                e2e_ms: ok().map(|q| q.e2e_ms).collect(),
                completed: r.figures.completed,
            }
        })
        .collect();
    svg_of(&curves)
}

/// The SVG text for any set of latency samples (`bench` runs, `simulate` policies).
pub fn svg_of(runs: &[Curves]) -> String {
    let width = MARGIN_L * 2.0 + PANEL_W * 2.0 + 40.0;
    let legend_h = 20.0 * runs.len() as f64;
    let height = MARGIN_T + PANEL_H + 40.0 + legend_h + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut ttft = Vec::new();
    let mut e2e = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        ttft.push((i, sorted(r.ttft_ms.iter().copied())));
        e2e.push((i, sorted(r.e2e_ms.iter().copied())));
    }
    panel(&mut out, MARGIN_L, "Time to first token (CDF)", &ttft);
    panel(
        &mut out,
        MARGIN_L * 2.0 + PANEL_W + 40.0 - MARGIN_L,
        "End-to-end latency (CDF)",
        &e2e,
    );
    for (i, r) in runs.iter().enumerate() {
        let y = MARGIN_T + PANEL_H + 40.0 + 20.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{MARGIN_L:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{y:.1}">{} ({} completed)</text>"#,
            y - 4.0,
            MARGIN_L + 24.0,
            y - 4.0,
            COLORS[i % COLORS.len()],
            MARGIN_L + 30.0,
            escape(&r.name),
            r.completed
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Writes [`svg`] to `path`.
pub fn write_svg(path: &Path, runs: &[(String, RunReport)]) -> Result<(), BenchError> {
    std::fs::write(path, svg(runs)).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::{Outcome, RequestRecord};

    fn run(ttfts: &[f64]) -> RunReport {
        RunReport {
            requests: ttfts
                .iter()
                .map(|&t| RequestRecord {
                    start_ms: 0.0,
                    ttft_ms: Some(t),
                    e2e_ms: t * 10.0,
                    itl_ms: Vec::new(),
                    input_tokens: 1,
                    output_tokens: 1,
                    outcome: Outcome::Ok,
                    replica: None,
                    error: None,
                })
                .collect(),
            ..RunReport::default()
        }
    }

    #[test]
    fn one_curve_per_run_in_each_panel() {
        let many: Vec<f64> = (1..=5000).map(f64::from).collect();
        let s = svg(&[
            ("a<b".into(), run(&[1.0, 2.0, 3.0])),
            ("big".into(), run(&many)),
        ]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("a&lt;b"));
        // The 5000-point curve is thinned to at most MAX_POINTS + 1 steps.
        let longest = s
            .lines()
            .filter(|l| l.starts_with("<polyline"))
            .map(|l| l.matches(',').count())
            .max()
            .unwrap();
        assert!(longest <= 2 * (MAX_POINTS + 1), "{longest}");
        // Decades from 1 ms to 50 s.
        assert_eq!(decades(&[&[1.0, 50_000.0]]), (0.0, 5.0));
        let labels: Vec<String> = [-2, 0, 2, 3, 4].into_iter().map(decade_label).collect();
        assert_eq!(labels, ["0.01 ms", "1 ms", "100 ms", "1 s", "10 s"]);
    }

    #[test]
    fn empty_runs_still_draw_axes() {
        let s = svg(&[("none".into(), RunReport::default())]);
        assert_eq!(s.matches("<polyline").count(), 0);
        assert!(s.contains("Time to first token"));
    }
}
