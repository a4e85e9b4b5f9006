//! The handle on the fleet store: one connection to Redis (or Valkey), the
//! refresh that registers this instance and renews its slot leases, and
//! the listing of the live instances for the status page.
//!
//! The request path never waits on the store: the refresh loop
//! ([`Fleet::run`]) runs beside it and writes each replica's cap where the
//! request path reads it (an atomic per replica, set by the caller's
//! `apply`). A call slower than `fleet.timeout` counts as a failure; the
//! connection is made again at most once per refresh interval.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use super::client::{StoreClient, StoreConn};
use super::lease::{Grant, Leases, Phase};
use super::metrics::FleetMetrics;
use super::queues::QueueReport;
use super::script::LEASE;
use crate::config::{FleetConfig, redact_url};

/// One replica's demand on this instance, as the refresh reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub pool: String,
    pub replica: String,
    /// `max_inflight`, for the whole fleet.
    pub limit: u32,
    /// Requests this instance runs there now.
    pub in_flight: u32,
    /// Those plus the requests here waiting for a slot there.
    pub want: u32,
    /// Some waiters here wait for another instance's, so they are not in
    /// `want`: report the lower demand at once.
    pub held_back: bool,
}

impl Demand {
    fn key(&self) -> String {
        format!("{}/{}", self.pool, self.replica)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("not connected to the store (next attempt within {0:?})")]
    NotConnected(Duration),
    #[error("unexpected answer from the store: {0}")]
    Answer(String),
}

/// One registered instance, as the store lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Instance {
    pub id: String,
    pub name: String,
    /// Unix seconds.
    pub started: u64,
    pub version: String,
    /// Until its registration lapses, from the store's clock.
    pub expires_in_ms: i64,
    pub me: bool,
}

/// This instance's standing, for the status page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetStatus {
    pub store: String,
    pub id: String,
    pub name: String,
    pub phase: &'static str,
    pub store_up: bool,
    pub live_instances: u32,
    pub last_refresh_us: u64,
    pub last_error: Option<String>,
    pub fallbacks: u64,
}

pub struct Fleet {
    config: FleetConfig,
    shown: String,
    id: String,
    name: String,
    started: u64,
    client: Arc<StoreClient>,
    conn: ArcSwapOption<StoreConn>,
    /// `key_prefix`, under one hash tag on a cluster.
    prefix: String,
    last_connect: Mutex<Option<Instant>>,
    connecting: tokio::sync::Mutex<()>,
    script: redis::Script,
    leases: Mutex<Leases>,
    metrics: FleetMetrics,
    last_error: ArcSwapOption<String>,
    last_refresh_us: AtomicU64,
    in_fallback: AtomicBool,
    fallbacks: AtomicU64,
    /// Each replica's highest recent demand and when it was seen: a share
    /// is kept for a while after the demand drops, so steady traffic
    /// does not wait for a grant at each request.
    recent: Mutex<std::collections::HashMap<String, (u32, Instant)>>,
    /// The pool queues are ordered with the other instances' (the last
    /// refresh that carried queue reports succeeded).
    shared_order: AtomicBool,
}

/// What one refresh brought back.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// The cap in force on each replica of the demands.
    pub caps: Vec<u32>,
    /// The other live instances' queue reports for the pools reported
    /// (`None`: the store did not answer; each instance orders its own).
    pub queues: Option<Vec<QueueReport>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("store", &self.shown)
            .field("id", &self.id)
            .finish()
    }
}

