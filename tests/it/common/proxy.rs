//! Starting llmlb on port 0 in the test process, from TOML text.

use super::*;

/// A running llmlb for a test.
pub async fn start_llmlb(config_toml: &str) -> llmlb::daemon::Running {
    let config = llmlb::config::parse(config_toml)
        .unwrap_or_else(|issues| panic!("test config invalid: {issues:?}"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    llmlb::daemon::start(config, listener, admin).unwrap()
}

/// A pool config with the given replica URLs.
pub fn one_pool(balancer: &str, replicas: &[(&str, u32)], extra: &str) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"{balancer}\"\n{extra}\n"
    );
    for (url, weight) in replicas {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"{url}\"\nweight = {weight}\n"
        ));
    }
    s
}

/// An address nothing listens on (connections are refused).
pub async fn refused_addr() -> SocketAddr {
    // Bound but never listening: a connection is refused, and the port
    // stays taken for the life of the test process, so a server another
    // test starts meanwhile cannot land on it (a listener bound and dropped
    // freed the port for the next bind to port 0).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    std::mem::forget(socket);
    addr
}

/// Reads the first pool's queue.
fn first_queue<T>(
    lb: &llmlb::daemon::Running,
    read: impl FnOnce(&llmlb::admission::PoolQueue) -> T,
) -> T {
    let topology = lb.state.topology();
    read(
        &topology.pools()[0]
            .admission
            .as_ref()
            .expect("the pool queues")
            .queue,
    )
}

/// Waiters per priority level in the first pool's queue.
pub fn queue_depths(lb: &llmlb::daemon::Running) -> Vec<usize> {
    first_queue(lb, |q| q.depths())
}

/// The other instances' waiters per level, as the first pool's queue
/// counts them now (empty: no live report from the fleet).
pub fn others_depths(lb: &llmlb::daemon::Running) -> Vec<usize> {
    first_queue(lb, |q| q.others_depths(std::time::Instant::now()))
}

/// One replica named `a` answering in `mode`, behind a round-robin pool
/// with the extra pool keys `pool`; `server` is TOML placed before the pool
/// (a `[server]` table, or nothing).
pub async fn one_replica(
    mode: Mode,
    server: &str,
    pool: &str,
) -> (Upstream, llmlb::daemon::Running) {
    let up = Upstream::start("a", mode).await;
    let config = format!(
        "{server}\n{}",
        one_pool("round_robin", &[(&up.url(), 1)], pool)
    );
    (up, start_llmlb(&config).await)
}

/// llmlb in front of an address that refuses connections and then `good`,
/// round-robin, with the extra pool keys `pool`.
pub async fn refused_then(good: &Upstream, pool: &str) -> llmlb::daemon::Running {
    let (refused, good) = (format!("http://{}", refused_addr().await), good.url());
    let replicas = [(refused.as_str(), 1), (good.as_str(), 1)];
    start_llmlb(&one_pool("round_robin", &replicas, pool)).await
}

/// Two priority levels that never refuse for waiting (`high`, and `low`
/// promoted only after 600 s), the tiers `paid` and `free` on them, and
/// a deep, patient pool queue: the `[pools.queue]` line ends the block,
/// so it follows a `[[pools]]` table.
pub fn paid_free(pool: &str) -> String {
    format!(
        "[[priorities]]\nname = \"high\"\nmax_wait = \"60s\"\n\
         [[priorities]]\nname = \"low\"\nmax_wait = \"60s\"\npromote_after = \"600s\"\n\
         [[tiers]]\nname = \"paid\"\npriority = \"high\"\n\
         [[tiers]]\nname = \"free\"\npriority = \"low\"\n{pool}\
         [pools.queue]\nmax_depth = 64\ntimeout = \"60s\"\n"
    )
}
