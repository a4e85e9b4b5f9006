//! What the load-aware balancers read from a pool's config.

/// Parameters shared by the load-aware balancers, from a pool's config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalancerParams {
    /// Scraped load older than this is not used.
    pub max_age_ms: u64,
    /// Output tokens assumed for a request without `max_tokens`.
    pub default_max_tokens: u32,
    pub kv_threshold: f64,
    pub kv_capacity_tokens: u64,
    pub p2c_metric: crate::config::P2cMetric,
    pub seed: u64,
}

impl BalancerParams {
    pub fn from_pool(pc: &crate::config::PoolConfig) -> BalancerParams {
        BalancerParams {
            max_age_ms: pc.scrape.staleness.as_millis() as u64,
            default_max_tokens: pc.balancing.default_max_tokens,
            kv_threshold: pc.balancing.kv_threshold,
            kv_capacity_tokens: pc.balancing.kv_capacity_tokens,
            p2c_metric: pc.balancing.p2c_metric,
            seed: pc.balancing.seed,
        }
    }
}

impl Default for BalancerParams {
    fn default() -> Self {
        let b = crate::config::BalancingConfig::default();
        BalancerParams {
            max_age_ms: 2_000,
            default_max_tokens: b.default_max_tokens,
            kv_threshold: b.kv_threshold,
            kv_capacity_tokens: b.kv_capacity_tokens,
            p2c_metric: b.p2c_metric,
            seed: b.seed,
        }
    }
}