impl Fleet {
    /// The handle; connects on the first refresh. `None` when the URL does
    /// not parse (validation refuses such a config first).
    pub fn new(config: &FleetConfig, metrics: &FleetMetrics) -> Option<Arc<Fleet>> {
        let client = Arc::new(StoreClient::open(&config.store).ok()?);
        let prefix = client.slot_prefix(&config.key_prefix);
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let name = config.name.clone().unwrap_or_else(|| {
            let host = dns_lookup::get_hostname().unwrap_or_else(|_| "llmlb".into());
            format!("{host}:{}", std::process::id())
        });
        Some(Arc::new(Fleet {
            shown: redact_url(&config.store),
            config: config.clone(),
            id,
            name,
            started: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            client,
            conn: ArcSwapOption::empty(),
            prefix,
            last_connect: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            script: redis::Script::new(LEASE),
            leases: Mutex::new(Leases::new(
                config.instance_ttl,
                config.refresh,
                config.timeout,
            )),
            metrics: metrics.clone(),
            last_error: ArcSwapOption::empty(),
            last_refresh_us: AtomicU64::new(0),
            in_fallback: AtomicBool::new(false),
            fallbacks: AtomicU64::new(0),
            recent: Mutex::default(),
            shared_order: AtomicBool::new(false),
        }))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    pub fn metrics(&self) -> &FleetMetrics {
        &self.metrics
    }

    /// Whether a reload can keep this handle (same store and settings).
    pub fn same_settings(&self, config: &FleetConfig) -> bool {
        &self.config == config
    }

    pub(super) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The connection, made again when the last one failed (at most once
    /// per refresh interval).
    pub(crate) async fn connection(&self) -> Result<StoreConn, FleetError> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        // One attempt at a time: a second caller waits for its outcome.
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        {
            let mut last = self.last_connect.lock().expect("poisoned");
            if last.is_some_and(|t| t.elapsed() < self.config.refresh) {
                return Err(FleetError::NotConnected(self.config.refresh));
            }
            *last = Some(Instant::now());
        }
        let bound = self.config.timeout * 2;
        let conn = tokio::time::timeout(bound, self.client.connect())
            .await
            .map_err(|_| FleetError::Timeout(bound))??;
        self.conn.store(Some(Arc::new(conn.clone())));
        tracing::info!(store = %self.shown, instance = %self.id, "connected to the fleet store");
        Ok(conn)
    }

    fn failed(&self, err: &FleetError) {
        self.conn.store(None);
        self.metrics.up.set(0);
        self.metrics.errors.inc();
        let text = err.to_string();
        if self.last_error.load().as_deref() != Some(&text) {
            tracing::warn!(store = %self.shown, error = %text, "fleet store call failed");
        }
        self.last_error.store(Some(Arc::new(text)));
    }

    /// The cap in force on each replica of `demands` now.
    pub fn caps(&self, demands: &[Demand]) -> Vec<u32> {
        let leases = self.leases.lock().expect("poisoned");
        let now = Instant::now();
        demands
            .iter()
            .map(|d| leases.cap(&d.key(), d.limit, now))
            .collect()
    }

    /// Gives back, before the next refresh, the slots of a lease this
    /// instance will not use: on each replica whose pool's waiters here
    /// wait for another instance's (`held_back`), the cap drops to the
    /// requests running there plus the waiters that do not. Returns the
    /// caps in force when one dropped (the caller applies them before the
    /// refresh, so the refresh reports the lower lease and the store moves
    /// those slots one refresh sooner).
    pub fn release(&self, demands: &[Demand]) -> Option<Vec<u32>> {
        let now = Instant::now();
        let mut leases = self.leases.lock().expect("poisoned");
        let mut dropped = false;
        for d in demands.iter().filter(|d| d.held_back) {
            dropped |= leases.release(&d.key(), d.limit, d.want.max(d.in_flight), now);
        }
        if !dropped {
            return None;
        }
        self.metrics.released.inc();
        Some(
            demands
                .iter()
                .map(|d| leases.cap(&d.key(), d.limit, now))
                .collect(),
        )
    }

    pub fn phase(&self) -> Phase {
        self.leases.lock().expect("poisoned").phase(Instant::now())
    }

    /// Registers this instance and renews its leases for `demands`;
    /// returns the caps in force afterwards (from the answer, or the
    /// fallback when there was none).
    pub async fn refresh(&self, demands: &[Demand]) -> Vec<u32> {
        self.exchange(demands, &[]).await.caps
    }

    /// [`Fleet::refresh`], which also publishes this instance's pool
    /// queues and reads the other instances' back.
    pub async fn exchange(&self, demands: &[Demand], queues: &[QueueReport]) -> Exchange {
        let sent = Instant::now();
        let keys: Vec<String> = demands.iter().map(Demand::key).collect();
        let held: Vec<u32> = {
            let caps = self.caps(demands);
            demands
                .iter()
                .zip(caps)
                .map(|(d, cap)| d.in_flight.max(cap))
                .collect()
        };
        let mut others = None;
        match self.call(demands, &keys, &held, queues).await {
            Ok((epoch, live, grants, reports)) => {
                others = Some(reports);
                let now = Instant::now();
                let rtt = now - sent;
                self.metrics.refresh_seconds.observe(rtt.as_secs_f64());
                self.last_refresh_us
                    .store(rtt.as_micros() as u64, Ordering::Relaxed);
                self.metrics.up.set(1);
                self.metrics.instances.set(i64::from(live));
                let limits: Vec<(&str, u32)> = keys
                    .iter()
                    .zip(demands)
                    .map(|(k, d)| (k.as_str(), d.limit))
                    .collect();
                let rejoined = self
                    .leases
                    .lock()
                    .expect("poisoned")
                    .answered(now, sent, &epoch, live, &limits, &grants);
                if rejoined {
                    tracing::info!(store = %self.shown, live, "fleet store answers again: leases resume after a probation");
                }
                self.last_error.store(None);
            }
            Err(e) => {
                self.failed(&e);
                self.leases.lock().expect("poisoned").failed(sent);
            }
        }
        let after = self.phase();
        let fallback = matches!(after, Phase::Fallback);
        if fallback && !self.in_fallback.swap(true, Ordering::Relaxed) {
            self.metrics.fallbacks.inc();
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            let live = self.leases.lock().expect("poisoned").live();
            tracing::warn!(store = %self.shown, live, "fleet store unavailable: each replica's max_inflight is shared by the {live} instance(s) last seen");
        }
        if !fallback {
            self.in_fallback.store(false, Ordering::Relaxed);
        }
        self.metrics.in_fallback.set(i64::from(fallback));
        self.order(!queues.is_empty(), others.is_some());
        Exchange {
            caps: self.caps(demands),
            queues: others,
        }
    }

    /// Counts and logs the pool queues leaving the fleet's order (the
    /// store did not answer) and coming back to it.
    fn order(&self, reported: bool, answered: bool) {
        if !reported {
            return;
        }
        let was = self.shared_order.swap(answered, Ordering::Relaxed);
        if was && !answered {
            self.metrics.queue_local.inc();
            tracing::warn!(store = %self.shown, "fleet store unavailable: each pool queue orders only this instance's waiters");
        } else if !was && answered {
            tracing::info!(store = %self.shown, "pool queues follow the fleet's order");
        }
    }

    async fn call(
        &self,
        demands: &[Demand],
        keys: &[String],
        held: &[u32],
        queues: &[QueueReport],
    ) -> Result<Answer, FleetError> {
        let mut conn = self.connection().await?;
        let info = serde_json::json!({
            "name": self.name,
            "started": self.started,
            "version": env!("CARGO_PKG_VERSION"),
        })
        .to_string();
        let mut inv = self.script.key(self.key("instances"));
        inv.key(self.key("info"))
            .key(self.key("epoch"))
            .arg(&self.id)
            .arg(self.config.instance_ttl.as_millis() as u64)
            .arg(info)
            .arg(self.key("lease:"))
            .arg(uuid::Uuid::new_v4().simple().to_string())
            .arg(self.key("queue:"))
            .arg(demands.len());
        let wants = self.wants(demands, keys);
        for (((d, key), held), want) in demands.iter().zip(keys).zip(held).zip(wants) {
            inv.arg(key).arg(d.limit).arg(*held).arg(want);
        }
        for q in queues {
            inv.arg(&q.pool).arg(q.encode());
        }
        let answer: Vec<redis::Value> =
            tokio::time::timeout(self.config.timeout, inv.invoke_async(&mut conn))
                .await
                .map_err(|_| FleetError::Timeout(self.config.timeout))??;
        let pools: Vec<&str> = queues.iter().map(|q| q.pool.as_str()).collect();
        parse_answer(&answer, demands.len(), &pools)
    }

    /// Each replica's demand as reported: the highest seen within half an
    /// instance TTL.
    fn wants(&self, demands: &[Demand], keys: &[String]) -> Vec<u32> {
        let window = self.config.instance_ttl / 2;
        let now = Instant::now();
        let mut recent = self.recent.lock().expect("poisoned");
        recent.retain(|_, (_, at)| now.duration_since(*at) < window);
        demands
            .iter()
            .zip(keys)
            .map(|(d, key)| {
                let want = d.want.max(d.in_flight);
                let entry = recent.entry(key.clone()).or_insert((want, now));
                // Waiters held back for another instance's: the slots go
                // there now, not after the window.
                if want >= entry.0 || d.held_back {
                    *entry = (want, now);
                }
                entry.0
            })
            .collect()
    }

    /// The refresh loop: every `fleet.refresh` (a quarter of it while
    /// slots must move between instances; sooner when a request starts
    /// waiting for a slot, [`super::nudge`]), read
    /// the demands, refresh, and hand the caps to `apply`. Slots held back
    /// for another instance's waiters are given back first
    /// ([`Fleet::release`]): `lower` applies the lowered caps, and the
    /// demands are read again before the refresh reports them, and after
    /// that refresh the other instances are woken to refresh at once
    /// ([`super::wake`]; this instance listens for theirs). On shutdown
    /// the instance leaves the store, so its slots are free at once.
    pub async fn run<D, L, A>(
        self: Arc<Self>,
        demands: D,
        lower: L,
        apply: A,
        shutdown: watch::Receiver<bool>,
    ) where
        D: Fn() -> (Vec<Demand>, Vec<QueueReport>),
        L: Fn(&[Demand], &[u32]),
        A: Fn(&[Demand], &Exchange),
    {
        let wakes = super::wake::listen(
            Arc::clone(&self.client),
            self.key("wake"),
            self.id.clone(),
            self.config.refresh,
            self.metrics.wakes.clone(),
            shutdown.clone(),
        );
        let refreshes = self.refresh_loop(demands, lower, apply, shutdown);
        tokio::join!(wakes, refreshes);
    }

    async fn refresh_loop<D, L, A>(
        &self,
        demands: D,
        lower: L,
        apply: A,
        mut shutdown: watch::Receiver<bool>,
    ) where
        D: Fn() -> (Vec<Demand>, Vec<QueueReport>),
        L: Fn(&[Demand], &[u32]),
        A: Fn(&[Demand], &Exchange),
    {
        let mut last_keys: Vec<String>;
        let mut last_pools: Vec<String>;
        loop {
            let started = tokio::time::Instant::now();
            let (mut now, mut queues) = demands();
            let gave_back = match self.release(&now) {
                Some(caps) => {
                    lower(&now, &caps);
                    // A request that read the old cap may still take a slot:
                    // the refresh reports what runs after this point.
                    tokio::task::yield_now().await;
                    (now, queues) = demands();
                    true
                }
                None => false,
            };
            let answer = self.exchange(&now, &queues).await;
            apply(&now, &answer);
            if gave_back && answer.queues.is_some() {
                // The smaller lease is recorded: the instance whose waiter
                // goes first takes the slots at its refresh, now.
                self.wake().await;
            }
            last_keys = now.iter().map(Demand::key).collect();
            last_pools = queues.into_iter().map(|q| q.pool).collect();
            // Slots that must move between instances (waiters held back
            // here for another's, or more demand than the lease): renew
            // four times as often until they have.
            let moving = (now.iter().zip(&answer.caps))
                .any(|(d, cap)| d.held_back || d.want > (*cap).max(d.in_flight));
            let every = if moving {
                self.config.refresh / 4
            } else {
                self.config.refresh
            };
            let next = started + every;
            let early = started + self.config.refresh / 10;
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = super::waiting().notified() => {
                    tokio::time::sleep_until(early).await;
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        self.leave(&last_keys, &last_pools).await;
    }

    /// Tells the other instances, on the store's `wake` channel, that
    /// this one gave slots back ([`super::wake`]). A failure only costs
    /// them an interval.
    async fn wake(&self) {
        if self.client.is_cluster() {
            return;
        }
        let Ok(mut conn) = self.connection().await else {
            return;
        };
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.key("wake")).arg(&self.id);
        let publish = cmd.query_async::<i64>(&mut conn);
        match tokio::time::timeout(self.config.timeout, publish).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "could not wake the other instances"),
            Err(_) => tracing::debug!("waking the other instances timed out"),
        }
    }

