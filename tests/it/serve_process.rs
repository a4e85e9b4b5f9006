//! `llmlb serve` as a real process: it starts from a config file, proxies, and
//! exits 0 after SIGTERM once its in-flight work is done.

use crate::common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn serve_proxies_and_exits_cleanly_on_sigterm() {
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool("least_connections", &[(&up.url(), 1)], "");
    let config = serve_config("drain_delay = \"100ms\"", &pool);
    let file = TempFile::config("serve", &config);
    let mut served = ServeProcess::start(&file.path, &[]);
    // The first log line names the bound addresses.
    assert_eq!(
        served.first["message"], "llmlb listening",
        "{}",
        served.first
    );
    let (status, _, body) = call(served.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(up.requests(), 1);

    let status = served.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = served.lines.by_ref().map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

/// The log is written by a thread of its own, buffered: every line still
/// comes out whole (one JSON object per line, however many requests log at
/// once) and every line is out when the process exits after SIGTERM,
/// including the access lines of the last requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_log_line_is_whole_and_written_by_exit() {
    const N: usize = 400;
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool("least_connections", &[(&up.url(), 1)], "");
    let config = serve_config("drain_delay = \"0s\"", &pool);
    let file = TempFile::config("serve-log", &config);
    let mut served = ServeProcess::start(&file.path, &[]);
    let addr = served.addr;
    // stderr is read as it comes, as a log collector would.
    let mut lines = served.lines;
    let reader = std::thread::spawn(move || {
        lines
            .by_ref()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            tokio::spawn(async move {
                for i in 0..N / 16 {
                    let mut req = chat_request("/v1/chat/completions", CHAT);
                    let id = format!("log-{t}-{i}");
                    req.headers_mut()
                        .insert("x-request-id", id.parse().unwrap());
                    let (status, _, _) = call(addr, req).await;
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // SIGTERM right after the last answer: its line may still be buffered.
    let pid = served.child.0.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = served.child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = reader.join().unwrap();
    let mut ids = std::collections::HashSet::new();
    for line in &rest {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one whole JSON line ({e}): {line:?}"));
        if v["target"] == "llmlb::access" {
            assert!(ids.insert(v["request_id"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!(ids.len(), N, "every request's line is out by exit");
    assert!(
        rest.last().is_some_and(|l| l.contains("stopped")),
        "{:?}",
        rest.last()
    );
}
