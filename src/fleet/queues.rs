//! One pool queue's report to the other instances: requests running, waiters
//! per level and how long each level's oldest waiter has waited. Each
//! refresh writes this instance's report into the pool's hash in the store
//! (`queue:{pool}`, instance id → report stamped with the store's clock)
//! and reads back the reports of the other live instances, their waits
//! brought up to the store's clock now, so that no instance compares its
//! own clock with another's.
//!
//! It also carries the queue's admitted arrivals per level and second,
//! over the deadline test's window (`admission::estimate`), so that every
//! instance prices the share of the higher levels with the fleet's sum.
//!
//! Wire form: `active;d0,d1,...;w0,w1,...;r0,r1,...` with each `w` a wait
//! in milliseconds or `-` for an empty level and each `r` a level's
//! admitted arrivals per second; the store prefixes its stamp
//! (`stamp;...`). The rates are later than the first three fields: a
//! reader ignores fields it does not know, and a report without them
//! decodes with none. A report with a fifth field comes from an earlier
//! version, whose fourth field held decayed counts, not rates: its rates
//! are left out.

use std::time::Duration;

/// One pool's queue on one instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueReport {
    pub pool: String,
    pub active: u32,
    /// Waiters per level, highest level first.
    pub depths: Vec<u32>,
    /// Per level, how long its oldest waiter has waited.
    pub fronts: Vec<Option<Duration>>,
    /// Per level, admitted arrivals per second (`None`: a report without
    /// them).
    pub arrivals: Option<Vec<f64>>,
}

/// A rate on the wire: three decimals, no trailing zeros.
fn rate(x: f64) -> String {
    let s = format!("{:.3}", x.max(0.0));
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl QueueReport {
    pub(crate) fn encode(&self) -> String {
        let depths: Vec<String> = self.depths.iter().map(u32::to_string).collect();
        let fronts: Vec<String> = (self.fronts.iter())
            .map(|f| f.map_or("-".to_string(), |d| d.as_millis().to_string()))
            .collect();
        let mut out = format!("{};{};{}", self.active, depths.join(","), fronts.join(","));
        if let Some(rates) = &self.arrivals {
            let rates: Vec<String> = rates.iter().map(|r| rate(*r)).collect();
            out.push_str(&format!(";{}", rates.join(",")));
        }
        out
    }

    /// A stamped report from the store, read at the store's time `now_ms`:
    /// its waits grow by the time since its stamp. `None` when malformed.
    pub(crate) fn decode(pool: &str, stamped: &str, now_ms: u64) -> Option<QueueReport> {
        let mut parts = stamped.split(';');
        let stamp: u64 = parts.next()?.parse().ok()?;
        let active = parts.next()?.parse().ok()?;
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        };
        let depths = list(parts.next()?)
            .iter()
            .map(|d| d.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        let since = Duration::from_millis(now_ms.saturating_sub(stamp));
        let fronts = list(parts.next()?)
            .iter()
            .map(|w| match w.as_str() {
                "-" => Some(None),
                ms => ms
                    .parse()
                    .ok()
                    .map(|ms| Some(Duration::from_millis(ms) + since)),
            })
            .collect::<Option<Vec<_>>>()?;
        let arrivals = match (parts.next(), parts.next()) {
            (Some(rates), None) => Some(
                list(rates)
                    .iter()
                    .map(|r| r.parse::<f64>().ok().filter(|r| r.is_finite() && *r >= 0.0))
                    .collect::<Option<Vec<f64>>>()?,
            ),
            _ => None,
        };
        Some(QueueReport {
            pool: pool.to_string(),
            active,
            depths,
            fronts,
            arrivals,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_read_later_has_waited_longer() {
        let r = QueueReport {
            pool: "p".into(),
            active: 7,
            depths: vec![1, 0, 12],
            fronts: vec![Some(Duration::from_millis(30)), None, Some(Duration::ZERO)],
            arrivals: None,
        };
        let wire = format!("1000;{}", r.encode());
        assert_eq!(wire, "1000;7;1,0,12;30,-,0");
        let back = QueueReport::decode("p", &wire, 1040).unwrap();
        assert_eq!(back.active, 7);
        assert_eq!(back.depths, vec![1, 0, 12]);
        assert_eq!(
            back.fronts,
            vec![
                Some(Duration::from_millis(70)),
                None,
                Some(Duration::from_millis(40))
            ]
        );
        assert_eq!(QueueReport::decode("p", "x;1;;", 0), None);
        assert_eq!(QueueReport::decode("p", "5;1;a;", 9), None);
        let empty = QueueReport::decode("p", "5;0;;", 9).unwrap();
        assert!(empty.depths.is_empty() && empty.fronts.is_empty());
        assert_eq!(empty.arrivals, None);
    }

    #[test]
    fn a_report_carries_its_arrival_rates_and_older_forms_still_read() {
        let r = QueueReport {
            pool: "p".into(),
            active: 3,
            depths: vec![0, 4],
            fronts: vec![None, Some(Duration::from_millis(5))],
            arrivals: Some(vec![6.54321, 0.0]),
        };
        let wire = format!("1000;{}", r.encode());
        assert_eq!(wire, "1000;3;0,4;-,5;6.543,0");
        let back = QueueReport::decode("p", &wire, 1000).unwrap();
        assert_eq!(back.depths, vec![0, 4]);
        assert_eq!(back.arrivals, Some(vec![6.543, 0.0]));
        // The form without rates decodes with none, and its first three
        // fields are what a reader without rates reads of the new form.
        let old = QueueReport::decode("p", "1000;3;0,4;-,5", 1000).unwrap();
        assert_eq!(old.arrivals, None);
        assert_eq!(
            (old.active, old.depths, old.fronts),
            (3, back.depths, back.fronts)
        );
        // The form with decayed counts and grants (five fields): its
        // counts are not rates and are left out; the rest reads.
        let counts = QueueReport::decode("p", "1000;3;0,4;-,5;12.35,0;40.5", 1000).unwrap();
        assert_eq!((counts.active, counts.arrivals), (3, None));
        // Malformed rates make the report malformed, as other fields do.
        assert_eq!(QueueReport::decode("p", "1000;3;0,4;-,5;x,0", 1000), None);
        assert_eq!(QueueReport::decode("p", "1000;3;0,4;-,5;1,NaN", 1000), None);
        assert_eq!(QueueReport::decode("p", "1000;3;0,4;-,5;-1,0", 1000), None);
    }
}
