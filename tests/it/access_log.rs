//! The access log of a real `llmlb serve` process: one line per finished
//! request with routing, timing and token fields, in JSON or plain text (no
//! colour codes on a pipe), and the configured fields and sampling.

use crate::common;
use crate::sim_support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};

struct Serve {
    child: Child,
    lines: Lines<BufReader<ChildStderr>>,
    addr: std::net::SocketAddr,
    admin_addr: std::net::SocketAddr,
    /// The config file, rewritten by reload tests.
    path: std::path::PathBuf,
    /// The config file, removed on drop.
    _file: common::TempFile,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn serve(tag: &str, format: &str, config: &str) -> Serve {
    let file =
        common::TempFile::config(&format!("access-{tag}"), &common::serve_config("", config));
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["--log-format", format, "serve", "--config"])
        .arg(&file.path)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = next_line(&mut lines).await;
    let field = |key: &str| -> std::net::SocketAddr {
        first
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .map(|a| a.trim_matches('"').to_owned())
            .or_else(|| {
                serde_json::from_str::<Value>(&first)
                    .ok()
                    .and_then(|v| v[key].as_str().map(str::to_owned))
            })
            .unwrap_or_else(|| panic!("no {key} in {first}"))
            .parse()
            .unwrap()
    };
    let (addr, admin_addr) = (field("addr"), field("admin_addr"));
    let path = file.path.clone();
    Serve {
        child,
        lines,
        addr,
        admin_addr,
        path,
        _file: file,
    }
}

async fn next_line(lines: &mut Lines<BufReader<ChildStderr>>) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("a log line within 10 s")
        .unwrap()
        .expect("stderr still open")
}

/// The next access-log line (JSON format), skipping other lines.
async fn next_access(s: &mut Serve) -> Value {
    for _ in 0..50 {
        let line = next_line(&mut s.lines).await;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["target"] == "llmlb::access" {
            return v;
        }
    }
    panic!("no access-log line among 50");
}

/// A `fast` simulated replica named `gpu-a`, its model, and `llmlb serve`
/// in front of it with `extra` config before the pool.
async fn serve_sim(
    tag: &str,
    format: &str,
    extra: &str,
) -> (llmlb::replica_sim::SimHandle, String, Serve) {
    let sim = sim_support::start(sim_support::fast()).await;
    let model = sim_support::fast().model;
    let config = format!(
        "{extra}\n[[pools]]\nname = \"chat\"\nmodels = [\"{model}\"]\nbalancer = \"least_connections\"\n[[pools.replicas]]\nname = \"gpu-a\"\nurl = \"http://{}\"\n",
        sim.addr
    );
    let s = serve(tag, format, &config).await;
    (sim, model, s)
}

#[tokio::test]
async fn one_json_line_per_request_with_tokens_and_timing() {
    let (_sim, model, mut s) = serve_sim("json", "json", "").await;

    let body = json!({"model": model, "prompt": "one two three four", "max_tokens": 5});
    let (status, _) = sim_support::complete(s.addr, body).await;
    assert_eq!(status, 200);
    let line = next_access(&mut s).await;
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["message"], "request");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/v1/completions");
    assert_eq!(line["model"], model.as_str());
    assert_eq!(line["stream"], false);
    assert_eq!(line["pool"], "chat");
    assert_eq!(line["replica"], "gpu-a");
    // The only replica: the balancer had nothing to choose.
    assert_eq!(line["branch"], "single");
    assert_eq!(line["status"], 200);
    assert_eq!(line["attempts"], 1);
    assert_eq!(line["completion_tokens"], 5);
    assert!(line["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(line["outcome"], "complete");
    assert!(line["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(!line["request_id"].as_str().unwrap().is_empty());
    let (ttft, total) = (
        line["ttft_ms"].as_f64().unwrap(),
        line["duration_ms"].as_f64().unwrap(),
    );
    assert!(ttft <= total, "{line}");
    // No tiers and no pool queue: neither field.
    assert!(line.get("tier").is_none() && line.get("queue_ms").is_none());

    let stream = json!({"model": model, "prompt": "a b", "max_tokens": 4, "stream": true,
                        "stream_options": {"include_usage": true}});
    let (status, _) = sim_support::complete(s.addr, stream).await;
    assert_eq!(status, 200);
    let line = next_access(&mut s).await;
    assert_eq!(line["stream"], true);
    assert_eq!(line["completion_tokens"], 4);
    assert!(line["ttft_ms"].as_f64().unwrap() <= line["duration_ms"].as_f64().unwrap());

    // A request llmlb rejects itself is logged too, with what is known.
    let (status, _) = sim_support::complete(s.addr, json!({"model": "nope", "prompt": "x"})).await;
    assert_eq!(status, 404);
    let line = next_access(&mut s).await;
    assert_eq!(line["status"], 404);
    assert_eq!(line["model"], "nope");
    assert!(line.get("replica").is_none() && line.get("pool").is_none());
}

#[tokio::test]
async fn text_lines_have_no_colour_codes_on_a_pipe() {
    let (_sim, model, mut s) = serve_sim("text", "text", "").await;
    let body = json!({"model": model, "prompt": "x", "max_tokens": 2});
    assert_eq!(sim_support::complete(s.addr, body).await.0, 200);
    let line = loop {
        let line = next_line(&mut s.lines).await;
        assert!(!line.contains('\u{1b}'), "colour code in {line:?}");
        if line.contains("llmlb::access") {
            break line;
        }
    };
    assert!(
        line.contains("replica=\"gpu-a\"") || line.contains("replica=gpu-a"),
        "{line}"
    );
    assert!(line.contains("status=200"), "{line}");
}

#[tokio::test]
async fn fields_and_sampling_follow_the_config() {
    let access = "[telemetry.access_log]\nsample = 0.0\nfields = [\"path\", \"status\"]";
    let (_sim, model, mut s) = serve_sim("sampled", "json", access).await;
    // Sample 0: the success is not logged, the failure after it is.
    let ok = json!({"model": model, "prompt": "x", "max_tokens": 2});
    assert_eq!(sim_support::complete(s.addr, ok).await.0, 200);
    let bad = json!({"model": "nope", "prompt": "x"});
    assert_eq!(sim_support::complete(s.addr, bad).await.0, 404);
    let line = next_access(&mut s).await;
    assert_eq!(line["status"], 404, "the success was sampled out: {line}");
    let keys: Vec<&str> = line
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| !["timestamp", "level", "target", "message"].contains(k))
        .collect();
    assert_eq!(keys, ["path", "status"]);
}

/// A request with its own id and `x-sim-fault`, on a connection of its
/// own: the status and the body as far as it reads (a cut body ends early).
async fn send_faulty(
    addr: std::net::SocketAddr,
    id: &str,
    fault: &str,
    body: Value,
) -> (u16, String) {
    let mut conn = common::Conn::open(addr).await;
    let req = http::Request::post("/v1/completions")
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .header("x-sim-fault", fault)
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = conn.send(req).await;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut text = Vec::new();
    while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
        }
    }
    (status, String::from_utf8_lossy(&text).into_owned())
}

