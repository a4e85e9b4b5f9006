//! `llmlb sim`: simulated vLLM replicas.

pub mod engine;
pub mod text;
