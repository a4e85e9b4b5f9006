//! Disaggregated pools: does each side answer vLLM's protocol? Each prefill
//! replica is asked to prefill the probe for a remote decode (one token,
//! `kv_transfer_params.do_remote_decode`); each decode replica then gets
//! the probe with the `kv_transfer_params` the first prefill answered, and
//! should report the prompt as cached (its KV cache arrived from the
//! prefill replica rather than being computed again).
//!
//! Real traffic: one one-token generation per replica of either side.

use std::time::Duration;

use bytes::Bytes;

use super::finding::{Finding, ReplicaReport, Report, Topic};
use super::probe;
use crate::config::{Config, KvProtocol, PoolConfig};
use crate::kv_transfer::{Pairing, Protocol, Vllm};
use crate::net::UpstreamTls;

/// Checks the pair of pools `pc` (with `[pools.disaggregation]`) and its
/// prefill pool, adding one finding per replica to `report`.
pub async fn check(config: &Config, pc: &PoolConfig, timeout: Duration, report: &mut Report) {
    let Some(d) = &pc.disaggregation else {
        return;
    };
    if d.protocol != KvProtocol::Vllm {
        report.notes.push(format!(
            "pool {:?}: the {} protocol is not probed",
            pc.name,
            d.protocol.as_str()
        ));
        return;
    }
    let Some(prefill) = config.pools.iter().find(|p| p.name == d.prefill_pool) else {
        return;
    };
    let Some(model) = pc.models.first() else {
        report.notes.push(format!(
            "pool {:?} lists no models: disaggregation not probed",
            pc.name
        ));
        return;
    };
    let body = probe::body(
        model,
        &probe::messages(&format!("{:016x}", rand::random::<u64>())),
    );
    let pairing = Pairing {
        prefill_host: "",
        bootstrap_port: 0,
        room: 0,
    };
    let prefill_body = Vllm
        .prefill_body(body.as_bytes(), &pairing)
        .expect("the probe is a JSON object");
    let mut answer: Option<(String, Bytes)> = None;
    for rc in &prefill.replicas {
        let name = rc.name.clone().unwrap_or_else(|| rc.url.clone());
        let finding = match send(prefill, &rc.url, prefill_body.clone(), timeout).await {
            Ok(bytes) => {
                let params = crate::kv_transfer::transfer_params(&bytes);
                let said = match &params {
                    Ok(Some(_)) => "answered kv_transfer_params for the decode side",
                    Ok(None) => {
                        "answered no kv_transfer_params (a connector that needs none, such as the shared-storage example)"
                    }
                    Err(_) => "answered something that is not JSON",
                };
                if params.is_ok() && answer.is_none() {
                    answer = Some((name.clone(), bytes));
                }
                match params {
                    Ok(_) => Finding::ok(
                        Topic::Disaggregation,
                        format!("prefilled the probe for remote decode; {said}"),
                    ),
                    Err(_) => Finding::error(
                        Topic::Disaggregation,
                        format!("prefilled the probe but {said}"),
                    ),
                }
            }
            Err(e) => Finding::error(
                Topic::Disaggregation,
                format!(
                    "does not prefill for a decode replica (kv_transfer_params.do_remote_decode): {e}; vLLM needs --kv-transfer-config with kv_role kv_producer or kv_both"
                ),
            ),
        };
        report.replicas.push(ReplicaReport {
            pool: prefill.name.clone(),
            replica: name,
            findings: vec![finding],
        });
    }
    let Some((from, answer)) = answer else {
        report.notes.push(format!(
            "pool {:?}: no prefill replica of {:?} answered, so the decode replicas were not probed",
            pc.name, prefill.name
        ));
        return;
    };
    let decode_body = Vllm
        .decode_body(body.as_bytes(), Some(&answer), &pairing)
        .expect("checked above");
    for rc in &pc.replicas {
        let finding = match send(pc, &rc.url, decode_body.clone(), timeout).await {
            Err(e) => Finding::error(
                Topic::Disaggregation,
                format!(
                    "does not decode a prefill from {from}: {e}; vLLM needs --kv-transfer-config with kv_role kv_consumer or kv_both"
                ),
            ),
            Ok(bytes) => {
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
                match v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
                    Some(c) if c > 0 => Finding::ok(
                        Topic::Disaggregation,
                        format!(
                            "decoded a prefill from {from}: {c} of {prompt} prompt tokens arrived cached"
                        ),
                    ),
                    Some(_) => Finding::warning(
                        Topic::Disaggregation,
                        format!(
                            "decoded the probe prefilled on {from} but reported none of its {prompt} prompt tokens cached: its KV cache did not arrive (are both sides' connectors configured alike?), so disaggregated requests are prefilled twice"
                        ),
                    ),
                    None => Finding::warning(
                        Topic::Disaggregation,
                        format!(
                            "decoded the probe prefilled on {from} but reports no cached tokens (vLLM: --enable-prompt-tokens-details): whether its KV cache arrived is unknown"
                        ),
                    ),
                }
            }
        };
        report.replicas.push(ReplicaReport {
            pool: pc.name.clone(),
            replica: rc.name.clone().unwrap_or_else(|| rc.url.clone()),
            findings: vec![finding],
        });
    }
}

/// Posts `body` to a replica of `pc`; its answer when 200.
async fn send(pc: &PoolConfig, url: &str, body: Bytes, timeout: Duration) -> Result<Bytes, String> {
    let tls = UpstreamTls::new(&pc.tls).map_err(|e| e.to_string())?;
    let client = crate::net::tls_client(&pc.timeouts, &tls);
    let auth = pc.upstream_api_key.as_ref().map(|k| format!("Bearer {k}"));
    let target = probe::Target {
        client: &client,
        url: url.trim_end_matches('/'),
        auth: auth.as_deref(),
        timeout,
    };
    target.post_chat(body).await
}
