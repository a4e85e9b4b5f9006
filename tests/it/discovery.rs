//! Replica discovery by DNS, resolved through a hosts-format file so the test
//! controls the records: replicas appear, survive DNS failures and reloads with
//! their state, and leave with their running streams allowed to finish.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use http::StatusCode;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const LIMIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn replicas_follow_the_dns_records() {
    let up = Upstream::start("pod", Mode::Json).await;
    let dir = Dir(std::env::temp_dir().join(format!("llmlb-discovery-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let hosts = dir.0.join("hosts");
    let record = "127.0.0.1 vllm.default.svc.cluster.local\n";
    std::fs::write(&hosts, record).unwrap();
    let config = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n\
         discovery = {{ dns = \"vllm.default.svc.cluster.local\", port = {}, interval = \"100ms\", hosts_file = \"{}\" }}\n",
        up.addr.port(),
        hosts.display()
    );
    let lb = start_llmlb(&config).await;
    let path = dir.0.join("llmlb.toml");
    std::fs::write(&path, &config).unwrap();
    lb.state.config_path.set(path).unwrap();
    let status = |lb: std::net::SocketAddr| async move {
        call(lb, chat_request("/v1/chat/completions", CHAT)).await.0
    };

    // The record appears: the pool gets its replica.
    until_async("replica discovered", LIMIT, async || {
        status(lb.addr).await == StatusCode::OK
    })
    .await;
    let first_id = lb.state.topology().pools()[0].replicas[0].id;
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_discovery_replicas", &[("pool", "llama")]),
        1.0
    );

    // DNS trouble keeps the last known replicas.
    std::fs::remove_file(&hosts).unwrap();
    until_async("resolution failure counted", LIMIT, async || {
        metric_value(
            &metrics_text(lb.admin_addr).await,
            "llmlb_discovery_errors_total",
            &[],
        ) >= 1.0
    })
    .await;
    assert_eq!(status(lb.addr).await, StatusCode::OK);
    std::fs::write(&hosts, record).unwrap();

    // A config reload keeps the discovered replica and its state.
    let reload = post_request("/admin/reload", "admin");
    let (st, _, body) = call(lb.admin_addr, reload).await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(lb.state.topology().pools()[0].replicas[0].id, first_id);

    // A stream is running when the record disappears: no new work reaches the
    // replica, and the running stream finishes.
    up.set_mode(Mode::StreamHeld);
    let (_conn, body) = held_stream(lb.addr).await;
    std::fs::write(&hosts, "# no pods\n").unwrap();
    until_async("replica removed", LIMIT, async || {
        lb.state.topology().pools()[0].replicas.is_empty()
    })
    .await;
    let (st, _, body_bytes) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&body_bytes), "no_healthy_replica");
    finish_stream(&up, body, "the running stream finishes").await;

    // The record comes back.
    up.set_mode(Mode::Json);
    std::fs::write(&hosts, record).unwrap();
    until_async("replica back", LIMIT, async || {
        status(lb.addr).await == StatusCode::OK
    })
    .await;
    let text = metrics_text(lb.admin_addr).await;
    assert!(metric_value(&text, "llmlb_discovery_updates_total", &[("pool", "llama")]) >= 3.0);
    lb.shutdown().await;
}

#[test]
fn discovery_and_static_replicas_are_exclusive() {
    let both = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n\
                discovery = { dns = \"x\", port = 8000 }\n\
                [[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
    let issues = llmlb::config::parse(both).unwrap_err();
    assert_eq!(issues[0].key, "pools[0].discovery");
    let neither = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n";
    let issues = llmlb::config::parse(neither).unwrap_err();
    assert_eq!(issues[0].key, "pools[0].replicas");
    let bad = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\ndiscovery = { dns = \"\", port = 0 }\n";
    let keys: Vec<String> = llmlb::config::parse(bad)
        .unwrap_err()
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(
        keys,
        vec!["pools[0].discovery.dns", "pools[0].discovery.port"]
    );
}

/// A discovered replica is named by its reverse DNS name (here from the
/// hosts file, as a StatefulSet's pod would resolve back), so its series
/// keep their `replica` label when the pod comes back with a new address;
/// `replica_names = "address"` keeps `host:port`.
#[tokio::test]
async fn discovered_replicas_carry_their_pod_names() {
    let up = Upstream::start("pod", Mode::Json).await;
    let dir = Dir(std::env::temp_dir().join(format!("llmlb-pod-names-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let hosts = dir.0.join("hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 vllm.default.svc.cluster.local vllm-0.vllm.default.svc.cluster.local\n",
    )
    .unwrap();
    for (names, want) in [
        ("reverse_dns", "vllm-0".to_string()),
        ("address", format!("127.0.0.1:{}", up.addr.port())),
    ] {
        let config = format!(
            "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n\
             discovery = {{ dns = \"vllm.default.svc.cluster.local\", port = {}, \
             interval = \"100ms\", hosts_file = \"{}\", replica_names = \"{names}\" }}\n",
            up.addr.port(),
            hosts.display()
        );
        let lb = start_llmlb(&config).await;
        until_async("replica discovered", LIMIT, async || {
            !lb.state.topology().pools()[0].replicas.is_empty()
        })
        .await;
        assert_eq!(lb.state.topology().pools()[0].replicas[0].name, want);
        let (st, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
        assert_eq!(st, StatusCode::OK);
        let text = metrics_text(lb.admin_addr).await;
        let info = metric_value(
            &text,
            "llmlb_replica_info",
            &[("replica", want.as_str()), ("url", &up.url())],
        );
        assert_eq!(info, 1.0, "{names}");
        lb.shutdown().await;
    }
}
