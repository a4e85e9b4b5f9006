//! Admission: when a pool has per-replica concurrency limits, requests that
//! find no free slot wait in the pool's priority queue ([`queue`]) and are
//! dispatched the moment a slot frees, or are refused at once (429) when they
//! could not start within their level's objective ([`estimate`]: the drain
//! rate, the estimated wait and the deadline test of a `ttft_objective`;
//! [`refusal`]: the queue's refusal and aging as pure functions, which
//! `llmlb fleet-sim` calls on its virtual clock; [`fair`]: fair share
//! among the tenants of a level, the structure both call).

mod error;
pub mod estimate;
pub mod fair;
mod metrics;
pub mod queue;
pub mod refusal;
mod settlement;

pub use error::AdmitError;
pub use estimate::service_mean;
pub use metrics::AdmissionMetrics;
pub use queue::{
    Admit, Affinity, Claim, Level, Others, Permit, PoolQueue, QueueParams, QueueState, Refusal,
};
pub use settlement::Settlement;

use std::sync::Arc;
use std::time::{Duration, Instant};

/// A pool's queue with its timeout and metric handles.
#[derive(Debug)]
pub struct Admission {
    pub queue: Arc<PoolQueue>,
    pub timeout: Duration,
    pool: String,
    metrics: AdmissionMetrics,
    /// Tenant names that are metric labels (configured tenants, keys'
    /// tenants).
    named: std::collections::HashSet<String>,
}

impl Admission {
    /// `named`: the tenant names that may be metric labels.
    pub fn new(
        queue: Arc<PoolQueue>,
        timeout: Duration,
        pool: &str,
        metrics: &AdmissionMetrics,
        named: std::collections::HashSet<String>,
    ) -> Admission {
        Admission {
            queue,
            timeout,
            pool: pool.to_string(),
            metrics: metrics.clone(),
            named,
        }
    }

