//! A real `redis-server` on a loopback port for the tests that need one, and
//! a Redis Sentinel watching one. Without the binary such a test says why
//! it did not run, unless `LLMLB_REQUIRE_REDIS` is set (CI sets it), when
//! that is a failure.

use std::process::{Command, Stdio};

use super::*;

/// A redis-server, stopped when this drops.
pub struct RedisServer {
    child: Option<ChildGuard>,
    pub port: u16,
    /// `--replicaof 127.0.0.1 PORT`: a replica of another server.
    replica_of: Option<u16>,
}

/// Whether `redis-server` can run here (see the module docs).
fn redis_installed(test: &str) -> bool {
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
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port for a cluster node: its cluster bus listens 10,000 above
/// (redis-server refuses a port above 55,535), so that one must be free too.
fn free_cluster_port(taken: &[u16]) -> u16 {
    (0..1_000)
        .map(|_| free_port())
        .find(|&port| {
            port <= 55_535
                && !taken.contains(&port)
                && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        })
        .expect("a free port at most 55,535 whose port + 10,000 is free too")
}

/// Waits until the server on `port` answers PING.
async fn answers_ping(port: u16) {
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

impl RedisServer {
    /// A fresh server on a free port; `None` when redis-server is missing.
    pub async fn start(test: &str) -> Option<RedisServer> {
        Self::start_as(test, None).await
    }

    /// A fresh server that replicates the one on `master`'s port.
    pub async fn start_replica(test: &str, master: u16) -> Option<RedisServer> {
        Self::start_as(test, Some(master)).await
    }

    async fn start_as(test: &str, replica_of: Option<u16>) -> Option<RedisServer> {
        if !redis_installed(test) {
            return None;
        }
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            replica_of,
        };
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
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"]);
        if let Some(master) = self.replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        self.child = Some(ChildGuard(
            cmd.stdout(Stdio::null())
                .spawn()
                .expect("start redis-server"),
        ));
        answers_ping(self.port).await;
    }
}

/// A Redis Sentinel (`redis-server --sentinel`) watching the master on
/// `master`'s port under the name `main`, quorum 1, calling it down after
/// `down_after_ms` without an answer; stopped when this drops.
pub struct Sentinel {
    _child: ChildGuard,
    pub port: u16,
    dir: std::path::PathBuf,
}

impl Sentinel {
    pub async fn start(test: &str, master: u16, down_after_ms: u64) -> Option<Sentinel> {
        if !redis_installed(test) {
            return None;
        }
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("llmlb-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor main 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds main {down_after_ms}\n\
                 sentinel failover-timeout main 2000\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = ChildGuard(
            Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel"),
        );
        answers_ping(port).await;
        Some(Sentinel {
            _child: child,
            port,
            dir,
        })
    }

    /// The store URL naming the master this Sentinel watches.
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/main", self.port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters on loopback (`--cluster-enabled`,
/// joined with `redis-cli --cluster create`), stopped when this drops.
pub struct RedisCluster {
    _nodes: Vec<ChildGuard>,
    pub ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub async fn start(test: &str) -> Option<RedisCluster> {
        if !redis_installed(test) {
            return None;
        }
        let mut ports = Vec::new();
        for _ in 0..3 {
            ports.push(free_cluster_port(&ports));
        }
        let dir =
            std::env::temp_dir().join(format!("llmlb-cluster-{}-{}", std::process::id(), ports[0]));
        std::fs::create_dir_all(&dir).unwrap();
        let mut nodes = Vec::new();
        for &port in &ports {
            nodes.push(ChildGuard(
                Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&dir)
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start redis-server"),
            ));
        }
        for &port in &ports {
            answers_ping(port).await;
        }
        let cluster = RedisCluster {
            _nodes: nodes,
            ports,
            dir,
        };
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.nodes())
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(created.success(), "redis-cli --cluster create");
        cluster.until_ok().await;
        Some(cluster)
    }

    /// Waits until every node says the cluster is up.
    async fn until_ok(&self) {
        for &port in &self.ports {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    if info.contains("cluster_state:ok") {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the cluster comes up");
        }
    }

    /// `host:port` of each node.
    fn nodes(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The store URL listing the cluster's nodes.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.nodes().join(","))
    }

    /// A connection to the cluster (commands go to the node of their key).
    pub async fn connect(&self) -> redis::cluster_async::ClusterConnection {
        let urls = self.nodes().into_iter().map(|n| format!("redis://{n}"));
        let client = redis::cluster::ClusterClient::new(urls.collect::<Vec<_>>()).unwrap();
        client.get_async_connection().await.unwrap()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
