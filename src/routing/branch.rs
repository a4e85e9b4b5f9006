//! Why the routing stage narrowed the candidates the way it did. Each step
//! that acted adds its branch; every branch becomes a metric label and the
//! request's `route` tracing field.

/// One routing step's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteBranch {
    /// The model was named by an alias.
    Alias,
    /// No pool lists the model: the default pool took it.
    DefaultPool,
    /// The canary split chose the version, sticky by a request key.
    Canary,
    /// The canary split chose at random (the request had no sticky key).
    CanaryRandom,
    /// The chosen version had no eligible replica: any version serves.
    CanaryFallback,
    /// The version header forced the version.
    VersionForced,
    /// The request's tier kept it on its own replicas or pool.
    Tier,
    /// The tier's own replicas (or pool) were saturated: lower tiers' took it.
    TierOverflow,
    /// Session affinity: the session's replica.
    Session,
    /// The session's replica was saturated: the next in its order.
    SessionOverflow,
    /// Prefix affinity found the replica holding the prefix (or its first
    /// choice in hash mode).
    PrefixHit,
    /// The prefix's replica was saturated: the next in its order (hash), or
    /// a colder replica was faster (cache).
    PrefixOverflow,
    /// No replica seemed to hold the prefix: the fastest cold one.
    PrefixMiss,
    /// The prompt was too short to have a prefix: the balancer decides.
    PrefixNone,
    /// The prompt's cached prefix cannot be predicted exactly (media parts,
    /// a request template, a template error, ...): the balancer decides.
    PrefixUnpredictable,
    /// `exact` mode: the chosen replica's cache was estimated from what
    /// llmlb sent it, because its KV events are unknown (not connected yet,
    /// or events were missed and have not refilled) or no replica's events
    /// show any of the prompt.
    PrefixEstimated,
    /// The prefix is hot: kept on several replicas on purpose, and the
    /// request went to one of its copies ([`super::prefix::hot`]).
    PrefixReplicated,
    /// The request went to its prefix's home ([`super::prefix::home`]),
    /// which won only because it is counted as keeping the prefix.
    PrefixHome,
    /// Every candidate was saturated: affinity gave way to the balancer.
    Saturated,
    /// The request's LoRA adapter is loaded on the preferred replicas.
    LoraLoaded,
    /// No unsaturated replica had the adapter loaded: preferred those with a
    /// free adapter slot.
    LoraSpread,
    /// The adapter runs on the preferred replicas, but other adapters'
    /// requests wait there for it to drain: no place ran it without that.
    LoraDraining,
    /// Every candidate would have to swap an adapter out.
    LoraSwap,
}

impl RouteBranch {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteBranch::Alias => "alias",
            RouteBranch::DefaultPool => "default_pool",
            RouteBranch::Canary => "canary",
            RouteBranch::CanaryRandom => "canary_random",
            RouteBranch::CanaryFallback => "canary_fallback",
            RouteBranch::VersionForced => "version_forced",
            RouteBranch::Tier => "tier",
            RouteBranch::TierOverflow => "tier_overflow",
            RouteBranch::Session => "session",
            RouteBranch::SessionOverflow => "session_overflow",
            RouteBranch::PrefixHit => "prefix_hit",
            RouteBranch::PrefixOverflow => "prefix_overflow",
            RouteBranch::PrefixMiss => "prefix_miss",
            RouteBranch::PrefixNone => "prefix_none",
            RouteBranch::PrefixUnpredictable => "prefix_unpredictable",
            RouteBranch::PrefixEstimated => "prefix_estimated",
            RouteBranch::PrefixReplicated => "prefix_replicated",
            RouteBranch::PrefixHome => "prefix_home",
            RouteBranch::Saturated => "saturated",
            RouteBranch::LoraLoaded => "lora_loaded",
            RouteBranch::LoraSpread => "lora_spread",
            RouteBranch::LoraDraining => "lora_draining",
            RouteBranch::LoraSwap => "lora_swap",
        }
    }
}

/// The branches of one request as one tracing field: `canary,prefix_hit`.
pub fn join(branches: &[RouteBranch]) -> String {
    let mut out = String::new();
    for (i, b) in branches.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(b.as_str());
    }
    out
}
