//! `llmlb serve` as a child process, its config file, and cleaning up after both.

use super::*;

/// A child process that is killed when the test ends, even by a panic, so a
/// failing test never leaves a server running (or a pipe open).
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A file in a directory of its own under the system temp dir, named for
/// the test and this process; the directory goes when this drops.
pub struct TempFile {
    pub dir: std::path::PathBuf,
    pub path: std::path::PathBuf,
}

impl TempFile {
    pub fn new(tag: &str, name: &str, text: &str) -> TempFile {
        let dir = std::env::temp_dir().join(format!("llmlb-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        TempFile { dir, path }
    }

    /// `llmlb.toml` holding `text`.
    pub fn config(tag: &str, text: &str) -> TempFile {
        TempFile::new(tag, "llmlb.toml", text)
    }

    pub fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A config for `llmlb serve`: both listeners on port 0, the further
/// `[server]` keys `server`, then `rest`.
pub fn serve_config(server: &str, rest: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{server}\n{rest}")
}

/// `llmlb serve` as a child process (killed when this drops), logging JSON
/// lines at `info` on a pipe; its first line names the bound addresses.
pub struct ServeProcess {
    pub child: ChildGuard,
    pub lines: std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
    /// The first log line.
    pub first: serde_json::Value,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

impl ServeProcess {
    /// Starts `llmlb serve --config config` with `env` added.
    pub fn start(config: &std::path::Path, env: &[(&str, &str)]) -> ServeProcess {
        use std::io::BufRead;
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
            .args(["--log-format", "json", "serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = ChildGuard(child);
        let mut lines = std::io::BufReader::new(child.0.stderr.take().unwrap()).lines();
        let line = lines.next().expect("a first log line").unwrap();
        let first: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let addr = |key: &str| -> SocketAddr {
            let text = first[key].as_str();
            text.and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        let (addr, admin_addr) = (addr("addr"), addr("admin_addr"));
        ServeProcess {
            child,
            lines,
            first,
            addr,
            admin_addr,
        }
    }

    /// Sends a signal (`-TERM`, `-HUP`) to the process.
    pub fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([signal, &self.child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {signal} failed");
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit.
    pub async fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "llmlb did not exit within {limit:?} of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
