//! `models_from_replicas = true`: the model names a pool's replicas report
//! on `GET /v1/models` (a vLLM replica lists its base model and every LoRA
//! adapter loaded on it, including adapters loaded at run time), served
//! and routed as if the pool listed them.
//!
//! The list is fetched lazily: when a request names a model no pool lists
//! and when a client asks for `GET /v1/models`, a list older than
//! [`FRESH_FOR`] is fetched again from every eligible replica at once (each
//! within [`FETCH_TIMEOUT`]) and the union replaces it. One fetch runs per
//! pool at a time; concurrent callers wait for it and share its result. A
//! replica that fails to answer contributes nothing to that round; when all
//! fail, the previous list stays. Names the config lists keep their pool:
//! a reported name is only consulted when the config knows no pool for it.
//!
//! Cost: nothing on requests for configured models; for an unknown model, a
//! read of the last list (and at most one fetch round per [`FRESH_FOR`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

/// How long a fetched list is used before the next request fetches again.
pub const FRESH_FOR: Duration = Duration::from_secs(10);
/// Time one replica has to answer `GET /v1/models`.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Listed {
    at: Instant,
    ids: BTreeSet<String>,
}

/// The last list of model names a pool's replicas reported.
#[derive(Debug, Default)]
pub struct ReplicaModels {
    listed: ArcSwapOption<Listed>,
    fetching: tokio::sync::Mutex<()>,
}

impl ReplicaModels {
    /// Whether the last list holds `model` (no fetch).
    pub fn contains(&self, model: &str) -> bool {
        self.listed
            .load()
            .as_ref()
            .is_some_and(|l| l.ids.contains(model))
    }

    /// The last list, in name order.
    pub fn ids(&self) -> Vec<String> {
        self.listed
            .load()
            .as_ref()
            .map(|l| l.ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn fresh(&self) -> bool {
        self.listed
            .load()
            .as_ref()
            .is_some_and(|l| l.at.elapsed() < FRESH_FOR)
    }

    /// Fetches again when the list is missing or older than [`FRESH_FOR`];
    /// `fetch` answers one round (every replica's ids, `None` per failure).
    pub async fn refresh<F, Fut>(&self, fetch: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Vec<Option<Vec<String>>>>,
    {
        if self.fresh() {
            return;
        }
        let _one = self.fetching.lock().await;
        if self.fresh() {
            return;
        }
        let answers = fetch().await;
        if !answers.is_empty() && answers.iter().all(Option::is_none) {
            return;
        }
        let ids = answers.into_iter().flatten().flatten().collect();
        self.listed.store(Some(Arc::new(Listed {
            at: Instant::now(),
            ids,
        })));
    }
}

/// The `id` of every entry of an OpenAI model list (`{"data":[{"id":..}]}`).
pub fn parse_ids(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    Some(
        list.data
            .into_iter()
            .map(|e| e.id)
            .filter(|id| !id.is_empty())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_from_a_vllm_model_list() {
        let body = br#"{"object":"list","data":[
            {"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null},
            {"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B-Instruct"}]}"#;
        assert_eq!(
            parse_ids(body).unwrap(),
            ["meta-llama/Llama-3.1-8B-Instruct", "sql-lora"]
        );
        assert_eq!(parse_ids(b"not json"), None);
    }

    #[tokio::test]
    async fn a_fresh_list_is_not_fetched_again_and_a_failed_round_keeps_the_old() {
        let models = ReplicaModels::default();
        models
            .refresh(|| async { vec![Some(vec!["a".into()]), Some(vec!["b".into(), "a".into()])] })
            .await;
        assert_eq!(models.ids(), ["a", "b"]);
        let mut called = false;
        models
            .refresh(|| {
                called = true;
                async { vec![] }
            })
            .await;
        assert!(!called, "fresh for {FRESH_FOR:?}");
        // An old list whose refresh fails everywhere is kept.
        models.listed.store(Some(Arc::new(Listed {
            at: Instant::now() - FRESH_FOR,
            ids: ["a".to_string()].into(),
        })));
        models.refresh(|| async { vec![None, None] }).await;
        assert!(models.contains("a"));
        models
            .refresh(|| async { vec![None, Some(vec!["c".into()])] })
            .await;
        assert_eq!(models.ids(), ["c"]);
    }
}
