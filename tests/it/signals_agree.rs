//! Every signal tells the same story: a few hundred requests through a real
//! `llmlb serve` process in front of simulated replicas (one of them an
//! address that refuses connections) with faults injected per request
//! (`x-sim-fault`: 500, reset before the head, a body cut short, a stall
//! past `first_byte`, a slow body, one past the idle timeout), clients that
//! stream or not and leave at a random point or never, and a short queue
//! that refuses some. For every request the client's view, its access-log
//! line (JSON, joined by request id) and its trace span must agree, and the
//! metric totals must add up to the lines, and the lines to the requests.
//!
//! The mix is drawn from a seed, printed with the mix; replay a failure
//! with `LLMLB_AGREE_SEED=<seed>` (and `LLMLB_AGREE_REQUESTS=<n>`, default
//! 300).

use crate::common;
use crate::sim_support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// What a request asks its replica to do wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    None,
    /// 500 before any work.
    Error,
    /// The connection closes without a response head.
    Reset,
    /// The head and the first bytes, then the connection closes.
    Break(u32),
    /// No answer: llmlb's `first_byte` runs out.
    Stall,
    /// A wait before each body frame, under the idle timeout.
    Slow,
    /// A wait before each body frame, past the idle timeout.
    Idle,
}

impl Fault {
    fn header(self) -> String {
        match self {
            Fault::None => String::new(),
            Fault::Error => "error".into(),
            Fault::Reset => "reset".into(),
            Fault::Break(n) => format!("break={n}"),
            Fault::Stall => "stall".into(),
            Fault::Slow => "slow=15".into(),
            Fault::Idle => "slow=1500".into(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Error => "error",
            Fault::Reset => "reset",
            Fault::Break(_) => "break",
            Fault::Stall => "stall",
            Fault::Slow => "slow",
            Fault::Idle => "idle",
        }
    }

    /// The outcomes a request with this fault may end in when its client
    /// stays (besides being refused by the queue or the pool).
    fn expected(self) -> &'static [&'static str] {
        match self {
            Fault::None | Fault::Error | Fault::Slow => &["complete"],
            Fault::Reset => &["upstream_error"],
            Fault::Break(_) | Fault::Idle => &["stream_error"],
            Fault::Stall => &["timeout"],
        }
    }
}

/// When the client gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    Never,
    /// After this long, whatever it has by then.
    After(Duration),
    /// After this many body frames.
    AfterFrames(u32),
}

impl Leave {
    fn name(self) -> &'static str {
        match self {
            Leave::Never => "stays",
            Leave::After(_) => "leaves_after_time",
            Leave::AfterFrames(_) => "leaves_mid_body",
        }
    }
}

#[derive(Debug, Clone)]
struct Plan {
    id: String,
    stream: bool,
    max_tokens: u32,
    fault: Fault,
    leave: Leave,
}

/// What the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// It left before the response head.
    LeftBeforeHead,
    /// A head with this status, then: the body read to its end (`cut`:
    /// it ended in an error, or carried an SSE error event), or the client
    /// left first.
    Answer {
        status: u16,
        whole: bool,
        cut: bool,
        error_code: Option<String>,
    },
}

fn draw(rng: &mut rand::rngs::StdRng, i: usize, seed: u64) -> Plan {
    let fault = match rng.random_range(0..100) {
        0..45 => Fault::None,
        45..53 => Fault::Error,
        53..61 => Fault::Reset,
        61..71 => Fault::Break(rng.random_range(1..120)),
        71..77 => Fault::Stall,
        77..90 => Fault::Slow,
        _ => Fault::Idle,
    };
    let leave = match rng.random_range(0..100) {
        0..75 => Leave::Never,
        75..88 => Leave::After(Duration::from_millis(rng.random_range(0..1200))),
        _ => Leave::AfterFrames(rng.random_range(1..4)),
    };
    Plan {
        id: format!("agree-{seed}-{i}"),
        stream: rng.random_bool(0.5),
        max_tokens: rng.random_range(8..24),
        fault,
        leave,
    }
}