    /// Removes this instance's registration, leases and queue reports.
    async fn leave(&self, keys: &[String], pools: &[String]) {
        let result: Result<(), FleetError> = async {
            let mut conn = self.connection().await?;
            let mut pipe = redis::pipe();
            pipe.zrem(self.key("instances"), &self.id)
                .ignore()
                .hdel(self.key("info"), &self.id)
                .ignore();
            for key in keys {
                pipe.hdel(self.key(&format!("lease:{key}")), &self.id)
                    .ignore();
            }
            for pool in pools {
                pipe.hdel(self.key(&format!("queue:{pool}")), &self.id)
                    .ignore();
            }
            tokio::time::timeout(self.config.timeout, pipe.query_async::<()>(&mut conn))
                .await
                .map_err(|_| FleetError::Timeout(self.config.timeout))??;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => tracing::info!(instance = %self.id, "left the fleet store"),
            Err(e) => {
                tracing::warn!(error = %e, "could not leave the fleet store; its leases lapse with the instance TTL")
            }
        }
    }

    /// The live instances the store lists, this one marked.
    pub async fn instances(&self) -> Result<Vec<Instance>, FleetError> {
        let mut conn = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("TIME")
            .zrange_withscores(self.key("instances"), 0, -1)
            .hgetall(self.key("info"));
        #[allow(clippy::type_complexity)]
        let ((secs, micros), listed, info): (
            (u64, u64),
            Vec<(String, f64)>,
            std::collections::HashMap<String, String>,
        ) = tokio::time::timeout(self.config.timeout * 4, pipe.query_async(&mut conn))
            .await
            .map_err(|_| FleetError::Timeout(self.config.timeout * 4))??;
        let now_ms = (secs * 1000 + micros / 1000) as i64;
        Ok(listed
            .into_iter()
            .filter(|(_, until)| *until as i64 > now_ms)
            .map(|(id, until)| {
                let v: serde_json::Value = info
                    .get(&id)
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or_default();
                Instance {
                    me: id == self.id,
                    name: v["name"].as_str().unwrap_or("").to_string(),
                    started: v["started"].as_u64().unwrap_or(0),
                    version: v["version"].as_str().unwrap_or("").to_string(),
                    expires_in_ms: until as i64 - now_ms,
                    id,
                }
            })
            .collect())
    }

