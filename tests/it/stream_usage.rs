//! Streams report their token count: llmlb asks a stream for `usage`
//! (`stream_options.include_usage`) when the client did not, takes the
//! output tokens from it (settlement, least_tokens, per-model metrics) and
//! keeps that extra event from the client. A replica here packs three
//! tokens into each SSE event, so counting events would be wrong.

use crate::common;
use crate::sim_support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};

const KEY: &str = "sk-usage-0001";
/// Two events of three tokens each; the usage the replica reports.
const EVENTS: [&str; 2] = [
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one two three\"}}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" four five six\"}}]}\n\n",
];
/// [`EVENTS`] as servers that follow OpenAI's API send them once usage is
/// asked for: each with `"usage":null` (vLLM leaves the key out).
const NULL_EVENTS: [&str; 2] = [
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one two three\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" four five six\"}}],\"usage\":null}\n\n",
];
const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":6,\"total_tokens\":17}}\n\n";
const DONE: &str = "data: [DONE]\n\n";
/// [`EVENTS`] as `continuous_usage_stats` sends them: each with the usage
/// so far (3, then 6 output tokens).
const CONTINUOUS: &str = concat!(
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one two three\"}}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3,\"total_tokens\":14}}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" four five six\"}}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":6,\"total_tokens\":17}}\n\n",
);
const STREAM: &str = r#"{"model":"llama-3-8b", "stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":100}"#;

/// A replica that streams [`EVENTS`] ([`NULL_EVENTS`] when asked for
/// usage by a request with an `x-openai-form` header), then [`USAGE`] when
/// asked for it (or [`CONTINUOUS`] alone when asked for
/// `continuous_usage_stats`), then waits for a permit before `[DONE]`; it
/// records the bodies it got.
struct Packer {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    done: Arc<Semaphore>,
}

