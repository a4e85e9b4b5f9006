//! One request's scope through a real llmlb on loopback: the pool's
//! `max_pending` count, the queue slot, the canary version record, the
//! token settlement and the per-model record (the access log's end) are
//! each settled exactly once, whether the answer ends or the client goes
//! away in the middle of it.

use crate::common;

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};

const KEY: &str = "sk-scope-0001";

fn config(upstream: &str) -> String {
    let key = llmlb::gateway::keys::hash_key(KEY);
    format!(
        "[gateway]\nauth = true\n\
         [[tiers]]\nname = \"free\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{key}\"\ntenant = \"t\"\ntier = \"free\"\ntokens_per_minute = 100000\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\nmax_pending = 4\n\
         [pools.canary]\nweights = {{ v1 = 100 }}\n\
         [[pools.replicas]]\nurl = \"{upstream}\"\nname = \"a\"\nversion = \"v1\"\n"
    )
}

fn keyed(body: &str) -> Request<Full<Bytes>> {
    let mut req = chat_request("/v1/chat/completions", body);
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    req
}

/// What the scope's items have left behind, read from the proxy.
#[derive(Debug, PartialEq)]
struct Settled {
    pending: u64,
    queue_active: usize,
    version_records: f64,
    model_records: f64,
    tenant_tokens: f64,
}

async fn settled(lb: &llmlb::daemon::Running) -> Settled {
    let text = metrics_text(lb.admin_addr).await;
    let queue = lb.state.topology().pools()[0]
        .admission
        .as_ref()
        .expect("the pool queues")
        .queue
        .active();
    Settled {
        pending: lb.state.pending.get("llama").expect("a gate").pending(),
        queue_active: queue,
        version_records: metric_value(&text, "llmlb_version_requests_total", &[("version", "v1")]),
        model_records: metric_value(&text, "llmlb_model_requests_total", &[("pool", "llama")]),
        tenant_tokens: metric_value(&text, "llmlb_tenant_tokens_total", &[("tenant", "t")]),
    }
}

async fn released(lb: &llmlb::daemon::Running) {
    let gate = lb.state.pending.get("llama").expect("a gate");
    let queue = &lb.state.topology().pools()[0]
        .admission
        .as_ref()
        .expect("the pool queues")
        .queue
        .clone();
    until("the scope is released", || {
        gate.pending() == 0 && queue.active() == 0
    })
    .await;
}

#[tokio::test]
async fn each_scope_item_settles_once_on_early_drop_and_on_end() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(&up.url())).await;

    // A stream in the middle of its answer holds every item, settled none.
    let mut conn = Conn::open(lb.addr).await;
    let resp = conn.send(keyed(CHAT_STREAM)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-llmlb-version"], "v1");
    let mut body = resp.into_body();
    body.frame()
        .await
        .expect("a first chunk")
        .expect("it reads");
    let held = settled(&lb).await;
    assert_eq!((held.pending, held.queue_active), (1, 1), "{held:?}");
    assert_eq!(held.version_records, 0.0);
    assert_eq!(held.model_records, 0.0);
    assert_eq!(held.tenant_tokens, 0.0);

    // The client goes away: everything is released and recorded once; the
    // charge stays at its estimate (the replica reported no usage).
    drop(body);
    conn.close();
    up.wait_closed(1, std::time::Duration::from_secs(10)).await;
    released(&lb).await;
    let dropped = settled(&lb).await;
    assert_eq!(dropped.version_records, 1.0, "{dropped:?}");
    assert_eq!(dropped.model_records, 1.0, "{dropped:?}");
    let estimate = dropped.tenant_tokens;
    assert!(estimate > 0.0, "the estimate is counted: {dropped:?}");

    // A stream that ends: the same, once more.
    let mut conn = Conn::open(lb.addr).await;
    let resp = conn.send(keyed(CHAT_STREAM)).await;
    let mut body = resp.into_body();
    body.frame()
        .await
        .expect("a first chunk")
        .expect("it reads");
    finish_stream(&up, body, "the second stream").await;
    released(&lb).await;
    let ended = settled(&lb).await;
    assert_eq!(ended.version_records, 2.0, "{ended:?}");
    assert_eq!(ended.model_records, 2.0, "{ended:?}");
    assert_eq!(ended.tenant_tokens, 2.0 * estimate, "{ended:?}");

    // A JSON answer reports usage (10 tokens): the charge is settled with
    // it. The counts, read after this third request, show that neither
    // earlier body settled again when it was finally dropped.
    up.set_mode(Mode::Json);
    let (status, _, _) = call(lb.addr, keyed(CHAT)).await;
    assert_eq!(status, 200);
    released(&lb).await;
    let json = settled(&lb).await;
    assert_eq!(
        json,
        Settled {
            pending: 0,
            queue_active: 0,
            version_records: 3.0,
            model_records: 3.0,
            tenant_tokens: 2.0 * estimate + 10.0,
        }
    );
    drop(conn);
    lb.shutdown().await;
}
