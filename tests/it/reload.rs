//! Hot reload: a bad file changes nothing; a good one swaps the topology
//! without dropping running streams or queued requests.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

fn post(path: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::post(path).header("host", "admin");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

async fn start_from(file: &TempFile) -> llmlb::daemon::Running {
    let text = std::fs::read_to_string(&file.path).unwrap();
    let lb = start_llmlb(&text).await;
    lb.state.config_path.set(file.path.clone()).unwrap();
    lb
}

#[tokio::test]
async fn invalid_config_is_rejected_and_the_old_one_keeps_serving() {
    let up = Upstream::start("a", Mode::Json).await;
    let file = TempFile::config(
        "bad-reload",
        &one_pool("round_robin", &[(&up.url(), 1)], ""),
    );
    let lb = start_from(&file).await;
    file.write(&one_pool("round_robin", &[("ftp://nowhere", 0)], ""));
    let (status, _, body) = call(lb.admin_addr, post("/admin/reload", None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_config");
    let keys = strings_of(&v, "issues", "key");
    assert_eq!(
        keys,
        vec!["pools[0].replicas[0].url", "pools[0].replicas[0].weight"]
    );
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::OK, "the old config stays in force");
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(&text, r#"llmlb_config_reloads_total{result="failure"}"#),
        1.0
    );
    assert_eq!(
        metric_value(&text, "llmlb_config_last_reload_successful", &[]),
        0.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn valid_reload_moves_new_work_and_lets_running_streams_finish() {
    let [a, b, c] = Upstream::many(["a", "b", "c"], Mode::StreamHeld).await;
    let file = TempFile::config(
        "good-reload",
        &one_pool("least_connections", &[(&a.url(), 1), (&b.url(), 1)], ""),
    );
    let lb = start_from(&file).await;
    let old_b = lb.state.topology().pools()[0].replicas[1].clone();

    // A stream running on each replica.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(held_stream(lb.addr).await);
    }
    assert_eq!((a.requests(), b.requests()), (1, 1));

    // Remove a, keep b, add c.
    file.write(&one_pool(
        "least_connections",
        &[(&b.url(), 1), (&c.url(), 1)],
        "",
    ));
    let (status, _, body) = call(lb.admin_addr, post("/admin/reload", None)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["summary"]["kept_replicas"], 1);

    let topo = lb.state.topology();
    let kept_b = topo.pools()[0]
        .replicas
        .iter()
        .find(|r| r.name == b.addr.to_string())
        .unwrap();
    assert_eq!(kept_b.id, old_b.id, "b keeps its state");
    assert_eq!(kept_b.in_flight(), 1, "b's running stream is still counted");

    // New work: c (0 open) first, then b/c; never the removed a.
    for _ in 0..3 {
        let (status, _, _) = {
            let (conn, resp) = open_stream(lb.addr).await;
            let status = resp.status();
            let mut body = resp.into_body();
            body.frame().await.unwrap().unwrap();
            held.push((conn, body));
            (status, (), ())
        };
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(a.requests(), 1, "a removed: nothing new reaches it");
    assert_eq!(b.requests() + c.requests(), 4);

    // The streams started before the reload complete normally.
    for _ in 0..held.len() {
        a.release_one();
        b.release_one();
        c.release_one();
    }
    let (_, first_body) = held.remove(0);
    let rest = first_body.collect().await.unwrap().to_bytes();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    drop(held);
    lb.shutdown().await;
}

#[tokio::test]
async fn queued_requests_survive_a_reload_and_use_new_capacity() {
    let [a, b] = Upstream::many(["a", "b"], Mode::StreamHeld).await;
    let cfg = |urls: &[&str]| {
        let mut s = "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n"
            .to_string();
        for u in urls {
            s.push_str(&format!("[[pools.replicas]]\nurl = \"{u}\"\n"));
        }
        s
    };
    let file = TempFile::config("queue-reload", &cfg(&[&a.url()]));
    let lb = start_from(&file).await;
    let addr = lb.addr;
    let first =
        tokio::spawn(
            async move { call(addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await },
        );
    until("first dispatched", || a.requests() == 1).await;
    let queued =
        tokio::spawn(
            async move { call(addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await },
        );
    until("second queued", || queue_depths(&lb) == vec![0, 1]).await;

    file.write(&cfg(&[&a.url(), &b.url()]));
    let (status, _, _) = call(lb.admin_addr, post("/admin/reload", None)).await;
    assert_eq!(status, StatusCode::OK);
    // The kept queue sees the new capacity at once and dispatches the waiter to b.
    until("queued request dispatched to the new replica", || {
        b.requests() == 1
    })
    .await;
    assert_eq!(queue_depths(&lb), vec![0, 0]);
    a.release_one();
    b.release_one();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(queued.await.unwrap().0, StatusCode::OK);
    lb.shutdown().await;
}

#[tokio::test]
async fn admin_token_guards_mutating_endpoints() {
    let up = Upstream::start("a", Mode::Json).await;
    let text = format!(
        "[server]\nadmin_token = \"s3cret\"\n{}",
        one_pool("round_robin", &[(&up.url(), 1)], "")
    );
    let file = TempFile::config("admin-token", &text);
    let lb = start_from(&file).await;
    let (status, _, body) = call(lb.admin_addr, post("/admin/reload", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&body), "invalid_admin_token");
    let (status, _, _) = call(lb.admin_addr, post("/admin/reload", Some("wrong"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(lb.admin_addr, post("/admin/reload", Some("s3cret"))).await;
    assert_eq!(status, StatusCode::OK);
    lb.shutdown().await;
}

/// Model ids listed by `GET /v1/models`.
async fn model_ids(addr: std::net::SocketAddr) -> Vec<String> {
    let req = get_request("/v1/models", "x");
    let (_, _, body) = call(addr, req).await;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    strings_of(&v, "data", "id")
        .into_iter()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn serve_reloads_on_file_change_and_on_sighup() {
    let up = Upstream::start("a", Mode::Json).await;
    let cfg = |model: &str, watch: &str| {
        let pool = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"{model}\"]\n[[pools.replicas]]\nurl = \"{}\"\n",
            up.url()
        );
        serve_config(&format!("watch_interval = \"{watch}\""), &pool)
    };
    let file = TempFile::config("serve-reload", &cfg("m1", "50ms"));
    let mut served = ServeProcess::start(&file.path, &[]);
    let addr = served.addr;
    assert_eq!(model_ids(addr).await, vec!["m1"]);

    // A change of the file is picked up by the watcher.
    file.write(&cfg("m2", "0s"));
    until_async("file change reloaded", Duration::from_secs(5), async || {
        model_ids(addr).await == ["m2"]
    })
    .await;

    // Watching is now off ("0s" applies at the next start), so SIGHUP it is.
    file.write(&cfg("m3", "0s"));
    served.signal("-HUP");
    until_async("SIGHUP reloaded", Duration::from_secs(5), async || {
        model_ids(addr).await == ["m3"]
    })
    .await;

    let status = served.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn reload_applies_max_pending_live_and_names_listener_limits_needing_a_restart() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let pool = |extra: &str| one_pool("round_robin", &[(&up.url(), 1)], extra);
    let file = TempFile::config("limits", &pool("max_pending = 1"));
    let lb = start_from(&file).await;
    let (_c, held) = held_stream(lb.addr).await;
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 503);
    assert_eq!(error_code(&body), "pool_overloaded");

    file.write(&format!(
        "[server]\nmax_connections = 7\n{}",
        pool("max_pending = 2")
    ));
    let (status, _, body) = call(lb.admin_addr, post("/admin/reload", None)).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["summary"]["needs_restart"],
        serde_json::json!(["server.max_connections"])
    );
    // The held stream still counts; the new limit leaves room for one more.
    let (_c2, resp) = open_stream(lb.addr).await;
    assert_eq!(resp.status(), 200);
    let mut held2 = resp.into_body();
    held2.frame().await.unwrap().unwrap();
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 503, "two pending: the kept count and the new one");
    assert_eq!(error_code(&body), "pool_overloaded");
    up.release_one();
    up.release_one();
    held.collect().await.unwrap();
    held2.collect().await.unwrap();
    lb.shutdown().await;
}

/// A SIGHUP (here: the reload it triggers) after an edit loads the file
/// once; the watcher, seeing the same new content, does not load it again.
#[tokio::test]
async fn a_signalled_reload_is_not_repeated_by_the_file_watcher() {
    let up = Upstream::start("a", Mode::Json).await;
    let pool = |model: &str| {
        format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"{model}\"]\n[[pools.replicas]]\nurl = \"{}\"\n",
            up.url()
        )
    };
    let file = TempFile::config("hup-once", &pool("m1"));
    let lb = start_from(&file).await;
    let started_with = std::fs::read(&file.path).unwrap();
    file.write(&pool("m2"));
    llmlb::server::reload::reload(&lb.state, None).unwrap();
    let reloads = |state: &llmlb::server::AppState| {
        metric_value(
            &state.metrics.render(),
            "llmlb_config_reloads_total",
            &[("result", "success")],
        )
    };
    assert_eq!(reloads(&lb.state), 1.0);
    // A watcher that last saw the original file finds m2 on disk at its
    // first tick: already loaded, so it does nothing.
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(llmlb::server::reload::watch_file(
        lb.state.clone(),
        file.path.clone(),
        Some(started_with),
        Duration::from_millis(10),
        stop_rx,
    ));
    // Give it some ticks with m2 on disk (a reload there would be counted
    // below; on a machine too slow to tick, the check is merely weaker).
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A later edit is still picked up, and is the only other reload.
    file.write(&pool("m3"));
    until("the watcher loads m3", || {
        lb.state.topology().models().any(|(m, _)| m == "m3")
    })
    .await;
    assert_eq!(reloads(&lb.state), 2.0, "m2 was not loaded a second time");
    stop.send(true).unwrap();
    watcher.await.unwrap();
}

/// Reloads and discovery rebuilds racing each other: every generation a
/// reader loads pairs a config with the topology built from that config, and
/// the last reload's config is the one left in force (bounded loops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_and_topology_always_come_from_one_generation() {
    let config = |pool: &str| {
        llmlb::config::parse(&format!(
            "[[pools]]\nname = \"{pool}\"\nmodels = [\"m\"]\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:9\"\n"
        ))
        .unwrap()
    };
    let state = llmlb::server::AppState::new(config("p0"));
    let mismatches = std::sync::atomic::AtomicUsize::new(0);
    let reads = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=200 {
                llmlb::server::reload::apply(&state, config(&format!("p{i}")));
            }
        });
        s.spawn(|| {
            for _ in 0..200 {
                llmlb::server::reload::rebuild(&state);
            }
        });
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let g = state.generation();
                if g.topology.pools()[0].name != g.config.pools[0].name {
                    mismatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        // Writers end after their bounded loops; then stop the reader.
        s.spawn(|| {
            while state.generation().config.pools[0].name != "p200" {
                std::thread::yield_now();
            }
            // Let the rebuilder finish too before stopping the reader.
            std::thread::sleep(Duration::from_millis(50));
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    });
    assert!(reads.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(mismatches.load(std::sync::atomic::Ordering::Relaxed), 0);
    let g = state.generation();
    assert_eq!(g.config.pools[0].name, "p200");
    assert_eq!(g.topology.pools()[0].name, "p200");
}
