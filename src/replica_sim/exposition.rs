//! Prometheus text exposition as Python's `prometheus_client` writes it,
//! which is what vLLM serves: `# HELP` and `# TYPE` per family, labels sorted
//! by name, counters as `X_total` plus an `X_created` gauge, histograms as
//! cumulative `_bucket{le}` lines then `_count`, `_sum` and `_created`, and
//! numbers in Python's notation (`8.0`, `1.756e+09`, `+Inf`).

use std::fmt::Write;

use super::engine::Histogram;

pub struct Out<'a> {
    pub text: String,
    /// Labels added to every sample (`engine`, `model_name`).
    pub base: Vec<(&'static str, &'a str)>,
    /// The value of every `_created` series.
    pub created: f64,
}

impl Out<'_> {
    pub fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, extra: &[(&str, &str)], value: f64) {
        let mut labels: Vec<(&str, &str)> = self
            .base
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .collect();
        labels.sort_by(|a, b| a.0.cmp(b.0));
        write_sample(&mut self.text, name, &labels, value);
    }

    pub fn gauge(&mut self, name: &str, help: &str, series: &[(&[(&str, &str)], f64)]) {
        self.family(name, help, "gauge");
        for (labels, v) in series {
            self.sample(name, labels, *v);
        }
    }

    pub fn counter(&mut self, base: &str, help: &str, series: &[(&[(&str, &str)], f64)]) {
        let total = format!("{base}_total");
        self.family(&total, help, "counter");
        for (labels, v) in series {
            self.sample(&total, labels, *v);
        }
        let created = format!("{base}_created");
        self.family(&created, help, "gauge");
        for (labels, _) in series {
            self.sample(&created, labels, self.created);
        }
    }

    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (le, count) in h.cumulative() {
            let le = go_float(le);
            self.sample(&bucket, &[("le", &le)], count as f64);
        }
        self.sample(&format!("{name}_count"), &[], h.count as f64);
        self.sample(&format!("{name}_sum"), &[], h.sum);
        let created = format!("{name}_created");
        self.family(&created, help, "gauge");
        self.sample(&created, &[], self.created);
    }

    /// A gauge set to 1 whose labels carry the information (no `model_name`, as in vLLM).
    pub fn info(&mut self, name: &str, help: &str, labels: &[(&str, &str)]) {
        self.family(name, help, "gauge");
        let mut labels = labels.to_vec();
        labels.sort_by(|a, b| a.0.cmp(b.0));
        write_sample(&mut self.text, name, &labels, 1.0);
    }
}

fn write_sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape(v));
    }
    let _ = writeln!(out, "}} {}", go_float(value));
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Formats a value as Python's `prometheus_client` does (`floatToGoString`):
/// Python's `repr`, switching to an exponent for positive numbers with more
/// than six digits before the point.
pub fn go_float(v: f64) -> String {
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    let s = python_repr(v);
    if let Some(dot) = s.find('.')
        && v > 0.0
        && dot > 6
    {
        let digits = format!("{}{}", &s[..dot], &s[dot + 1..]);
        let mut mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
        while mantissa.ends_with('0') {
            mantissa.pop();
        }
        if mantissa.ends_with('.') {
            mantissa.pop();
        }
        return format!("{mantissa}e+0{}", dot - 1);
    }
    s
}

/// Python's `repr(float)`: shortest round-trip digits; scientific below 1e-4
/// and from 1e16, with a two-digit signed exponent.
fn python_repr(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{v:e}");
        let (m, e) = s.split_once('e').expect("exponent form");
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{m}e{sign}{digits:0>2}");
    }
    let s = format!("{v:?}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_prometheus_client() {
        assert_eq!(go_float(8.0), "8.0");
        assert_eq!(go_float(0.4375), "0.4375");
        assert_eq!(go_float(0.001), "0.001");
        assert_eq!(go_float(2560.0), "2560.0");
        assert_eq!(go_float(1_756_000_000.0), "1.756e+09");
        assert_eq!(go_float(1.795942296663666e9), "1.795942296663666e+09");
        assert_eq!(go_float(1024.0), "1024.0");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
        assert_eq!(go_float(f64::NAN), "NaN");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.0), "0.0");
    }
}
