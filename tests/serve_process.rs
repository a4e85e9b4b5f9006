//! `llmlb serve` as a real process: it starts from a config file, proxies, and
//! exits 0 after SIGTERM once its in-flight work is done.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[tokio::test]
async fn serve_proxies_and_exits_cleanly_on_sigterm() {
    let up = Upstream::start("a", Mode::Json).await;
    let dir = std::env::temp_dir().join(format!("llmlb-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("llmlb.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndrain_delay = \"100ms\"\n{}",
            one_pool("least_connections", &[(&up.url(), 1)], "")
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&path)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let child = &mut child.0;
    // The first log line names the bound addresses.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let log: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(log["message"], "llmlb listening", "{line}");
    let addr: std::net::SocketAddr = log["addr"].as_str().unwrap().parse().unwrap();
    let (status, _, body) = call(addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(up.requests(), 1);

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "llmlb did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
