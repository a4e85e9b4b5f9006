//! One pool queue's report to the other instances: requests running, waiters
//! per level and how long each level's oldest waiter has waited. Each
//! refresh writes this instance's report into the pool's hash in the store
//! (`queue:{pool}`, instance id → report stamped with the store's clock)
//! and reads back the reports of the other live instances, their waits
//! brought up to the store's clock now, so that no instance compares its
//! own clock with another's.
//!
//! Wire form: `active;d0,d1,...;w0,w1,...` with each `w` a wait in
//! milliseconds or `-` for an empty level; the store prefixes its stamp
//! (`stamp;...`).

use std::time::Duration;

/// One pool's queue on one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueReport {
    pub pool: String,
    pub active: u32,
    /// Waiters per level, highest level first.
    pub depths: Vec<u32>,
    /// Per level, how long its oldest waiter has waited.
    pub fronts: Vec<Option<Duration>>,
}

impl QueueReport {
    pub(crate) fn encode(&self) -> String {
        let depths: Vec<String> = self.depths.iter().map(u32::to_string).collect();
        let fronts: Vec<String> = (self.fronts.iter())
            .map(|f| f.map_or("-".to_string(), |d| d.as_millis().to_string()))
            .collect();
        format!("{};{};{}", self.active, depths.join(","), fronts.join(","))
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
        Some(QueueReport {
            pool: pool.to_string(),
            active,
            depths,
            fronts,
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
    }
}
