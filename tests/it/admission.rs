//! The pool queue and the gateway through a real llmlb: strict priority,
//! aging, bounded overload, cancellation while queued, API keys and rate limits.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;

const PAID_KEY: &str = "sk-paid-0001";
const FREE_KEY: &str = "sk-free-0001";

fn config(upstream: &str, extra_pool: &str, extra: &str) -> String {
    let paid = llmlb::gateway::keys::hash_key(PAID_KEY);
    let free = llmlb::gateway::keys::hash_key(FREE_KEY);
    format!(
        "{extra}\n[[tiers]]\nname = \"paid\"\npriority = \"high\"\n[[tiers]]\nname = \"free\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{paid}\"\ntenant = \"acme\"\ntier = \"paid\"\n\
         [[keys]]\nsha256 = \"{free}\"\ntenant = \"hobby\"\ntier = \"free\"\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n{extra_pool}\n\
         [[pools.replicas]]\nurl = \"{upstream}\"\n"
    )
}

fn tagged(tag: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"llama-3-8b","stream":true,"user":"{tag}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":8}}"#
    );
    let mut b = Request::post("/v1/chat/completions")
        .header("host", "llmlb.test")
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

/// Sends a request in the background; resolves to (status, headers, body).
fn spawn_call(
    addr: std::net::SocketAddr,
    req: Request<Full<Bytes>>,
) -> tokio::task::JoinHandle<(StatusCode, http::HeaderMap, Bytes)> {
    tokio::spawn(async move { call(addr, req).await })
}