/// Log lines up to and including the access line of request `id`.
async fn lines_until_access(s: &mut Serve, id: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    for _ in 0..50 {
        let line = next_line(&mut s.lines).await;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let done = v["target"] == "llmlb::access" && v["request_id"] == id;
        seen.push(v);
        if done {
            return seen;
        }
    }
    panic!("no access line for {id} among 50: {seen:#?}");
}

/// A replica that dies mid-stream: the access line, the warning before it
/// and the metrics all say `stream_error`, and the warning names the
/// request and the replica.
#[tokio::test]
async fn a_stream_broken_midway_is_a_stream_error_everywhere() {
    let (_sim, model, mut s) = serve_sim("broken", "json", "").await;
    let body = json!({"model": model, "prompt": "a b", "max_tokens": 40, "stream": true});
    let (status, text) = send_faulty(s.addr, "broken-1", "break=300", body).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"error\""), "a readable error event: {text}");
    let lines = lines_until_access(&mut s, "broken-1").await;
    let warn = lines
        .iter()
        .find(|l| l["message"] == "upstream stream failed")
        .unwrap_or_else(|| panic!("no warning: {lines:#?}"));
    assert_eq!(warn["request_id"], "broken-1", "{warn}");
    assert_eq!(warn["replica"], "gpu-a", "{warn}");
    let access = lines.last().unwrap();
    assert_eq!(access["status"], 200);
    assert_eq!(access["outcome"], "stream_error", "{access}");
    let text = common::metrics_text(s.admin_addr).await;
    let label = [("status", "stream_error"), ("replica", "gpu-a")];
    assert_eq!(
        common::metric_value(&text, "llmlb_requests_total", &label),
        1.0
    );
    assert_eq!(
        common::metric_value(&text, "llmlb_requests_total", &[("status", "200")]),
        0.0,
        "{text}"
    );
}

/// A refused request is one line, the access line, whose request id is
/// the client's as sent (not quoted twice) and which names the error.
#[tokio::test]
async fn a_refused_request_writes_one_line_with_its_plain_request_id() {
    let (_sim, model, mut s) = serve_sim("refused", "json", "").await;
    let (status, _) = send_faulty(
        s.addr,
        "nope-1",
        "",
        json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404);
    let ok = json!({"model": model, "prompt": "x", "max_tokens": 2});
    assert_eq!(send_faulty(s.addr, "ok-1", "", ok).await.0, 200);
    let lines = lines_until_access(&mut s, "ok-1").await;
    let about: Vec<&Value> = lines
        .iter()
        .filter(|l| l.to_string().contains("nope-1"))
        .collect();
    assert_eq!(about.len(), 1, "one line per refusal: {about:#?}");
    let line = about[0];
    assert_eq!(line["target"], "llmlb::access");
    assert_eq!(line["request_id"], "nope-1");
    assert_eq!(line["status"], 404);
    assert_eq!(line["outcome"], "refused");
    assert_eq!(line["error"], "model_not_found");
}

