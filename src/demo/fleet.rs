//! One demo run's processes-in-a-process: N simulated replicas and an llmlb
//! in front of them, all on `127.0.0.1` port 0.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::{DemoArgs, DemoError};
use crate::daemon::Running;
use crate::replica_sim::{SimConfig, SimHandle};

pub struct Fleet {
    replicas: Vec<SimHandle>,
    proxy: Running,
    model: String,
}

/// Prefix-cache counters summed over the fleet, read from the replicas' own
/// `/metrics` (in prompt tokens, as vLLM counts them).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixCache {
    pub queries: f64,
    pub hits: f64,
}

impl PrefixCache {
    pub fn hit_rate(&self) -> Option<f64> {
        (self.queries > 0.0).then(|| self.hits / self.queries)
    }
}

/// What one run's fleet looks like.
pub struct FleetSpec {
    pub sim: SimConfig,
    pub replicas: usize,
    pub seed: u64,
    /// TOML placed before `[[pools]]` (tiers, priorities, gateway).
    pub top: String,
    /// TOML keys of the pool (`balancer = ...`, `max_inflight = ...`, sub-tables last).
    pub pool: String,
    /// Replicas publish KV-cache events (with replay) and llmlb subscribes
    /// (`exact` prefix mode).
    pub kv_events: bool,
    /// How often llmlb scrapes each replica (its staleness limit is ten
    /// of these).
    pub scrape_interval: std::time::Duration,
}

/// The demo's scrape interval: short, so balancers that read the replicas'
/// queues see them change within a short run.
pub const SCRAPE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl FleetSpec {
    /// The demo's usual fleet: `args.replicas` of `args.profile` with a
    /// deliberately small KV cache, behind `balancer`.
    pub fn for_balancer(args: &DemoArgs, balancer: &str) -> Result<FleetSpec, DemoError> {
        let mut sim =
            SimConfig::named_or_file(&args.profile).map_err(|e| DemoError::Sim(e.to_string()))?;
        sim.engine.num_blocks = args.kv_blocks;
        // The longest request must fit in the (deliberately small) cache.
        let usable = args.kv_blocks.saturating_sub(1) * sim.engine.block_size;
        sim.engine.max_model_len = sim.engine.max_model_len.min(usable);
        Ok(FleetSpec {
            sim,
            replicas: args.replicas,
            seed: args.seed,
            top: String::new(),
            pool: pool_keys(balancer),
            kv_events: balancer == "exact",
            scrape_interval: SCRAPE_INTERVAL,
        })
    }
}

/// The pool keys of one demo run: a balancer name, or `hash` / `cache` /
/// `exact` for prefix-affinity routing (`[pools.prefix] mode`) in front of
/// `least_connections`.
pub fn pool_keys(name: &str) -> String {
    match name {
        "hash" | "cache" | "exact" => {
            format!("balancer = \"least_connections\"\n[pools.prefix]\nmode = {name:?}\n")
        }
        balancer => format!("balancer = {balancer:?}\n"),
    }
}