/// Sends `plan` on a connection of its own and reports what came back.
async fn run(addr: std::net::SocketAddr, plan: Plan) -> Seen {
    let body = json!({"model": "llmlb-sim", "messages": [{"role": "user", "content": "tell me"}],
                      "max_tokens": plan.max_tokens, "stream": plan.stream});
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        .header("x-request-id", &plan.id)
        .header("x-sim-fault", plan.fault.header())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let deadline = match plan.leave {
        Leave::After(d) => tokio::time::Instant::now() + d,
        _ => tokio::time::Instant::now() + Duration::from_secs(20),
    };
    let mut conn = Conn::open(addr).await;
    let Ok(resp) = tokio::time::timeout_at(deadline, conn.send(req)).await else {
        conn.close();
        return Seen::LeftBeforeHead;
    };
    let status = resp.status().as_u16();
    if status == 429 {
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut body = resp.into_body();
    let (mut bytes, mut frames, mut cut, mut whole) = (Vec::new(), 0u32, false, false);
    loop {
        if let Leave::AfterFrames(n) = plan.leave
            && frames >= n
        {
            break;
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => break,
            Ok(None) => {
                whole = true;
                break;
            }
            Ok(Some(Err(_))) => {
                cut = true;
                whole = true;
                break;
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                    frames += 1;
                }
            }
        }
    }
    drop(body);
    conn.close();
    let text = String::from_utf8_lossy(&bytes);
    if plan.stream && status == 200 && text.contains("\"error\"") {
        cut = true;
    }
    let error_code = (status >= 400)
        .then(|| serde_json::from_str::<Value>(&text).ok())
        .flatten()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
    Seen::Answer {
        status,
        whole,
        cut,
        error_code,
    }
}

fn attr(span: &Value, key: &str) -> Option<String> {
    common::attr(span, key)
}

/// The `status` label the counters should carry for an access line.
fn label(line: &Value) -> String {
    match line["outcome"].as_str().unwrap() {
        "stream_error" => "stream_error".into(),
        "client_closed" | "client_closed_midstream" => "499".into(),
        _ => line["status"].to_string(),
    }
}

/// Checks one request; the problems found, in words.
fn check(plan: &Plan, seen: &Seen, line: &Value, span: Option<&Value>) -> Vec<String> {
    let mut bad = Vec::new();
    let outcome = line["outcome"].as_str().unwrap_or("");
    let status = line["status"].as_u64().unwrap_or(0) as u16;
    let mut want = |ok: bool, what: String| {
        if !ok {
            bad.push(what);
        }
    };
    match seen {
        Seen::LeftBeforeHead => {
            // llmlb may have answered just as the client left.
            if outcome == "client_closed" {
                want(status == 499, format!("client_closed with status {status}"));
            }
        }
        Seen::Answer {
            status: got,
            whole,
            cut,
            error_code,
        } => {
            want(
                *got == status,
                format!("client saw {got}, log says {status}"),
            );
            if !*whole {
                // The client left during the body.
                let ok = ["client_closed_midstream", "complete", "stream_error"];
                want(
                    ok.contains(&outcome) || line["error"].is_string(),
                    format!("left mid-body, logged {outcome}"),
                );
            } else if *cut {
                want(
                    outcome == "stream_error",
                    format!("client saw a broken body, logged {outcome}"),
                );
            } else {
                let refused = outcome == "refused";
                let expected = plan.fault.expected();
                want(
                    refused || expected.contains(&outcome),
                    format!(
                        "fault {:?} ended {outcome}, expected {expected:?} or refused",
                        plan.fault
                    ),
                );
                match outcome {
                    "upstream_error" => {
                        want(status == 502, format!("upstream_error with {status}"))
                    }
                    "timeout" => want(status == 504, format!("timeout with {status}")),
                    "refused" => want(
                        error_code.as_deref() == line["error"].as_str(),
                        format!("client's error {error_code:?}, log's {}", line["error"]),
                    ),
                    "complete" if plan.fault == Fault::Error => want(
                        status == 500,
                        format!("an injected error answered {status}"),
                    ),
                    "complete" => want(status == 200, format!("complete with {status}")),
                    _ => {}
                }
            }
        }
    }
    match span {
        None => bad.push("no span".into()),
        Some(span) => {
            let span_outcome = attr(span, "llmlb.outcome");
            want(
                span_outcome.as_deref() == Some(outcome),
                format!("span outcome {span_outcome:?}, log {outcome}"),
            );
            let code = attr(span, "http.response.status_code");
            want(
                code.as_deref() == Some(&status.to_string()),
                format!("span status {code:?}, log {status}"),
            );
            let error = span["status"]["code"] == 2;
            let should = match outcome {
                "upstream_error" | "timeout" | "stream_error" => true,
                "client_closed" | "client_closed_midstream" => false,
                _ => status >= 500,
            };
            want(
                error == should,
                format!("span error {error}, outcome {outcome} status {status}"),
            );
        }
    }
    bad
}

