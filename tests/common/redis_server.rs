//! A real `redis-server` on a loopback port for the tests that need one.
//! Without the binary such a test says why it did not run, unless
//! `LLMLB_REQUIRE_REDIS` is set (CI sets it), when that is a failure.

use std::process::{Command, Stdio};

use super::*;

/// A redis-server, stopped when this drops.
pub struct RedisServer {
    child: Option<ChildGuard>,
    pub port: u16,
}

impl RedisServer {
    /// A fresh server on a free port; `None` when redis-server is missing.
    pub async fn start(test: &str) -> Option<RedisServer> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        if !found {
            assert!(
                std::env::var_os("LLMLB_REQUIRE_REDIS").is_none(),
                "LLMLB_REQUIRE_REDIS is set but redis-server is not installed"
            );
            eprintln!("{test}: redis-server not installed; test not run");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = RedisServer { child: None, port };
        server.restart().await;
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops the server (its data goes with it: no persistence).
    pub fn stop(&mut self) {
        self.child = None;
    }

    /// Starts it (again) on the same port and waits until it answers PING.
    pub async fn restart(&mut self) {
        self.stop();
        self.child = Some(ChildGuard(
            Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .expect("start redis-server"),
        ));
        let port = self.port;
        tokio::time::timeout(Duration::from_secs(10), async move {
            loop {
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    if s.write_all(b"PING\r\n").await.is_ok() {
                        let mut buf = [0u8; 7];
                        if s.read_exact(&mut buf).await.is_ok() && &buf == b"+PONG\r\n" {
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("redis-server answers PING");
    }
}
