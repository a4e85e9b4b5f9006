//! What the calibration reads from the replica besides its answers: the
//! model it serves (`GET /v1/models`), its engine version (`GET /version`),
//! and a few series of its Prometheus `/metrics` (vLLM's names): whether it
//! is busy, its KV-cache shape, its own time to first token, how many
//! requests it finished.

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::net::error_chain;

/// Plain GETs against one replica.
pub struct Replica {
    base: String,
    auth: Option<HeaderValue>,
    http: Client<HttpConnector, Empty<Bytes>>,
}

impl Replica {
    /// `base` has no trailing `/` or `/v1`.
    pub fn new(base: &str, api_key: Option<&str>) -> Result<Replica, String> {
        let auth = api_key
            .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
            .transpose()
            .map_err(|_| "--api-key has invalid characters".to_string())?;
        Ok(Replica {
            base: base.to_owned(),
            auth,
            http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        })
    }

    /// The body of `GET {base}{path}` on a 2xx, within 30 seconds.
    pub async fn get(&self, path: &str) -> Result<String, String> {
        let uri: Uri = format!("{}{path}", self.base)
            .parse()
            .map_err(|e| format!("{}{path}: {e}", self.base))?;
        let mut req = Request::get(uri).body(Empty::new()).expect("a valid GET");
        if let Some(a) = &self.auth {
            req.headers_mut().insert(AUTHORIZATION, a.clone());
        }
        let answer = async {
            let resp = self.http.request(req).await.map_err(|e| error_chain(&e))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| error_chain(&e))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("answered {status}"));
            }
            String::from_utf8(body.to_vec()).map_err(|_| "the body is not UTF-8".to_string())
        };
        tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .map_err(|_| "no answer within 30 s".to_string())?
            .map_err(|e| format!("GET {path}: {e}"))
    }

    /// The served models' ids and, when the server says, their context length
    /// (vLLM's `max_model_len`).
    pub async fn models(&self) -> Result<Vec<(String, Option<usize>)>, String> {
        let text = self.get("/v1/models").await?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("GET /v1/models: {e}"))?;
        Ok(v["data"]
            .as_array()
            .map(|models| {
                models
                    .iter()
                    .filter_map(|m| {
                        let id = m["id"].as_str()?.to_owned();
                        let len = m["max_model_len"].as_u64().map(|l| l as usize);
                        Some((id, len))
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// vLLM's `GET /version` (`{"version": "0.32.0"}`), if it answers one.
    pub async fn version(&self) -> Option<String> {
        let text = self.get("/version").await.ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["version"].as_str().map(str::to_owned)
    }

    pub async fn metrics(&self) -> Result<Metrics, String> {
        self.get("/metrics").await.map(|t| Metrics::parse(&t))
    }
}

/// The series the calibration reads, each summed over its labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Whether any series carried the `vllm:` prefix.
    pub vllm: bool,
    pub running: f64,
    pub waiting: f64,
    pub ttft_sum: f64,
    pub ttft_count: f64,
    pub itl_sum: f64,
    pub itl_count: f64,
    pub finished: f64,
    /// From `vllm:cache_config_info`'s labels.
    pub block_size: Option<usize>,
    pub num_gpu_blocks: Option<usize>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            if name.starts_with("vllm:") {
                m.vllm = true;
            }
            let v: f64 = value.trim().parse().unwrap_or(0.0);
            match name {
                "vllm:num_requests_running" => m.running += v,
                "vllm:num_requests_waiting" => m.waiting += v,
                "vllm:time_to_first_token_seconds_sum" => m.ttft_sum += v,
                "vllm:time_to_first_token_seconds_count" => m.ttft_count += v,
                "vllm:inter_token_latency_seconds_sum" => m.itl_sum += v,
                "vllm:inter_token_latency_seconds_count" => m.itl_count += v,
                "vllm:request_success_total" => m.finished += v,
                "vllm:cache_config_info" => {
                    m.block_size = label(series, "block_size").and_then(|s| s.parse().ok());
                    m.num_gpu_blocks = label(series, "num_gpu_blocks").and_then(|s| s.parse().ok());
                }
                _ => {}
            }
        }
        m
    }

    /// The replica's mean time to first token between `before` and `self`.
    pub fn ttft_mean_since(&self, before: &Metrics) -> Option<f64> {
        let n = self.ttft_count - before.ttft_count;
        (n > 0.0).then(|| (self.ttft_sum - before.ttft_sum) / n)
    }

    /// The replica's mean inter-token latency between `before` and `self`.
    pub fn itl_mean_since(&self, before: &Metrics) -> Option<f64> {
        let n = self.itl_count - before.itl_count;
        (n > 0.0).then(|| (self.itl_sum - before.itl_sum) / n)
    }
}

/// The value of `key="..."` in a series' labels (a label name is matched
/// whole: `block_size` is not the tail of `_block_size_resolved`).
fn label<'a>(series: &'a str, key: &str) -> Option<&'a str> {
    let labels = series.split_once('{')?.1;
    let needle = format!("{key}=\"");
    let mut from = 0;
    while let Some(i) = labels[from..].find(&needle) {
        let at = from + i;
        if at == 0 || labels.as_bytes()[at - 1] == b',' {
            return labels[at + needle.len()..].split('"').next();
        }
        from = at + needle.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_series_and_the_cache_shape() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/vllm_cpu_real_metrics.txt"
        ))
        .unwrap();
        let m = Metrics::parse(&text);
        assert!(m.vllm);
        assert_eq!(m.block_size, Some(128));
        assert_eq!(m.num_gpu_blocks, Some(32));
        assert_eq!(m.running, 0.0);
        assert_eq!(m.waiting, 0.0);
    }

    #[test]
    fn ttft_mean_is_the_difference_of_two_scrapes() {
        let a = Metrics::parse(
            "vllm:time_to_first_token_seconds_sum{a=\"1\"} 1.0\nvllm:time_to_first_token_seconds_count{a=\"1\"} 10\n",
        );
        let b = Metrics::parse(
            "vllm:time_to_first_token_seconds_sum{a=\"1\"} 1.5\nvllm:time_to_first_token_seconds_count{a=\"1\"} 15\n",
        );
        assert_eq!(b.ttft_mean_since(&a), Some(0.1));
        assert_eq!(a.ttft_mean_since(&a), None);
    }

    #[test]
    fn a_label_is_not_found_as_the_tail_of_another() {
        let s = "vllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"128\"}";
        assert_eq!(label(s, "block_size"), Some("128"));
        assert_eq!(label("x{block_size=\"16\"}", "block_size"), Some("16"));
        assert_eq!(label("x{a=\"1\"}", "block_size"), None);
    }
}