    pub fn status(&self) -> FleetStatus {
        let (phase, live) = {
            let l = self.leases.lock().expect("poisoned");
            (l.phase(Instant::now()), l.live())
        };
        FleetStatus {
            store: self.shown.clone(),
            id: self.id.clone(),
            name: self.name.clone(),
            phase: phase.as_str(),
            store_up: self.metrics.up.get() == 1,
            live_instances: live,
            last_refresh_us: self.last_refresh_us.load(Ordering::Relaxed),
            last_error: self.last_error.load().as_deref().cloned(),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }
}

/// The epoch, the live instances, the grants and the other instances'
/// queue reports, as one refresh answered.
type Answer = (String, u32, Vec<Grant>, Vec<QueueReport>);

fn parse_answer(answer: &[redis::Value], n: usize, pools: &[&str]) -> Result<Answer, FleetError> {
    let bad = || FleetError::Answer(format!("{answer:?}"));
    if answer.len() != 3 + 2 * n + pools.len() {
        return Err(bad());
    }
    let epoch: String = redis::from_redis_value_ref(&answer[0]).map_err(|_| bad())?;
    let live: u32 = redis::from_redis_value_ref(&answer[1]).map_err(|_| bad())?;
    let now_ms: u64 = redis::from_redis_value_ref(&answer[2 + 2 * n]).map_err(|_| bad())?;
    let mut reports = Vec::new();
    for (pool, seen) in pools.iter().zip(&answer[3 + 2 * n..]) {
        let seen: Vec<String> = redis::from_redis_value_ref(seen).map_err(|_| bad())?;
        reports.extend(
            seen.iter()
                .filter_map(|s| QueueReport::decode(pool, s, now_ms)),
        );
    }
    let grants = answer[2..2 + 2 * n]
        .chunks(2)
        .map(|pair| {
            Ok(Grant {
                cap: redis::from_redis_value_ref(&pair[0]).map_err(|_| bad())?,
                excess: redis::from_redis_value_ref(&pair[1]).map_err(|_| bad())?,
            })
        })
        .collect::<Result<Vec<_>, FleetError>>()?;
    Ok((epoch, live, grants, reports))
}
