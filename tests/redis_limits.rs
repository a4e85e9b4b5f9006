//! Per-key rate limits shared by two llmlb instances through a real
//! `redis-server`, and the local fallback when Redis goes away.
//!
//! Needs `redis-server` on the PATH (`.ci/run` installs it). Without it the
//! test prints why it did not run, unless `LLMLB_REQUIRE_REDIS` is set (CI
//! sets it), in which case a missing server is a failure.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use http::StatusCode;

fn redis_server() -> Option<ChildGuard> {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var_os("LLMLB_REQUIRE_REDIS").is_none(),
            "LLMLB_REQUIRE_REDIS is set but redis-server is not installed"
        );
        eprintln!("redis_limits: redis-server not installed; shared-limit test not run");
        return None;
    }
    Some(ChildGuard(
        Command::new("redis-server")
            .args(["--port", &PORT.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    ))
}

static PORT: std::sync::LazyLock<u16> = std::sync::LazyLock::new(|| {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
});

async fn wait_for_redis() {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", *PORT)).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                if s.write_all(b"PING\r\n").await.is_ok() {
                    let mut buf = [0u8; 7];
                    if s.read_exact(&mut buf).await.is_ok() && &buf == b"+PONG\r\n" {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("redis-server answers PING");
}

fn config(upstream: &str) -> String {
    let key = llmlb::gateway::keys::hash_key("sk-shared");
    format!(
        "limits = {{ backend = \"redis\", url = \"redis://127.0.0.1:{port}\", timeout = \"200ms\" }}\n\
         [[tiers]]\nname = \"t\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{key}\"\ntenant = \"acme\"\ntier = \"t\"\nrequests_per_minute = 4\n\
         {}",
        one_pool("round_robin", &[(upstream, 1)], ""),
        port = *PORT,
    )
}

async fn send(lb: std::net::SocketAddr) -> (StatusCode, http::HeaderMap) {
    let mut r = chat_request("/v1/chat/completions", CHAT);
    r.headers_mut()
        .insert("authorization", "Bearer sk-shared".parse().unwrap());
    let (status, headers, _) = call(lb, r).await;
    (status, headers)
}

#[tokio::test]
async fn two_instances_share_one_budget_and_fall_back_when_redis_dies() {
    let Some(mut redis) = redis_server() else {
        return;
    };
    wait_for_redis().await;
    let up = Upstream::start("a", Mode::Json).await;
    let a = start_llmlb(&config(&up.url())).await;
    let b = start_llmlb(&config(&up.url())).await;

    // 4 requests per minute for the key, whichever instance serves them.
    let mut remaining = Vec::new();
    for lb in [a.addr, b.addr, a.addr, b.addr] {
        let (status, h) = send(lb).await;
        assert_eq!(status, StatusCode::OK);
        remaining.push(
            h["x-ratelimit-remaining-requests"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(remaining, vec!["3", "2", "1", "0"]);
    for lb in [a.addr, b.addr] {
        let (status, h) = send(lb).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "the budget is shared"
        );
        assert!(h.contains_key("retry-after"));
    }
    assert_eq!(up.requests(), 4);

    // Redis goes away: requests are never failed closed; each instance uses
    // its local buckets (which have their own, untouched budget) and says so.
    redis.0.kill().unwrap();
    redis.0.wait().unwrap();
    let (status, _) = send(a.addr).await;
    assert_eq!(status, StatusCode::OK, "limits fall back to local");
    let text = metrics_text(a.admin_addr).await;
    assert!(
        metric_value(&text, "llmlb_rate_limit_fallbacks_total", &[]) >= 1.0,
        "{text}"
    );
    assert_eq!(metric_value(&text, "llmlb_rate_limit_backend_up", &[]), 0.0);
    a.shutdown().await;
    b.shutdown().await;
}