/// A rejected reload (a TOML syntax error, whose message spans lines) is
/// one log line in the text format.
#[tokio::test]
async fn a_rejected_reload_is_one_text_line() {
    let (_sim, model, mut s) = serve_sim("reload", "text", "").await;
    std::fs::write(&s.path, "[server\nlisten = 1\n").unwrap();
    let (status, _) = common::admin_post(s.admin_addr, "/admin/reload").await;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status}"
    );
    let ok = json!({"model": model, "prompt": "x", "max_tokens": 2});
    assert_eq!(send_faulty(s.addr, "after-1", "", ok).await.0, 200);
    let mut rejected = 0;
    loop {
        let line = next_line(&mut s.lines).await;
        let stamped = line.len() > 20 && line.as_bytes()[..4].iter().all(u8::is_ascii_digit);
        assert!(stamped, "a line that does not start an entry: {line:?}");
        rejected += usize::from(line.contains("reload rejected"));
        if line.contains("llmlb::access") && line.contains("after-1") {
            break;
        }
    }
    assert_eq!(rejected, 1);
}

#[tokio::test]
async fn a_queued_request_says_its_tier_and_how_long_it_waited() {
    let sim = sim_support::start(sim_support::fast()).await;
    let model = sim_support::fast().model;
    let config = format!(
        "[gateway]\ndefault_tier = \"free\"\n[[tiers]]\nname = \"free\"\npriority = \"low\"\n\
         [[pools]]\nname = \"chat\"\nmodels = [\"{model}\"]\nmax_inflight = 1\n\
         [[pools.replicas]]\nname = \"gpu-a\"\nurl = \"http://{}\"\n",
        sim.addr
    );
    let mut s = serve("queued", "json", &config).await;
    // Two at once on one slot: the second waits for the first to finish.
    let body = json!({"model": model, "prompt": "one two three", "max_tokens": 32});
    let both = [
        sim_support::spawn_complete(s.addr, body.clone()),
        sim_support::spawn_complete(s.addr, body),
    ];
    for done in both {
        assert_eq!(done.await.unwrap().0, 200);
    }
    let lines = [next_access(&mut s).await, next_access(&mut s).await];
    let waits: Vec<f64> = lines
        .iter()
        .map(|l| l["queue_ms"].as_f64().unwrap())
        .collect();
    for l in &lines {
        assert_eq!(l["tier"], "free", "{l}");
        assert!(
            l["queue_ms"].as_f64().unwrap() <= l["ttft_ms"].as_f64().unwrap(),
            "{l}"
        );
    }
    // The second out of the queue waited for the whole of the first.
    let first_done = lines[0]["duration_ms"].as_f64().unwrap();
    assert!(
        waits[1] > 0.0 && waits[1] + 1.0 >= first_done * 0.5,
        "{lines:?}"
    );
}

/// In a prefix mode the line carries the cached prompt tokens llmlb
/// predicted for the replica, next to those the replica reported.
#[tokio::test]
async fn a_prefix_mode_logs_the_cached_tokens_it_predicted() {
    let a = sim_support::start(sim_support::fast()).await;
    let b = sim_support::start(sim_support::fast()).await;
    let model = sim_support::fast().model;
    let config = format!(
        "[[pools]]\nname = \"chat\"\nmodels = [\"{model}\"]\n[pools.prefix]\nmode = \"cache\"\n\
         [[pools.replicas]]\nname = \"gpu-a\"\nurl = \"http://{}\"\n\
         [[pools.replicas]]\nname = \"gpu-b\"\nurl = \"http://{}\"\n",
        a.addr, b.addr
    );
    let mut s = serve("predicted", "json", &config).await;
    let body = json!({"model": model, "prompt": "one shared prefix for both ".repeat(40), "max_tokens": 2});
    let mut lines = Vec::new();
    for _ in 0..2 {
        let (status, _) = sim_support::complete(s.addr, body.clone()).await;
        assert_eq!(status, 200);
        lines.push(next_access(&mut s).await);
    }
    let predicted = |l: &Value| l["cached_tokens_predicted"].as_u64();
    assert_eq!(predicted(&lines[0]), Some(0), "{}", lines[0]);
    // The second goes where the first left the prefix, and finds it.
    assert_eq!(lines[1]["replica"], lines[0]["replica"]);
    assert!(predicted(&lines[1]).unwrap_or(0) > 0, "{}", lines[1]);
    assert!(
        lines[1]["cached_tokens"].as_u64().unwrap_or(0) > 0,
        "{}",
        lines[1]
    );
    // And the time to first token it expected there.
    for l in &lines {
        assert!(
            l["ttft_predicted_ms"].as_f64().is_some_and(|t| t > 0.0),
            "{l}"
        );
    }
}
