//! The configuration of one simulated replica: a named profile, optionally
//! overridden by a TOML file and then by command-line flags.
//!
//! A TOML file may name its base profile and override any subset of fields:
//!
//! ```toml
//! profile = "h100-8b"
//! model = "my-org/my-model"
//! [engine]
//! num_blocks = 4000
//! [cost]
//! step_overhead = 0.012
//! ```
//!
//! The override is a deep merge of the file's tables over the profile's, then
//! a strict parse (`deny_unknown_fields`), then [`SimConfig::validate`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::engine::{CostModel, EngineParams};
use crate::tokenize::PromptTokenizer;

/// Everything that defines one simulated replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// The model name served (`/v1/models`, the `model_name` metric label).
    pub model: String,
    /// Simulated seconds per real second: 10 runs ten times faster than real time.
    pub time_scale: f64,
    /// Seeds the filler text and the fault draws.
    pub seed: u64,
    /// Output length when a request sets neither `max_tokens` nor `max_completion_tokens`.
    pub default_max_tokens: usize,
    /// Simulated seconds after start before `/health` answers 200.
    pub startup_delay: f64,
    pub engine: EngineParams,
    pub cost: CostModel,
    pub faults: FaultConfig,
    /// A model directory whose tokenizer and chat template count prompt
    /// tokens, as the model's vLLM would (unset: the stand-in tokenizer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_dir: Option<PathBuf>,
    /// Prefill/decode role and KV transfer speed.
    #[serde(default)]
    pub disaggregation: super::role::RoleConfig,
    /// Where the profile was fitted, when `llmlb calibrate` wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted: Option<Fitted>,
}

/// Where and against what a profile was fitted (the `[fitted]` table that
/// `llmlb calibrate` writes). `llmlb doctor --profile` compares it with the
/// replicas it probes and the machine it runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fitted {
    /// When, as an RFC 3339 UTC time.
    pub date: String,
    /// The replica probed.
    pub url: String,
    /// The model it served.
    pub model: String,
    /// The serving engine (`vllm` when its metrics carry the `vllm:` prefix).
    pub engine: String,
    /// What the replica's `GET /version` answered, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// The host name of the machine the calibration ran on.
    pub host: String,
    /// Its CPU model: the replica's own when the replica ran there (a
    /// loopback URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Probe requests sent.
    pub requests: u64,
    /// Wall time of the probes, in seconds.
    pub seconds: f64,
}

/// Fault injection settings, at start and as changed by `POST /sim/fault`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Fraction (0..1) of inference requests answered with a 500.
    pub error_rate: f64,
    /// Accept requests and never answer them.
    pub hang: bool,
    /// Multiplies every step time (1 is normal speed).
    pub slowdown: f64,
    /// Refuse new requests with 503 while this many are already waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<usize>,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            error_rate: 0.0,
            hang: false,
            slowdown: 1.0,
            max_waiting: None,
        }
    }
}