    /// Waits for a slot for `claim`; `placement` is the request's predicted
    /// time to first token once dispatched (see [`PoolQueue::admit_claim`]).
    /// Dropping the future (the client went away) leaves the queue at once.
    pub async fn acquire(
        &self,
        claim: Claim,
        placement: impl Into<estimate::Placement>,
    ) -> Result<Permit, AdmitError> {
        let start = Instant::now();
        let tenant = std::sync::Arc::clone(&claim.tenant);
        let ticket = match self.queue.admit_claim(claim, start, placement) {
            Admit::Now(mut permit) => {
                self.observe_wait(&mut permit, Duration::ZERO);
                return Ok(permit);
            }
            Admit::Refused(refusal) => {
                self.count_refusal(&tenant, &refusal);
                return Err(refused(refusal));
            }
            Admit::Wait(ticket) => ticket,
        };
        // Under a fleet store, a waiting request is demand for a bigger
        // share of the pool's slots: ask now rather than at the next tick.
        crate::fleet::nudge();
        self.update_depths();
        let mut leave = LeaveOnDrop {
            admission: self,
            id: ticket.id,
            level: ticket.level,
            armed: true,
        };
        let mut rx = ticket.rx;
        let mut outcome = match tokio::time::timeout(self.timeout, &mut rx).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) | Err(_) => {
                if self.queue.cancel(ticket.id, ticket.level) {
                    Err(AdmitError::QueueTimeout {
                        retry_after: self.queue.backlog_drain_time(),
                    })
                } else {
                    // Granted at the last moment: take the slot after all.
                    rx.try_recv().map_err(|_| AdmitError::QueueTimeout {
                        retry_after: self.queue.backlog_drain_time(),
                    })
                }
            }
        };
        leave.armed = false;
        drop(leave);
        self.update_depths();
        match &mut outcome {
            Ok(permit) => self.observe_wait(permit, start.elapsed()),
            Err(_) => {
                let label = self.tenant_label(&tenant);
                self.metrics
                    .tenant_refusals
                    .with_label_values(&[&self.pool, label, "timeout"])
                    .inc();
            }
        }
        outcome
    }

    /// The tenant's name as a metric label: configured tenants and the
    /// tenants of API keys by name, the empty name as `none`, any other
    /// (a header's or a `user` field's) as `other`, so callers cannot grow
    /// the series without bound.
    fn tenant_label<'t>(&self, tenant: &'t str) -> &'t str {
        if tenant.is_empty() {
            "none"
        } else if self.named.contains(tenant) {
            tenant
        } else {
            "other"
        }
    }

    fn count_refusal(&self, tenant: &str, refusal: &Refusal) {
        let bound = match refusal {
            Refusal::QueueFull { .. } => "level_full",
            Refusal::TenantFull { .. } => "tenant_full",
            Refusal::OverObjective { .. } => "over_objective",
        };
        let label = self.tenant_label(tenant);
        self.metrics
            .tenant_refusals
            .with_label_values(&[&self.pool, label, bound])
            .inc();
    }

    /// Whether requests at `level` are admitted by their predicted time to
    /// first token (the level has a `ttft_objective`).
    pub fn has_deadline(&self, level: usize) -> bool {
        let levels = self.queue.levels();
        levels
            .get(level.min(levels.len().saturating_sub(1)))
            .is_some_and(|l| l.ttft_objective.is_some())
    }

    /// Refuses now what [`Admission::acquire`] would refuse at `level`
    /// for `tenant`, without taking a place (to shed load before a body is
    /// read).
    pub fn check(&self, level: usize, tenant: &str) -> Result<(), AdmitError> {
        self.queue.check(level, tenant).map_or(Ok(()), |r| {
            self.count_refusal(tenant, &r);
            Err(refused(r))
        })
    }

    /// Records a dispatched request's wait, and hands its permit the
    /// tenant's service counter.
    fn observe_wait(&self, permit: &mut Permit, waited: Duration) {
        let name = self.level_name(permit.level);
        self.metrics
            .queue_wait
            .with_label_values(&[&self.pool, name])
            .observe(waited.as_secs_f64());
        let tenant = self.tenant_label(&permit.tenant);
        self.metrics
            .tenant_queue_wait
            .with_label_values(&[&self.pool, tenant])
            .observe(waited.as_secs_f64());
        permit.count_service(
            self.metrics
                .tenant_service
                .with_label_values(&[&self.pool, tenant]),
        );
    }

    fn level_name(&self, level: usize) -> &str {
        self.queue
            .levels()
            .get(level)
            .map_or("", |l| l.name.as_str())
    }

    fn update_depths(&self) {
        for (level, depth) in self.queue.depths().into_iter().enumerate() {
            self.metrics
                .queue_depth
                .with_label_values(&[&self.pool, self.level_name(level)])
                .set(depth as i64);
        }
        for (level, tenants) in self.queue.tenants().into_iter().enumerate() {
            let mut depths: std::collections::BTreeMap<&str, i64> = Default::default();
            for t in &tenants {
                *depths.entry(self.tenant_label(&t.name)).or_default() += t.waiting as i64;
            }
            for (tenant, depth) in depths {
                self.metrics
                    .tenant_queue_depth
                    .with_label_values(&[&self.pool, self.level_name(level), tenant])
                    .set(depth);
            }
        }
    }
}

/// Removes a waiter whose request future was dropped while queued.
struct LeaveOnDrop<'a> {
    admission: &'a Admission,
    id: u64,
    level: usize,
    armed: bool,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.admission.queue.cancel(self.id, self.level);
            self.admission.update_depths();
        }
    }
}

fn refused(refusal: Refusal) -> AdmitError {
    match refusal {
        Refusal::QueueFull { retry_after } => AdmitError::QueueFull { retry_after },
        Refusal::TenantFull { retry_after } => AdmitError::TenantQueueFull { retry_after },
        Refusal::OverObjective {
            estimated,
            retry_after,
        } => AdmitError::OverObjective {
            estimated,
            retry_after,
        },
    }
}