impl Packer {
    async fn start(held: bool) -> Packer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
        let done = Arc::new(Semaphore::new(if held { 0 } else { 1000 }));
        let (b, d) = (bodies.clone(), done.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (b, d) = (b.clone(), d.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (b, d) = (b.clone(), d.clone());
                        async move { Ok::<_, Infallible>(answer(req, b, d).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Packer { addr, bodies, done }
    }

    fn body(&self, i: usize) -> Bytes {
        self.bodies.lock().unwrap()[i].clone()
    }

    fn count(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }
}

async fn answer(
    req: Request<Incoming>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    done: Arc<Semaphore>,
) -> Response<ChannelBody> {
    if req.method() != http::Method::POST {
        // llmlb's own probes (model lists, metrics): nothing this replica serves.
        let mut resp = Response::new(ChannelBody::Fixed(None));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return resp;
    }
    let openai_form = req.headers().contains_key("x-openai-form");
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let usage = v["stream_options"]["include_usage"] == true;
    let continuous = v["stream_options"]["continuous_usage_stats"] == true;
    bodies.lock().unwrap().push(body);
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        if continuous {
            // Both events in one frame, each with the usage so far.
            let _ = tx.send(Bytes::from_static(CONTINUOUS.as_bytes())).await;
        } else {
            let events = if usage && openai_form {
                NULL_EVENTS
            } else {
                EVENTS
            };
            for e in events {
                let _ = tx.send(Bytes::from_static(e.as_bytes())).await;
            }
        }
        if usage && !continuous {
            let _ = tx.send(Bytes::from_static(USAGE.as_bytes())).await;
        }
        if let Ok(p) = done.acquire().await {
            p.forget();
        }
        let _ = tx.send(Bytes::from_static(DONE.as_bytes())).await;
    });
    let mut resp = Response::new(ChannelBody::Channel(rx));
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

fn config(url: &str, pool_extra: &str) -> String {
    let digest = llmlb::gateway::keys::hash_key(KEY);
    format!(
        "[gateway]\nauth = true\n[[tiers]]\nname = \"t\"\npriority = \"high\"\n\
         [[keys]]\nsha256 = \"{digest}\"\ntenant = \"acme\"\ntier = \"t\"\ntokens_per_minute = 100000\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"least_tokens\"\n{pool_extra}\n\
         [[pools.replicas]]\nurl = \"{url}\"\n"
    )
}

fn keyed(body: &str) -> Request<Full<Bytes>> {
    let mut req = chat_request("/v1/chat/completions", body);
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    req
}

async fn counters(lb: &llmlb::daemon::Running) -> (f64, f64) {
    let text = metrics_text(lb.admin_addr).await;
    (
        sample(&text, "llmlb_tenant_tokens_total{tenant=\"acme\"}"),
        metric_value(
            &text,
            "llmlb_model_tokens_total",
            &[("model", "llama-3-8b"), ("kind", "completion")],
        ),
    )
}

#[tokio::test]
async fn a_stream_is_asked_for_usage_and_the_client_does_not_see_it() {
    let up = Packer::start(false).await;
    let lb = start_llmlb(&config(&format!("http://{}", up.addr), "")).await;
    let (status, _, text) = call(lb.addr, keyed(STREAM)).await;
    assert_eq!(status, 200);
    // The client's stream, byte for byte, without the usage event.
    assert_eq!(text, format!("{}{}{DONE}", EVENTS[0], EVENTS[1]));
    // The replica got the client's bytes with the option in front.
    let sent = String::from_utf8(up.body(0).to_vec()).unwrap();
    assert_eq!(
        sent,
        format!(
            "{{\"stream_options\":{{\"include_usage\":true}},{}",
            &STREAM[1..]
        )
    );
    // Settled and counted from usage: 17 tokens, 6 of them output (two
    // events would have said 2).
    let (tenant, completion) = counters(&lb).await;
    assert_eq!((tenant, completion), (17.0, 6.0));
}

/// A server in OpenAI's form puts `"usage":null` in every event: those
/// reach the client byte for byte, the usage event llmlb asked for does
/// not, and its counts are taken.
#[tokio::test]
async fn null_usage_in_every_event_passes_and_the_usage_event_does_not() {
    let up = Packer::start(false).await;
    let lb = start_llmlb(&config(&format!("http://{}", up.addr), "")).await;
    let mut req = keyed(STREAM);
    req.headers_mut()
        .insert("x-openai-form", "1".parse().unwrap());
    let (status, _, text) = call(lb.addr, req).await;
    assert_eq!(status, 200);
    assert_eq!(text, format!("{}{}{DONE}", NULL_EVENTS[0], NULL_EVENTS[1]));
    let (tenant, completion) = counters(&lb).await;
    assert_eq!((tenant, completion), (17.0, 6.0));
}

#[tokio::test]
async fn a_client_that_asked_for_usage_gets_it_once() {
    let up = Packer::start(false).await;
    let lb = start_llmlb(&config(&format!("http://{}", up.addr), "")).await;
    let asked = STREAM.replace(
        "\"max_tokens\":100",
        "\"max_tokens\":100,\"stream_options\":{\"include_usage\":true}",
    );
    let (status, _, text) = call(lb.addr, keyed(&asked)).await;
    assert_eq!(status, 200);
    assert_eq!(text, format!("{}{}{USAGE}{DONE}", EVENTS[0], EVENTS[1]));
    assert_eq!(up.body(0), asked.as_bytes(), "forwarded as sent");
    assert_eq!(counters(&lb).await, (17.0, 6.0));
}

#[tokio::test]
async fn least_tokens_releases_the_reported_output_tokens() {
    let up = Packer::start(true).await;
    let lb = start_llmlb(&config(&format!("http://{}", up.addr), "")).await;
    let held = tokio::spawn(call(lb.addr, keyed(STREAM)));
    until("stream open", || up.count() == 1).await;
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    // max_tokens 100, prompt prefilled, 6 tokens streamed (by usage; the
    // two events alone would leave 98).
    until("usage read", || replica.outstanding_tokens() == 94).await;
    up.done.add_permits(1);
    let (status, _, text) = held.await.unwrap();
    assert_eq!(status, 200);
    assert!(!String::from_utf8_lossy(&text).contains("usage"));
    assert_eq!(replica.outstanding_tokens(), 0);
}

/// A frame of several events, each with the usage so far: the balancer
/// takes the last count (6), not the first (3).
#[tokio::test]
async fn least_tokens_takes_the_last_usage_in_a_frame() {
    let up = Packer::start(true).await;
    let lb = start_llmlb(&config(&format!("http://{}", up.addr), "")).await;
    let asked = STREAM.replace(
        "\"max_tokens\":100",
        "\"max_tokens\":100,\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}",
    );
    let held = tokio::spawn(call(lb.addr, keyed(&asked)));
    until("stream open", || up.count() == 1).await;
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    until("usage read", || replica.outstanding_tokens() == 94).await;
    up.done.add_permits(1);
    let (status, _, text) = held.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(text, format!("{CONTINUOUS}{DONE}"));
    assert_eq!(replica.outstanding_tokens(), 0);
}

#[tokio::test]
async fn stream_usage_off_forwards_the_body_as_sent() {
    let up = Packer::start(false).await;
    let lb = start_llmlb(&config(
        &format!("http://{}", up.addr),
        "stream_usage = false",
    ))
    .await;
    let (status, _, text) = call(lb.addr, keyed(STREAM)).await;
    assert_eq!(status, 200);
    assert_eq!(up.body(0), STREAM.as_bytes());
    assert_eq!(text, format!("{}{}{DONE}", EVENTS[0], EVENTS[1]));
    // No usage: nothing reported per model, the charge stays at its
    // estimate (more than the 17 the replica would have reported).
    let (tenant, completion) = counters(&lb).await;
    assert_eq!(completion, 0.0);
    assert!(tenant > 100.0, "{tenant}");
}

#[tokio::test]
async fn the_simulator_reports_usage_that_the_client_never_sees() {
    let mut replica = sim_support::fast();
    replica.model = "llama-3-8b".into();
    let sim = sim_support::start(replica).await;
    let lb = start_llmlb(&config(&format!("http://{}", sim.addr), "")).await;
    let body = r#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"count to ten"}],"max_tokens":12}"#;
    let (status, _, text) = call(lb.addr, keyed(body)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(text.ends_with(DONE), "{text}");
    let events = sim_support::sse_events(&text);
    assert!(!events.is_empty());
    assert!(
        events
            .iter()
            .all(|e| e.get("usage").is_none_or(|u| u.is_null())),
        "{text}"
    );
    // llmlb still has the replica's own count.
    let (tenant, completion) = counters(&lb).await;
    assert!((1.0..=12.0).contains(&completion), "{completion}");
    assert!(tenant > completion, "{tenant}");
}

/// A replica that does not know `stream_options` answers 400 to it: the
/// same replica gets the client's body as sent, the client its answer, and
/// later streams go to that replica without the field. A client whose own
/// `stream_options` the replica refuses gets the 400.
#[tokio::test]
async fn a_replica_that_refuses_stream_options_gets_the_body_as_sent() {
    let (up, lb) = one_replica(Mode::NoStreamOptions, "", "").await;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::OK);
    let seen: Vec<String> = up
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].contains("stream_options"));
    assert_eq!(seen[1], CHAT_STREAM, "the second try is the client's bytes");

