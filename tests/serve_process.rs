//! `llmlb serve` as a real process: it starts from a config file, proxies, and
//! exits 0 after SIGTERM once its in-flight work is done.

mod common;

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
