//! The queue cannot be bypassed: the pool is resolved once per request, so
//! the queue that admitted a request is the queue of the pool that serves
//! it, even when the routing inputs change while the request waits.

use std::time::Duration;

use http_body_util::BodyExt;

use crate::common::*;

/// A tier with its own pool overflows into the model's pool while its pool
/// is saturated. A request that overflowed waits in the model pool's queue;
/// while it waits, the tier's pool frees up. It must still be served by the
/// model pool (whose queue admitted it), not re-resolved into the tier's
/// pool, which never admitted it.
#[tokio::test]
async fn a_request_is_served_by_the_pool_whose_queue_admitted_it() {
    let model_replica = Upstream::start("m1", Mode::StreamHeld).await;
    let tier_replica = Upstream::start("d1", Mode::StreamHeld).await;
    let config = format!(
        "[[tiers]]\nname = \"paid\"\npriority = \"high\"\npool = \"dedicated\"\noverflow = true\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n\
         [pools.health]\nenabled = false\n[pools.queue]\ntimeout = \"10s\"\n\
         [[pools.replicas]]\nname = \"m1\"\nurl = \"{}\"\n\
         [[pools]]\nname = \"dedicated\"\nmodels = [\"llama-3-8b-dedicated\"]\n\
         [pools.health]\nenabled = false\n[pools.saturation]\nmax_in_flight = 1\n\
         [[pools.replicas]]\nname = \"d1\"\nurl = \"{}\"\n",
        model_replica.url(),
        tier_replica.url()
    );
    let lb = start_llmlb(&config).await;
    let stream = |tier: Option<&str>| {
        let mut req = chat_request("/v1/chat/completions", CHAT_STREAM);
        if let Some(t) = tier {
            req.headers_mut().insert("x-llmlb-tier", t.parse().unwrap());
        }
        req
    };
    // Saturate the tier's pool and fill the model pool's only slot, each
    // with a stream its replica holds open.
    let mut tier_conn = Conn::open(lb.addr).await;
    let tier_held = tier_conn.send(stream(Some("paid"))).await.into_body();
    until("the tier's stream reaches d1", || {
        tier_replica.requests() == 1
    })
    .await;
    let mut model_conn = Conn::open(lb.addr).await;
    let model_held = model_conn.send(stream(None)).await.into_body();
    until("the open stream reaches m1", || {
        model_replica.requests() == 1
    })
    .await;
    tier_replica.set_mode(Mode::Json);
    model_replica.set_mode(Mode::Json);

    // The paid request overflows into the model pool and waits in its queue.
    let addr = lb.addr;
    let waiting = tokio::spawn(async move {
        let mut req = chat_request("/v1/chat/completions", CHAT);
        req.headers_mut()
            .insert("x-llmlb-tier", "paid".parse().unwrap());
        call(addr, req).await
    });
    until("the paid request waits in the model pool's queue", || {
        queue_depths(&lb).iter().sum::<usize>() == 1
    })
    .await;

    // The tier's pool frees up while it waits...
    tier_replica.release_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), tier_held.collect()).await;
    until("the tier's pool has nothing in flight", || {
        let topology = lb.state.topology();
        !topology.pools()[1].is_saturated()
    })
    .await;
    // ...then the model pool's slot does.
    model_replica.release_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), model_held.collect()).await;

    let (status, _, body) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the queued request is answered")
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        answer["replica"], "m1",
        "served by the pool that admitted it"
    );
    assert_eq!(
        tier_replica.requests(),
        1,
        "the tier's pool got only its own stream"
    );
    drop((tier_conn, model_conn));
    lb.shutdown().await;
}
