//! The integration tests, built as one test binary (one link instead of one
//! per file). Each module is a former `tests/NAME.rs`: `cargo test --test it
//! NAME::` runs what `cargo test --test NAME` did (`simulate_agreement`, timed
//! against the simulator, stays a binary of its own). Fixture files stay in
//! `tests/fixtures/`.

// Support shared by the test modules.
mod common;
mod kv_support;
mod signals_fake;
mod sim_support;

mod access_log;
mod admission;
mod bench_cli;
mod bench_instant;
mod bench_loopback;
mod block_hash_vllm;
mod calibrate_loopback;
mod chaos;
mod check_cli;
mod closed_loop;
mod config_reference;
mod deadline_admission;
mod demo_quick;
mod disaggregation;
mod discovery;
mod doctor;
mod drain;
mod fair_share;
mod fleet;
mod fleet_order;
mod https_upstream;
mod kv_event_metrics;
mod kv_events;
mod limits;
mod model_metrics;
mod openai_surface;
mod otel;
mod promises;
mod props;
mod proxy_errors;
mod proxy_passthrough;
mod proxy_streaming;
mod redis_limits;
mod reload;
mod render_vllm;
mod request_scope;
mod routing_canary;
mod routing_exact;
mod routing_models;
mod routing_prefix;
mod routing_restart;
mod routing_sim;
mod routing_tiers;
mod serve_process;
mod signals_agree;
mod signals_health;
mod signals_load;
mod signals_parse;
mod signals_reload;
mod signals_sim;
mod sim_eviction_order;
mod sim_faults;
mod sim_http;
mod sim_timing;
mod smuggling;
mod status_page;
mod stream_usage;
mod tls;
mod tokenizer_fixture;
mod tokenizer_loopback;