/// `name`'s samples summed by the label `by` (all samples when `None`).
fn sums(text: &str, name: &str, by: &[&str]) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let (labels, value) = match rest.rsplit_once(' ') {
            Some(split) => split,
            None => continue,
        };
        let value: f64 = value.parse().unwrap();
        let key = by
            .iter()
            .map(|l| {
                labels
                    .split(&format!("{l}=\""))
                    .nth(1)
                    .and_then(|v| v.split('"').next())
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_the_metrics_the_span_and_the_client_agree_on_every_request() {
    let seed: u64 = std::env::var("LLMLB_AGREE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let n: usize = std::env::var("LLMLB_AGREE_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let plans: Vec<Plan> = (0..n).map(|i| draw(&mut rng, i, seed)).collect();
    let mut mix: BTreeMap<String, usize> = BTreeMap::new();
    for p in &plans {
        *mix.entry(format!("fault={}", p.fault.name())).or_default() += 1;
        *mix.entry(format!("client={}", p.leave.name())).or_default() += 1;
        *mix.entry(format!("stream={}", p.stream)).or_default() += 1;
    }
    println!(
        "seed {seed}, {n} requests (replay: LLMLB_AGREE_SEED={seed} LLMLB_AGREE_REQUESTS={n})"
    );
    println!("mix: {mix:?}");

    let (collector, collector_addr) = Collector::start().await;
    let (a, b) = (
        sim_support::start(sim_support::fast()).await,
        sim_support::start(sim_support::fast()).await,
    );
    let dead = refused_addr().await;
    let config = serve_config(
        "",
        &format!(
            "[telemetry.otlp]\nendpoint = \"http://{collector_addr}\"\nexport_interval = \"50ms\"\n\
             [[pools]]\nname = \"chat\"\nmodels = [\"llmlb-sim\"]\nbalancer = \"round_robin\"\n\
             max_inflight = 2\nretries = 2\n\
             [pools.timeouts]\nfirst_byte = \"1s\"\nidle = \"600ms\"\n\
             [pools.queue]\nmax_depth = 2\nmax_wait = \"30s\"\n\
             [pools.health]\nenabled = false\n\
             [pools.outlier]\nconsecutive_failures = 1000000\n\
             [[pools.replicas]]\nname = \"a\"\nurl = \"http://{}\"\n\
             [[pools.replicas]]\nname = \"dead\"\nurl = \"http://{dead}\"\n\
             [[pools.replicas]]\nname = \"b\"\nurl = \"http://{}\"\n",
            a.addr, b.addr
        ),
    );
    let file = TempFile::config("agree", &config);
    let serve = ServeProcess::start(&file.path, &[]);
    let (addr, admin) = (serve.addr, serve.admin_addr);
    // The log, read on a thread of its own as the process writes it.
    let log: Arc<Mutex<Vec<Value>>> = Arc::default();
    let reader = {
        let log = Arc::clone(&log);
        let mut lines = serve.lines;
        std::thread::spawn(move || {
            for line in lines.by_ref().map_while(Result::ok) {
                // A line that is not one JSON object is kept as a string,
                // and fails the test below.
                let v = serde_json::from_str(&line).unwrap_or(Value::String(line));
                log.lock().unwrap().push(v);
            }
        })
    };
    let mut child = serve.child;

    // Nine clients at a time: one more than the pool's six slots (the
    // refusing replica's two count) and the queue's two places hold, so the
    // queue refuses some; a refused client waits a little, as one honouring
    // Retry-After would, so refusals do not crowd out the rest.
    let started = std::time::Instant::now();
    let seen: HashMap<String, Seen> = futures_util::stream::iter(plans.clone())
        .map(|p| tokio::spawn(async move { (p.id.clone(), run(addr, p).await) }))
        .buffer_unordered(9)
        .map(|done| done.unwrap())
        .collect()
        .await;
    println!("sent in {:.1} s", started.elapsed().as_secs_f64());

    // Every request's line, then every request's span (bounded waits).
    let access = |log: &[Value]| -> Vec<Value> {
        log.iter()
            .filter(|l| l["target"] == "llmlb::access")
            .cloned()
            .collect()
    };
    // A request without its line after the wait is named below, with its
    // plan and what its client saw.
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while access(&log.lock().unwrap()).len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let server_spans = |spans: &[Value]| -> HashMap<String, Vec<Value>> {
        let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
        for s in spans {
            if let Some(id) = attr(s, "llmlb.request_id") {
                by_id.entry(id).or_default().push(s.clone());
            }
        }
        by_id
    };
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while server_spans(&collector.spans.lock().unwrap()).len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let text = metrics_text(admin).await;
    let _ = child.0.kill();
    let _ = child.0.wait();
    let _ = reader.join();
    let log = log.lock().unwrap().clone();
    let lines = access(&log);
    let spans = server_spans(&collector.spans.lock().unwrap());

    // Every entry is one JSON line, and every line about a request names it.
    for l in &log {
        assert!(
            !l.is_string(),
            "a log line that is not one JSON object: {l}"
        );
        let about_request = l["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("llmlb::forwarding") || t == "llmlb::access");
        if about_request && l["level"] != "DEBUG" {
            assert!(
                l["request_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("agree-")),
                "a line about a request without its id: {l}"
            );
        }
    }

    // One line and one span per request, agreeing with the client.
    let mut by_id: HashMap<&str, Vec<&Value>> = HashMap::new();
    for l in &lines {
        by_id
            .entry(l["request_id"].as_str().unwrap())
            .or_default()
            .push(l);
    }
    let mut problems = Vec::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    // A client that gave up at once may have closed its connection before
    // its request was written: llmlb never saw a request, and it has no
    // line, span or count.
    let unsent = |p: &Plan| {
        !by_id.contains_key(p.id.as_str())
            && matches!(seen[&p.id], Seen::LeftBeforeHead)
            && matches!(p.leave, Leave::After(d) if d < Duration::from_millis(20))
    };
    let heard = n - plans.iter().filter(|p| unsent(p)).count();
    for p in &plans {
        let Some(found) = by_id.get(p.id.as_str()) else {
            if !unsent(p) {
                problems.push(format!(
                    "{}: no access line ({p:?}, client {:?})",
                    p.id, seen[&p.id]
                ));
            }
            continue;
        };
        if found.len() != 1 {
            problems.push(format!("{}: {} access lines", p.id, found.len()));
        }
        let line = found[0];
        *outcomes
            .entry(line["outcome"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
        let span = spans.get(&p.id).and_then(|s| (s.len() == 1).then(|| &s[0]));
        for problem in check(p, &seen[&p.id], line, span) {
            problems.push(format!(
                "{}: {problem} ({p:?}, client {:?}, line {line})",
                p.id, seen[&p.id]
            ));
        }
    }
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    for l in &lines {
        if let Some(code) = l["error"].as_str() {
            *refusals.entry(code.to_owned()).or_default() += 1;
        }
    }
    println!("outcomes: {outcomes:?}; errors llmlb answered: {refusals:?}");
    assert!(
        problems.is_empty(),
        "{} disagreements:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The run exercised what it claims to: most requests reached a
    // replica, and every planned fault showed its outcome at least once.
    let refused = outcomes.get("refused").copied().unwrap_or(0);
    assert!(refused * 2 < n, "most requests were refused: {outcomes:?}");
    for fault in [Fault::Reset, Fault::Break(1), Fault::Stall, Fault::Idle] {
        let planned = plans
            .iter()
            .filter(|p| p.fault.name() == fault.name())
            .count();
        let shown: usize = fault
            .expected()
            .iter()
            .map(|o| outcomes.get(*o).copied().unwrap_or(0))
            .sum();
        assert!(
            planned < 5 || shown > 0,
            "{} planned {planned} times, never seen: {outcomes:?}",
            fault.name()
        );
    }
    assert_eq!(lines.len(), heard, "one access line per request");

    // The metric totals are the lines' totals, and the lines are the requests.
    let mut want_requests: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    let (mut ttfb, mut retries, mut refused, mut by_model) = (0.0, 0.0, 0.0, 0.0);
    for l in &lines {
        let key = vec![
            l["pool"].as_str().unwrap_or("").to_owned(),
            l["replica"].as_str().unwrap_or("").to_owned(),
            label(l),
        ];
        *want_requests.entry(key).or_insert(0.0) += 1.0;
        ttfb += f64::from(u8::from(l["ttfb_ms"].is_number()));
        retries += (l["attempts"].as_f64().unwrap_or(1.0) - 1.0).max(0.0);
        refused += f64::from(u8::from(l["error"].is_string()));
        by_model += f64::from(u8::from(l["pool"].is_string()));
    }
    let got_requests = sums(
        &text,
        "llmlb_requests_total",
        &["pool", "replica", "status"],
    );
    assert_eq!(
        got_requests, want_requests,
        "llmlb_requests_total by pool, replica, status"
    );
    let total = |name: &str| sums(&text, name, &[]).values().sum::<f64>();
    assert_eq!(total("llmlb_requests_total"), heard as f64);
    assert_eq!(total("llmlb_request_duration_seconds_count"), heard as f64);
    assert_eq!(total("llmlb_time_to_first_byte_seconds_count"), ttfb);
    assert_eq!(total("llmlb_retries_total"), retries);
    assert_eq!(total("llmlb_rejections_total"), refused);
    assert_eq!(total("llmlb_model_requests_total"), by_model);
    println!("agreed: {n} requests, {ttfb} first bytes, {retries} re-sends, {refused} refusals");
}
