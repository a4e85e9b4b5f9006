//! A replica's LoRA adapters as its `/metrics` page shows them.
//!
//! vLLM's `vllm:lora_requests_info` gauge names the adapters of the running
//! and waiting requests (`running_lora_adapters`, `waiting_lora_adapters`,
//! comma-separated) and `max_lora`. vLLM keeps one series per label set it
//! has seen, valued by when it was last set, so the newest one is the
//! current state. The scrape loop stores it on the replica
//! ([`crate::replica::adapters::Adapters::observe`]).

use crate::replica::adapters::LoraInfo;

/// The newest `vllm:lora_requests_info` series of a metrics page.
pub fn parse(text: &str) -> Option<LoraInfo> {
    let mut best: Option<(f64, LoraInfo)> = None;
    for s in super::parse::samples(text) {
        if s.name != "vllm:lora_requests_info" {
            continue;
        }
        if best.as_ref().is_some_and(|(t, _)| *t >= s.value) {
            continue;
        }
        let list = |key: &str| -> Vec<String> {
            s.label(key)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect()
        };
        let info = LoraInfo {
            max_lora: s.label("max_lora").and_then(|m| m.parse().ok()),
            running: list("running_lora_adapters"),
            waiting: list("waiting_lora_adapters"),
        };
        best = Some((s.value, info));
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_newest_lora_series() {
        let text = "# TYPE vllm:lora_requests_info gauge\n\
            vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"sql\",waiting_lora_adapters=\"\"} 1.7e9\n\
            vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"chat\",waiting_lora_adapters=\"sql,docs\"} 1.8e9\n";
        let i = parse(text).unwrap();
        assert_eq!(i.max_lora, Some(1));
        assert_eq!(i.running, ["chat"]);
        assert_eq!(i.waiting, ["sql", "docs"]);
        assert!(parse("vllm:num_requests_running 1\n").is_none());
    }
}