impl Fleet {
    pub async fn start(spec: &FleetSpec) -> Result<Fleet, DemoError> {
        spec.sim.validate().map_err(DemoError::Sim)?;
        let model = spec.sim.model.clone();
        let mut replicas = Vec::with_capacity(spec.replicas);
        for i in 0..spec.replicas {
            let mut config = spec.sim.clone();
            config.seed = spec.seed.wrapping_add(i as u64);
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            replicas.push(if spec.kv_events {
                let any = SocketAddr::from(([127, 0, 0, 1], 0));
                let kv = crate::replica_sim::KvEventsAddrs {
                    events: any,
                    replay: Some(any),
                };
                crate::replica_sim::spawn_with_kv_events(listener, config, kv)
                    .await
                    .map_err(|e| DemoError::Sim(e.to_string()))?
            } else {
                crate::replica_sim::spawn(listener, config)
            });
        }
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nreplica_header = true\n{}\n\
             [[pools]]\nname = \"demo\"\nmodels = [{model:?}]\n{}\n\
             [pools.scrape]\ninterval = \"{scrape}ms\"\ntimeout = \"{scrape}ms\"\nstaleness = \"{stale}ms\"\n",
            spec.top,
            spec.pool,
            scrape = spec.scrape_interval.as_millis(),
            stale = spec.scrape_interval.as_millis() * 10,
        );
        for r in &replicas {
            text.push_str(&format!(
                "[[pools.replicas]]\nurl = \"http://{}\"\n",
                r.addr
            ));
            if let (Some(events), Some(replay)) = (r.kv_events, r.kv_replay) {
                text.push_str(&format!(
                    "kv_events = \"tcp://{events}\"\nkv_events_replay = \"tcp://{replay}\"\n"
                ));
            }
        }
        let config = crate::config::parse(&text).map_err(|issues| {
            DemoError::Config(
                issues
                    .iter()
                    .map(|i| format!("{}: {}", i.key, i.reason))
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let admin = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = crate::daemon::start(config, listener, admin)?;
        wait_for_first_scrape(&proxy).await;
        Ok(Fleet {
            replicas,
            proxy,
            model,
        })
    }

    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.addr
    }

    /// The proxy's own `/metrics` text (its admin listener), scraped over
    /// HTTP like the replicas'.
    pub async fn proxy_metrics(&self) -> Option<String> {
        scrape(self.proxy.admin_addr).await
    }

    /// How old each replica's last scrape is now (ms), in pool order:
    /// where the next scrapes fall against traffic that starts now.
    pub fn scrape_ages_ms(&self) -> Vec<u64> {
        let now = crate::telemetry::clock::now_millis();
        self.proxy
            .state
            .topology()
            .pools()
            .iter()
            .flat_map(|p| p.replicas.iter())
            .filter_map(|r| r.load_snapshot().map(|s| now.saturating_sub(s.taken_at_ms)))
            .collect()
    }

    /// The replicas' addresses, in the pool's order.
    pub fn replica_addrs(&self) -> Vec<SocketAddr> {
        self.replicas.iter().map(|r| r.addr).collect()
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Sums `vllm:prefix_cache_queries_total` and `..._hits_total` over the
    /// replicas, scraped over HTTP like any monitoring system would.
    pub async fn prefix_cache(&self) -> PrefixCache {
        let mut total = PrefixCache::default();
        for r in &self.replicas {
            if let Some(text) = scrape(r.addr).await {
                total.queries +=
                    crate::signals::parse::sum(&text, "vllm:prefix_cache_queries_total")
                        .unwrap_or(0.0);
                total.hits += crate::signals::parse::sum(&text, "vllm:prefix_cache_hits_total")
                    .unwrap_or(0.0);
            }
        }
        total
    }

    pub async fn stop(self) {
        self.proxy.shutdown().await;
        for r in self.replicas {
            r.shutdown().await;
        }
    }
}

/// Balancers that read scraped load start with data: wait (a few scrape
/// intervals at most) until every replica of a scraped pool has been
/// scraped once. A pool that is not scraped (`round_robin`,
/// `least_connections` without prefix affinity) has nothing to wait for.
async fn wait_for_first_scrape(proxy: &Running) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        let topology = proxy.state.topology();
        let scraped = topology
            .pools()
            .iter()
            .filter(|p| p.scrape.is_some())
            .flat_map(|p| p.replicas.iter())
            .all(|r| r.load_snapshot().is_some());
        // `exact` mode: every subscriber has caught up with its replica.
        let subscribed = topology.pools().iter().all(|p| {
            p.router
                .kv_subscriptions()
                .iter()
                .all(|(_, _, held)| held.known())
        });
        if scraped && subscribed {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn scrape(addr: SocketAddr) -> Option<String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(conn);
    let req = http::Request::get("/metrics")
        .header("host", addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    String::from_utf8(body.to_vec()).ok()
}
