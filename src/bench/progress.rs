//! Run counters, and a one-line progress bar on stderr when stderr is a
//! terminal (redrawn four times a second by a task that stops with the run).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Counters shared by the request tasks.
#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub finished: AtomicU64,
    pub failed: AtomicU64,
}

pub struct ProgressBar {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ProgressBar {
    /// Starts drawing if `enabled` and stderr is a terminal.
    pub fn start(
        enabled: bool,
        counters: Arc<Counters>,
        total: u64,
        deadline: Option<Duration>,
    ) -> Option<ProgressBar> {
        if !enabled || !std::io::stderr().is_terminal() {
            return None;
        }
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let line = render(&counters, total, deadline, start.elapsed());
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r{line}\x1b[K");
                let _ = err.flush();
            }
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        });
        Some(ProgressBar { stop, task })
    }

    pub async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The bar's text: progress by count, or by time when a duration bounds the
/// run and comes first.
pub fn render(c: &Counters, total: u64, deadline: Option<Duration>, elapsed: Duration) -> String {
    let done = c.finished.load(Ordering::Relaxed);
    let by_count = if total == 0 {
        0.0
    } else {
        done as f64 / total as f64
    };
    let by_time = deadline.map_or(0.0, |d| elapsed.as_secs_f64() / d.as_secs_f64().max(1e-9));
    let frac = by_count.max(by_time).clamp(0.0, 1.0);
    const WIDTH: usize = 30;
    let filled = (frac * WIDTH as f64).round() as usize;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let count = if total == 0 {
        format!("{done}")
    } else {
        format!("{done}/{total}")
    };
    format!(
        "[{}{}] {count} done, {} in flight, {} failed, {rate:.1} req/s, {:.0}s",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        c.sent.load(Ordering::Relaxed).saturating_sub(done),
        c.failed.load(Ordering::Relaxed),
        elapsed.as_secs_f64(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_shows_counts() {
        let c = Counters::default();
        c.sent.store(7, Ordering::Relaxed);
        c.finished.store(5, Ordering::Relaxed);
        c.failed.store(1, Ordering::Relaxed);
        let s = render(&c, 10, None, Duration::from_secs(1));
        assert!(
            s.starts_with(&format!("[{}{}]", "#".repeat(15), ".".repeat(15))),
            "{s}"
        );
        assert!(
            s.contains("5/10 done, 2 in flight, 1 failed, 5.0 req/s"),
            "{s}"
        );
    }
}