    // Noted: the next stream goes without the field, in one request.
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests(), 3);
    assert_eq!(String::from_utf8_lossy(&up.last_seen().body), CHAT_STREAM);

    // The client's own field is the client's business: its 400 comes back.
    let asked = r#"{"model":"llama-3-8b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", asked)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(up.requests(), 4);
    lb.shutdown().await;
}

/// A 400 for another reason is not the field's fault: the replica gets the
/// client's body once more, the client the second 400, and the field is
/// still added to later streams.
#[tokio::test]
async fn a_bad_stream_gets_its_400_and_the_field_stays() {
    let (up, lb) = one_replica(Mode::Status(400), "", "").await;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(up.requests(), 2);
    up.set_mode(Mode::Json);
    call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert!(String::from_utf8_lossy(&up.last_seen().body).contains("stream_options"));
    lb.shutdown().await;
}

/// A replica that took the field answers a later stream with a 400: that
/// one is the client's, sent once (no copy of the headers was kept for a
/// second send), and the stream after it is re-sent without the field
/// again when it gets a 400.
#[tokio::test]
async fn a_400_from_a_replica_that_took_the_field_goes_to_the_client() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests(), 1);
    up.set_mode(Mode::Status(400));
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(up.requests(), 2, "sent once");
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT_STREAM)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(up.requests(), 4, "sent again as the client sent it");
    assert_eq!(String::from_utf8_lossy(&up.last_seen().body), CHAT_STREAM);
    lb.shutdown().await;
}