impl FaultConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!(
                "faults.error_rate must be within 0..1, got {}",
                self.error_rate
            ));
        }
        if !(self.slowdown.is_finite() && self.slowdown > 0.0) {
            return Err(format!(
                "faults.slowdown must be a number > 0, got {}",
                self.slowdown
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown profile `{0}`: neither a built-in ({known}) nor a profile file", known = super::profile::NAMES.join(", "))]
    UnknownProfile(String),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid simulator config: {0}")]
    Invalid(String),
}

impl SimConfig {
    /// A named profile (see [`super::profile`]).
    pub fn profile(name: &str) -> Option<SimConfig> {
        super::profile::named(name)
    }

    /// What a `--profile NAME|FILE` flag names: a built-in profile, or a
    /// profile file (TOML overrides over its `profile` key, else `h100-8b`,
    /// as `llmlb replica-sim --config` reads it).
    pub fn named_or_file(arg: &str) -> Result<SimConfig, ConfigError> {
        if let Some(c) = SimConfig::profile(arg) {
            return Ok(c);
        }
        let path = Path::new(arg);
        if path.is_file() {
            return SimConfig::from_toml_file(path, "h100-8b");
        }
        Err(ConfigError::UnknownProfile(arg.to_string()))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.model.is_empty() {
            return Err("model must not be empty".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(format!(
                "time_scale must be a number > 0, got {}",
                self.time_scale
            ));
        }
        if self.default_max_tokens == 0 {
            return Err("default_max_tokens must be at least 1".into());
        }
        if !(self.startup_delay.is_finite() && self.startup_delay >= 0.0) {
            return Err(format!(
                "startup_delay must be a number >= 0, got {}",
                self.startup_delay
            ));
        }
        self.engine.validate()?;
        self.cost.validate()?;
        self.faults.validate()?;
        self.disaggregation.validate()?;
        self.tokenizer().map(|_| ())
    }

    /// The prompt tokenizer: the model's files in `tokenizer_dir`, else the
    /// stand-in.
    pub fn tokenizer(&self) -> Result<PromptTokenizer, String> {
        match &self.tokenizer_dir {
            Some(dir) => PromptTokenizer::load(dir).map_err(|e| format!("tokenizer_dir: {e}")),
            None => Ok(PromptTokenizer::StandIn),
        }
    }

    /// Reads a TOML file over a profile: the file's `profile` key when it has
    /// one, else `default_profile`.
    pub fn from_toml_file(path: &Path, default_profile: &str) -> Result<SimConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        SimConfig::from_toml_str(&text, default_profile).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML overrides over a profile (see the module docs).
    pub fn from_toml_str(text: &str, default_profile: &str) -> Result<SimConfig, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: "<config>".into(),
            message,
        };
        let mut file: toml::Table = text.parse().map_err(|e| parse_err(format!("{e}")))?;
        let name = match file.remove("profile") {
            Some(toml::Value::String(s)) => s,
            Some(other) => {
                return Err(parse_err(format!(
                    "`profile` must be a string, got {other}"
                )));
            }
            None => default_profile.to_string(),
        };
        let base = SimConfig::profile(&name).ok_or(ConfigError::UnknownProfile(name))?;
        let mut merged = toml::Table::try_from(&base).expect("a profile serializes to TOML");
        merge(&mut merged, file);
        let cfg: SimConfig = merged
            .try_into()
            .map_err(|e: toml::de::Error| parse_err(e.message().to_string()))?;
        cfg.validate().map_err(ConfigError::Invalid)?;
        Ok(cfg)
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_valid_and_round_trips() {
        for name in super::super::profile::NAMES {
            let p = SimConfig::profile(name).unwrap();
            p.validate().unwrap();
            let text = toml::to_string(&p).unwrap();
            assert_eq!(SimConfig::from_toml_str(&text, name).unwrap(), p);
        }
        assert!(SimConfig::profile("nope").is_none());
    }

    #[test]
    fn the_example_file_parses() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim/example.toml");
        let c = SimConfig::from_toml_file(&path, "fast").unwrap();
        assert_eq!(c.model, "my-org/my-model");
        assert_eq!(c.engine.num_blocks, 12_000);
        assert_eq!(c.cost.step_overhead, 0.012);
    }

    #[test]
    fn toml_overrides_only_what_it_names() {
        let c = SimConfig::from_toml_str(
            "profile = \"fast\"\nmodel = \"m\"\n[engine]\nnum_blocks = 77\nmax_model_len = 1024\n[faults]\nmax_waiting = 3\n",
            "h100-8b",
        )
        .unwrap();
        let fast = SimConfig::profile("fast").unwrap();
        assert_eq!(c.model, "m");
        assert_eq!(c.engine.num_blocks, 77);
        assert_eq!(c.engine.block_size, fast.engine.block_size);
        assert_eq!(c.cost, fast.cost);
        assert_eq!(c.faults.max_waiting, Some(3));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_errors() {
        let e = SimConfig::from_toml_str("[engine]\nblock_sise = 16\n", "fast").unwrap_err();
        assert!(e.to_string().contains("block_sise"), "{e}");
        let e = SimConfig::from_toml_str("time_scale = 0.0\n", "fast").unwrap_err();
        assert!(e.to_string().contains("time_scale"), "{e}");
        let e = SimConfig::from_toml_str("profile = \"gpu9000\"\n", "fast").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownProfile(_)));
        let e = SimConfig::from_toml_str("[faults]\nerror_rate = 2.0\n", "fast").unwrap_err();
        assert!(e.to_string().contains("error_rate"), "{e}");
    }

    #[test]
    fn a_profile_flag_names_a_built_in_or_a_file() {
        assert_eq!(
            SimConfig::named_or_file("fast").unwrap().model,
            SimConfig::profile("fast").unwrap().model
        );
        let path = std::env::temp_dir().join(format!("llmlb-profile-{}.toml", std::process::id()));
        std::fs::write(&path, "profile = \"fast\"\nmodel = \"from-file\"\n").unwrap();
        let c = SimConfig::named_or_file(path.to_str().unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(c.model, "from-file");
        assert_eq!(c.engine, SimConfig::profile("fast").unwrap().engine);
        let e = SimConfig::named_or_file("gpu9000").unwrap_err();
        assert!(e.to_string().contains("nor a profile file"), "{e}");
    }
}
