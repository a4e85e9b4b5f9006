//! The one way llmlb declares a metric: [`Family`] makes it, with its name,
//! help text and labels, and registers it on the process's registry in one
//! call. Each module declares its own metrics next to its code through it
//! (`admission::AdmissionMetrics`, `routing::RoutingMetrics`, ...); a name
//! registered twice is a programming error and panics at start.

use prometheus::core::Collector;
use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Declares metrics on one registry.
#[derive(Debug, Clone, Copy)]
pub struct Family<'r> {
    registry: &'r Registry,
}

impl<'r> Family<'r> {
    pub fn new(registry: &'r Registry) -> Family<'r> {
        Family { registry }
    }

    /// A counter with these labels.
    pub fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    /// A floating-point counter (seconds, for example) with these labels.
    pub fn float_counter(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.add(CounterVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    /// A counter without labels.
    pub fn counter_one(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("metric"))
    }

    /// An integer gauge with these labels.
    pub fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    /// An integer gauge without labels.
    pub fn gauge_one(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("metric"))
    }

    /// A floating-point gauge with these labels.
    pub fn float_gauge(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.add(GaugeVec::new(Opts::new(name, help), labels).expect("metric"))
    }

    /// A histogram with these labels and bucket bounds.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels).expect("metric"))
    }

    /// Any other collector (a gauge with constant labels, the process's
    /// own figures).
    pub fn collector(&self, collector: impl Collector + 'static) {
        self.registry
            .register(Box::new(collector))
            .expect("unique metric name");
    }

    fn add<C: Collector + Clone + 'static>(&self, metric: C) -> C {
        self.collector(metric.clone());
        metric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_metrics_are_rendered_from_the_registry() {
        let registry = Registry::new();
        let family = Family::new(&registry);
        family
            .counter("t_requests_total", "Requests.", &["pool"])
            .with_label_values(&["p"])
            .inc();
        family.gauge_one("t_up", "Up.").set(1);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        assert_eq!(names, ["t_requests_total", "t_up"]);
    }

    #[test]
    #[should_panic(expected = "unique metric name")]
    fn a_name_declared_twice_panics() {
        let registry = Registry::new();
        let family = Family::new(&registry);
        family.counter_one("t_total", "One.");
        family.counter_one("t_total", "Two.");
    }
}
