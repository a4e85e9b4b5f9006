//! Canary version splits through a real llmlb on loopback: the split over
//! many users, stickiness per user, the version header, and per-version
//! metrics.

use crate::common;

use common::{Mode, Upstream, call, chat_request, metric_value, metrics_text, sample, start_llmlb};
use http::StatusCode;

fn config(a: &Upstream, b: &Upstream, weights: &str) -> String {
    format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"round_robin\"\n\
         [pools.canary]\nweights = {{ {weights} }}\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"a\"\nversion = \"v1\"\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"b\"\nversion = \"v2\"\n",
        a.url(),
        b.url()
    )
}

/// Version v1 on replica `a` (answering JSON), v2 on `b` (answering in
/// `b_mode`), split by `weights`.
async fn canary(weights: &str, b_mode: Mode) -> (Upstream, Upstream, llmlb::daemon::Running) {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", b_mode).await;
    let lb = start_llmlb(&config(&a, &b, weights)).await;
    (a, b, lb)
}

fn body(user: Option<&str>) -> String {
    let user = user.map_or(String::new(), |u| format!(r#""user":"{u}","#));
    format!(r#"{{"model":"llama-3-8b",{user}"messages":[{{"role":"user","content":"hi"}}]}}"#)
}

/// Sends one request and returns (status, replica that answered, version header).
async fn send(
    addr: std::net::SocketAddr,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String, Option<String>) {
    let mut req = chat_request("/v1/chat/completions", body);
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let (status, h, bytes) = call(addr, req).await;
    let replica = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["replica"].as_str().map(str::to_string))
        .unwrap_or_default();
    let version = h
        .get("x-llmlb-version")
        .map(|v| v.to_str().unwrap().to_string());
    (status, replica, version)
}

/// 300 users at 80/20: the canary's share is Binomial(300, 0.2), mean 60,
/// standard deviation 6.9; accept ±4 standard deviations (33..=87).
#[tokio::test]
async fn split_over_users_within_tolerance_and_sticky() {
    let (_a, _b, lb) = canary("v1 = 80, v2 = 20", Mode::Json).await;
    let mut first = Vec::new();
    for u in 0..300 {
        let (status, replica, version) =
            send(lb.addr, &body(Some(&format!("user-{u}"))), &[]).await;
        assert_eq!(status, StatusCode::OK);
        let expected = if replica == "a" { "v1" } else { "v2" };
        assert_eq!(version.as_deref(), Some(expected));
        first.push(replica);
    }
    let canary = first.iter().filter(|r| *r == "b").count();
    assert!(
        (33..=87).contains(&canary),
        "canary got {canary} of 300 users"
    );
    // Every user stays on its version, request after request.
    for u in (0..300).step_by(15) {
        for _ in 0..3 {
            let (_, replica, _) = send(lb.addr, &body(Some(&format!("user-{u}"))), &[]).await;
            assert_eq!(replica, first[u], "user-{u} flipped versions");
        }
    }
    let m = metrics_text(lb.admin_addr).await;
    let v2 = metric_value(
        &m,
        "llmlb_version_requests_total",
        &[("version", "v2"), ("status", "200")],
    );
    assert!(v2 >= canary as f64, "{v2}");
    assert!(metric_value(&m, "llmlb_routing_decisions_total", &[("branch", "canary")]) >= 300.0);
    assert!(
        m.contains("llmlb_version_request_duration_seconds_count{pool=\"llama\",version=\"v1\"}")
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn session_and_api_key_are_sticky_when_no_user() {
    let (_a, _b, lb) = canary("v1 = 50, v2 = 50", Mode::Json).await;
    for s in 0..20 {
        let session = format!("conversation-{s}");
        let (_, first, _) = send(lb.addr, &body(None), &[("x-session-id", &session)]).await;
        for _ in 0..3 {
            let (_, r, _) = send(lb.addr, &body(None), &[("x-session-id", &session)]).await;
            assert_eq!(r, first);
        }
        let key = format!("Bearer sk-{s}");
        let (_, first, _) = send(lb.addr, &body(None), &[("authorization", &key)]).await;
        for _ in 0..3 {
            let (_, r, _) = send(lb.addr, &body(None), &[("authorization", &key)]).await;
            assert_eq!(r, first);
        }
    }
    lb.shutdown().await;
}

#[tokio::test]
async fn header_forces_a_version_and_unknown_is_400() {
    // v2 gets no traffic by weight, only when forced.
    let (_a, _b, lb) = canary("v1 = 100, v2 = 0", Mode::Json).await;
    for u in 0..20 {
        let user = format!("u{u}");
        let (_, r, _) = send(lb.addr, &body(Some(&user)), &[]).await;
        assert_eq!(r, "a");
        let (status, r, v) = send(lb.addr, &body(Some(&user)), &[("x-llmlb-version", "v2")]).await;
        assert_eq!(
            (status, r.as_str(), v.as_deref()),
            (StatusCode::OK, "b", Some("v2"))
        );
    }
    let req = {
        let mut r = chat_request("/v1/chat/completions", &body(Some("x")));
        r.headers_mut()
            .insert("x-llmlb-version", "v9".parse().unwrap());
        r
    };
    let (status, _, bytes) = call(lb.addr, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(common::error_code(&bytes), "invalid_request");
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(
            &m,
            r#"llmlb_routing_decisions_total{branch="version_forced"}"#
        ),
        20.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn canary_errors_are_counted_per_version() {
    let (_a, _b, lb) = canary("v1 = 50, v2 = 50", Mode::Status(500)).await;
    for _ in 0..3 {
        let (status, _, _) = send(lb.addr, &body(None), &[("x-llmlb-version", "v2")]).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        let (status, _, _) = send(lb.addr, &body(None), &[("x-llmlb-version", "v1")]).await;
        assert_eq!(status, StatusCode::OK);
    }
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&m, "llmlb_version_errors_total", &[("version", "v2")]),
        3.0
    );
    assert_eq!(
        metric_value(&m, "llmlb_version_errors_total", &[("version", "v1")]),
        0.0
    );
    assert_eq!(
        sample(
            &m,
            r#"llmlb_version_requests_total{version="v1",status="200"}"#
        ),
        3.0
    );
    lb.shutdown().await;
}