fn user_of(seen: &Seen) -> String {
    let v: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    v["user"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn high_priority_is_dispatched_before_earlier_low_priority() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(&up.url(), "", "[gateway]\nauth = true")).await;
    let first = spawn_call(lb.addr, tagged("first", Some(FREE_KEY)));
    until("first dispatched", || up.requests() == 1).await;
    let low_a = spawn_call(lb.addr, tagged("low-a", Some(FREE_KEY)));
    until("low-a queued", || queue_depths(&lb) == vec![0, 1]).await;
    let low_b = spawn_call(lb.addr, tagged("low-b", Some(FREE_KEY)));
    until("low-b queued", || queue_depths(&lb) == vec![0, 2]).await;
    let high = spawn_call(lb.addr, tagged("high", Some(PAID_KEY)));
    until("high queued", || queue_depths(&lb) == vec![1, 2]).await;

    for n in 2..=4 {
        up.release_one();
        until("next dispatched", || up.requests() == n).await;
    }
    up.release_one();
    for h in [first, low_a, low_b, high] {
        let (status, _, body) = h.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
    let order: Vec<String> = up.seen.lock().unwrap().iter().map(user_of).collect();
    assert_eq!(order, vec!["first", "high", "low-a", "low-b"]);
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_tenant_requests_total", &[("tenant", "hobby")]),
        3.0
    );
    assert_eq!(
        metric_value(&text, "llmlb_queue_wait_seconds_count", &[("level", "low")]),
        3.0
    );
    assert!(
        !text.contains(PAID_KEY) && !text.contains(FREE_KEY),
        "keys never reach metrics"
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn max_prefilling_holds_requests_in_the_queue_until_a_first_token() {
    let up = Upstream::start("a", Mode::FirstHeld).await;
    let cfg = config(&up.url(), "max_prefilling = 2", "[gateway]\nauth = true")
        .replace("max_inflight = 1", "max_inflight = 8");
    let lb = start_llmlb(&cfg).await;
    let a = spawn_call(lb.addr, tagged("low-a", Some(FREE_KEY)));
    until("low-a dispatched", || up.requests() == 1).await;
    let b = spawn_call(lb.addr, tagged("low-b", Some(FREE_KEY)));
    until("low-b dispatched", || up.requests() == 2).await;
    // Slots are free (8) but two prompts are before their first token.
    let c = spawn_call(lb.addr, tagged("low-c", Some(FREE_KEY)));
    until("low-c queued", || queue_depths(&lb) == vec![0, 1]).await;
    let high = spawn_call(lb.addr, tagged("high", Some(PAID_KEY)));
    until("high queued", || queue_depths(&lb) == vec![1, 1]).await;
    assert_eq!(up.requests(), 2, "nothing past the prefill bound");
    let (_, text) = admin_get(lb.admin_addr, "/admin/replicas").await;
    let replicas: serde_json::Value = serde_json::from_str(&text).unwrap();
    let r = replica_entry(&replicas, &up.addr.to_string());
    assert_eq!(
        (&r["prefilling"], &r["prefill_limit"]),
        (&2.into(), &2.into()),
        "{r}"
    );

    // low-a's first token frees one prefill slot while low-a still runs:
    // the paid request goes next, then low-c after the next first token.
    up.release_one();
    until("high dispatched", || up.requests() == 3).await;
    assert_eq!(user_of(&up.last_seen()), "high");
    assert_eq!(queue_depths(&lb), vec![0, 1]);
    up.release_one();
    until("low-c dispatched", || up.requests() == 4).await;
    assert_eq!(user_of(&up.last_seen()), "low-c");

    let ends = tokio::spawn({
        let release = up.release.clone();
        let open = up.open_streams.clone();
        async move {
            while open.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                release.notify_one();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    for h in [a, b, c, high] {
        let (status, _, body) = h.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
    ends.await.unwrap();
    lb.shutdown().await;
}

#[tokio::test]
async fn aging_promotes_a_low_request_that_waited_too_long() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(
        &up.url(),
        "[pools.queue]\npromote_after = \"150ms\"",
        // Keys exist: the tier header counts only when trusted.
        "[gateway]\ntrust_tier_header = true",
    ))
    .await;
    let first = spawn_call(lb.addr, tagged("first", None));
    until("first dispatched", || up.requests() == 1).await;
    let low = spawn_call(lb.addr, tagged("low", None));
    until("low queued", || queue_depths(&lb) == vec![0, 1]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut high_req = tagged("high", None);
    high_req
        .headers_mut()
        .insert("x-llmlb-tier", "paid".parse().unwrap());
    let high = spawn_call(lb.addr, high_req);
    until("high queued", || queue_depths(&lb) == vec![1, 1]).await;
    up.release_one();
    until("next dispatched", || up.requests() == 2).await;
    assert_eq!(
        user_of(&up.last_seen()),
        "low",
        "the aged low request goes first"
    );
    up.release_one();
    until("last dispatched", || up.requests() == 3).await;
    up.release_one();
    for h in [first, low, high] {
        assert_eq!(h.await.unwrap().0, StatusCode::OK);
    }
    lb.shutdown().await;
}

#[tokio::test]
async fn overload_ends_every_request_with_a_response_or_a_clean_refusal() {
    let [a, b] = Upstream::many(["a", "b"], Mode::StreamHeld).await;
    let text = config(&a.url(), "[pools.queue]\nmax_depth = 3", "").replace(
        &format!("url = \"{}\"\n", a.url()),
        &format!(
            "url = \"{}\"\n[[pools.replicas]]\nurl = \"{}\"\n",
            a.url(),
            b.url()
        ),
    );
    let lb = start_llmlb(&text).await;
    let sent = 12;
    let calls: Vec<_> = (0..sent)
        .map(|i| spawn_call(lb.addr, tagged(&format!("r{i}"), None)))
        .collect();
    // Capacity 2 (two replicas × max_inflight 1) + 3 queued; the rest are refused at once.
    until("two dispatched, three queued, seven refused", || {
        a.requests() + b.requests() == 2
            && queue_depths(&lb) == vec![0, 3]
            && calls.iter().filter(|c| c.is_finished()).count() == 7
    })
    .await;
    let mut ok = 0;
    let mut refused = 0;
    let mut pending = Vec::new();
    for c in calls {
        if c.is_finished() {
            let (status, headers, body) = c.await.unwrap();
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(error_code(&body), "queue_full");
            let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!(retry >= 1);
            refused += 1;
        } else {
            pending.push(c);
        }
    }
    // Drain: release held streams until every admitted request has finished.
    let drain = async {
        for c in pending {
            while !c.is_finished() {
                a.release_one();
                b.release_one();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (status, _, body) = c.await.unwrap();
            assert_eq!(status, StatusCode::OK);
            assert!(body.ends_with(b"data: [DONE]\n\n"));
            ok += 1;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .unwrap();
    assert_eq!((ok, refused), (5, 7));
    assert_eq!(ok + refused, sent);
    assert_eq!(
        a.requests() + b.requests(),
        5,
        "refused requests never reach a replica"
    );
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_rejections_total", &[("reason", "queue_full")]),
        7.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn client_leaving_the_queue_frees_its_place() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(&up.url(), "[pools.queue]\nmax_depth = 1", "")).await;
    let first = spawn_call(lb.addr, tagged("first", None));
    until("first dispatched", || up.requests() == 1).await;
    let leaver = spawn_call(lb.addr, tagged("leaver", None));
    until("leaver queued", || queue_depths(&lb) == vec![0, 1]).await;
    leaver.abort();
    until("leaver gone from the queue", || {
        queue_depths(&lb) == vec![0, 0]
    })
    .await;
    let next = spawn_call(lb.addr, tagged("next", None));
    until("next queued", || queue_depths(&lb) == vec![0, 1]).await;
    up.release_one();
    until("next dispatched", || up.requests() == 2).await;
    up.release_one();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(next.await.unwrap().0, StatusCode::OK);
    let order: Vec<String> = up.seen.lock().unwrap().iter().map(user_of).collect();
    assert_eq!(order, vec!["first", "next"]);
    lb.shutdown().await;
}

/// On a paused clock: the queue timeout is llmlb's own tokio timer, so the
/// runtime jumps to it as soon as every task waits, instead of sleeping.
#[tokio::test(start_paused = true)]
async fn waiting_past_the_queue_timeout_is_503_with_retry_after() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(&up.url(), "[pools.queue]\ntimeout = \"200ms\"", "")).await;
    let first = spawn_call(lb.addr, tagged("first", None));
    until("first dispatched", || up.requests() == 1).await;
    let (status, headers, body) = call(lb.addr, tagged("late", None)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&body), "queue_timeout");
    assert!(headers.contains_key("retry-after"));
    up.release_one();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(up.requests(), 1);
    lb.shutdown().await;
}

#[tokio::test]
async fn api_keys_are_required_when_auth_is_on() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&config(&up.url(), "", "[gateway]\nauth = true")).await;
    let (status, headers, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&body), "invalid_api_key");
    assert_eq!(headers["www-authenticate"], "Bearer");
    let mut wrong = chat_request("/v1/chat/completions", CHAT);
    wrong
        .headers_mut()
        .insert("authorization", "Bearer sk-paid-0002".parse().unwrap());
    let (status, _, _) = call(lb.addr, wrong).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let mut right = chat_request("/v1/chat/completions", CHAT);
    right
        .headers_mut()
        .insert("x-api-key", PAID_KEY.parse().unwrap());
    let (status, _, _) = call(lb.addr, right).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests(), 1);
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(&text, r#"llmlb_rejections_total{reason="unauthorized"}"#),
        2.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn rate_limit_headers_count_down_and_refuse_with_retry_after() {
    let up = Upstream::start("a", Mode::Json).await;
    let key = llmlb::gateway::keys::hash_key("sk-limited");
    let text = format!(
        "[[tiers]]\nname = \"free\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{key}\"\ntenant = \"t\"\ntier = \"free\"\nrequests_per_minute = 3\ntokens_per_minute = 1000\n\
         {}",
        one_pool("round_robin", &[(&up.url(), 1)], "")
    );
    let lb = start_llmlb(&text).await;
    let body =
        r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":200}"#;
    let send = || {
        let mut r = chat_request("/v1/chat/completions", body);
        r.headers_mut()
            .insert("authorization", "Bearer sk-limited".parse().unwrap());
        call(lb.addr, r)
    };
    let number =
        |h: &http::HeaderMap, name: &str| -> u32 { h[name].to_str().unwrap().parse().unwrap() };
    let mut remaining = Vec::new();
    let mut tokens_left = Vec::new();
    for _ in 0..3 {
        let (status, h, _) = send().await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h["x-ratelimit-limit-requests"], "3");
        assert_eq!(h["x-ratelimit-limit-tokens"], "1000");
        assert!(h.contains_key("x-ratelimit-reset-requests"));
        assert!(h.contains_key("x-ratelimit-reset-tokens"));
        remaining.push(number(&h, "x-ratelimit-remaining-requests"));
        tokens_left.push(number(&h, "x-ratelimit-remaining-tokens"));
    }
    assert_eq!(remaining, vec![2, 1, 0]);
    // Each request is charged its estimate (prompt + max_tokens) up front and
    // settled to the 10 tokens the replica reported when its body ends, so the
    // second request sees the first one's real usage, not its estimate.
    let estimate = 1000 - tokens_left[0];
    assert!(estimate > 200, "{tokens_left:?}");
    // (The bucket refills ~17 tokens a second, hence the small allowance.)
    let near = |got: u32, want: u32| (want..=want + 8).contains(&got);
    assert!(
        near(tokens_left[1], 1000 - 10 - estimate),
        "{tokens_left:?}"
    );
    assert!(
        near(tokens_left[2], 1000 - 20 - estimate),
        "{tokens_left:?}"
    );
    let (status, h, body) = send().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_code(&body), "rate_limit_requests");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(up.requests(), 3);
    lb.shutdown().await;
}

/// A streamed chat with a long system prompt (`system` repeated), tagged
/// `tag` in its `user` field.
fn chat_with(tag: &str, system: &str) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": "llama-3-8b",
        "stream": true,
        "user": tag,
        "messages": [
            {"role": "system", "content": system.repeat(40)},
            {"role": "user", "content": "hi"},
        ],
        "max_tokens": 8,
    });
    Request::post("/v1/chat/completions")
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The order in which a replica receives a queued cold prompt and a later
/// waiter whose prompt it already holds, with the pool's `extra` settings.
async fn order_after_a_warm_request(extra: &str) -> Vec<String> {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let pool =
        format!("{extra}\n[pools.prefix]\nmode = \"cache\"\n[pools.scrape]\nenabled = false");
    let lb = start_llmlb(&config(&up.url(), &pool, "")).await;
    let warm_prompt = "Answer as the support desk of a bicycle shop. ";
    let first = spawn_call(lb.addr, chat_with("first", warm_prompt));
    until("first dispatched", || chats(&up).len() == 1).await;
    let cold = spawn_call(
        lb.addr,
        chat_with("cold", "Translate the menu into French. "),
    );
    until("cold queued", || {
        queue_depths(&lb).iter().sum::<usize>() == 1
    })
    .await;
    let warm = spawn_call(lb.addr, chat_with("warm", warm_prompt));
    until("warm queued", || {
        queue_depths(&lb).iter().sum::<usize>() == 2
    })
    .await;
    for n in 2..=3 {
        up.release_one();
        until("next dispatched", || chats(&up).len() == n).await;
    }
    up.release_one();
    for h in [first, cold, warm] {
        let (status, _, body) = h.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.ends_with(b"data: [DONE]\n\n"),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    lb.shutdown().await;
    chats(&up).iter().map(user_of).collect()
}

/// The chat requests the replica received, in order (the pool's load
/// scrapes left out).
fn chats(up: &Upstream) -> Vec<Seen> {
    let seen = up.seen.lock().unwrap();
    let chat = seen.iter().filter(|s| s.path == "/v1/chat/completions");
    chat.cloned().collect()
}

#[tokio::test]
async fn the_prefix_handoff_gives_a_freed_slot_to_the_waiter_whose_prompt_is_held() {
    let handoff = "[pools.queue]\nprefix_handoff = \"30s\"";
    assert_eq!(
        order_after_a_warm_request(handoff).await,
        ["first", "warm", "cold"]
    );
    // Without it the oldest waiter goes first, wherever its prompt is.
    assert_eq!(
        order_after_a_warm_request("").await,
        ["first", "cold", "warm"]
    );
}
