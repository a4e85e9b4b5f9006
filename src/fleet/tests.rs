//! The fleet store against a real `redis-server` (skipped, with a message,
//! when none is installed, unless `LLMLB_REQUIRE_REDIS` is set).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;

use super::*;
use crate::config::FleetConfig;

pub(crate) struct RedisServer {
    child: Child,
    pub port: u16,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisServer {
    /// A fresh redis-server on a free loopback port, answering PING.
    pub(crate) fn start() -> Option<RedisServer> {
        if Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            assert!(
                std::env::var_os("LLMLB_REQUIRE_REDIS").is_none(),
                "LLMLB_REQUIRE_REDIS is set but redis-server is not installed"
            );
            eprintln!("redis-server not installed; fleet store test not run");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = RedisServer { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "redis-server starts");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// A short refresh; a TTL and a store timeout wide enough that a loaded
/// machine (the whole suite on two cores) does not time a refresh out or
/// lapse an instance between two of its refreshes.
fn config(url: &str, prefix: &str) -> FleetConfig {
    toml::from_str(&format!(
        "store = \"{url}\"\nkey_prefix = \"{prefix}\"\nrefresh = \"20ms\"\n\
         instance_ttl = \"1s\"\ntimeout = \"250ms\""
    ))
    .unwrap()
}

fn handles(url: &str, prefix: &str, n: usize) -> Vec<Arc<Fleet>> {
    let metrics = FleetMetrics::new(&Registry::new());
    (0..n)
        .map(|_| Fleet::new(&config(url, prefix), &metrics).unwrap())
        .collect()
}

fn demand(limit: u32, in_flight: u32, want: u32) -> Demand {
    Demand {
        held_back: false,
        pool: "p".into(),
        replica: "a".into(),
        limit,
        in_flight,
        want,
    }
}

/// Refreshes `fleet` with one demand each, round after round at the
/// refresh interval (as the loop does), until their caps are `want`;
/// panics with the last caps after 5 s. A loaded machine makes a round
/// slower or a call time out; it cannot make the caps settle elsewhere.
async fn settle(fleet: &[&Arc<Fleet>], demands: &[Demand], want: &[u32]) {
    let start = std::time::Instant::now();
    loop {
        let mut caps = Vec::with_capacity(fleet.len());
        for (f, d) in fleet.iter().zip(demands) {
            caps.push(f.refresh(std::slice::from_ref(d)).await[0]);
        }
        if caps == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "caps {caps:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn instances_register_and_split_a_limit_by_demand() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let fleet = handles(&redis.url(), "t1:", 3);
    let all: Vec<&Arc<Fleet>> = fleet.iter().collect();
    // All three want more than the limit: one each.
    settle(
        &all,
        &[demand(3, 0, 5), demand(3, 0, 5), demand(3, 0, 5)],
        &[1, 1, 1],
    )
    .await;
    assert_eq!(fleet[0].status().live_instances, 3);
    let listed = fleet[0].instances().await.unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed.iter().filter(|i| i.me).count(), 1);
    // Only the first wants: once their recent demand is past (half the
    // TTL), the others give their slots back.
    let only_first = [demand(3, 1, 6), demand(3, 0, 0), demand(3, 0, 0)];
    settle(&all, &only_first, &[3, 0, 0]).await;
    // A newcomer wants two: the first shrinks as far as its running
    // requests allow (it runs 3), then further as they end.
    let late = &handles(&redis.url(), "t1:", 1)[0];
    for _ in 0..4 {
        fleet[0].refresh(&[demand(3, 3, 6)]).await;
        let mine = late.refresh(&[demand(3, 0, 2)]).await[0];
        assert_eq!(mine, 0, "no slot while the first runs three");
    }
    let start = std::time::Instant::now();
    loop {
        fleet[0].refresh(&[demand(3, 1, 6)]).await;
        let mine = late.refresh(&[demand(3, 0, 2)]).await[0];
        if mine >= 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the newcomer gets a slot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_vanished_instance_gives_its_slots_back_after_its_ttl() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let fleet = handles(&redis.url(), "t2:", 2);
    for _ in 0..3 {
        fleet[0].refresh(&[demand(4, 4, 4)]).await;
        fleet[1].refresh(&[demand(4, 0, 4)]).await;
    }
    assert_eq!(fleet[1].refresh(&[demand(4, 0, 4)]).await[0], 0);
    // The first stops refreshing (as a killed process would).
    let start = std::time::Instant::now();
    let mut cap = 0;
    while cap < 4 {
        assert!(start.elapsed() < Duration::from_secs(3), "slots came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
        cap = fleet[1].refresh(&[demand(4, 0, 4)]).await[0];
    }
    assert!(
        start.elapsed() >= Duration::from_millis(800),
        "not before the TTL"
    );
    assert_eq!(fleet[1].status().live_instances, 1);
}

#[tokio::test]
async fn the_store_going_away_means_the_share_then_a_probation() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let fleet = handles(&redis.url(), "t3:", 3);
    for _ in 0..3 {
        for f in &fleet {
            f.refresh(&[demand(6, 0, 3)]).await;
        }
    }
    assert_eq!(fleet[0].refresh(&[demand(6, 0, 3)]).await[0], 2);
    drop(redis);
    let start = std::time::Instant::now();
    while fleet[0].status().phase != "fallback" {
        assert!(start.elapsed() < Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(20)).await;
        fleet[0].refresh(&[demand(6, 0, 3)]).await;
    }
    assert_eq!(
        fleet[0].caps(&[demand(6, 0, 3)]),
        vec![2],
        "6 ÷ 3 instances"
    );
    let s = fleet[0].status();
    assert!(
        !s.store_up && s.fallbacks == 1 && s.last_error.is_some(),
        "{s:?}"
    );
}

/// Three instances start and end requests at random under their caps and
/// refresh in a random order, with one of them vanishing and a newcomer
/// joining: the requests running on the replica never exceed its limit.
#[tokio::test]
async fn the_running_sum_never_exceeds_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut fleet = handles(&redis.url(), "t4:", 3);
    let limit = 5;
    let mut running = vec![0u32; 4];
    let mut caps = vec![0u32; 4];
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut alive = [true, true, true, false];
    for round in 0..300 {
        if round == 100 {
            // The third vanishes with its requests; they end on the replica
            // only after its TTL (a SIGKILL: the replica's work runs on).
            alive[2] = false;
        }
        if round == 120 {
            fleet.push(handles(&redis.url(), "t4:", 1).remove(0));
            alive[3] = true;
        }
        for i in 0..fleet.len() {
            if !alive[i] {
                continue;
            }
            match next() % 3 {
                0 if running[i] < caps[i] => running[i] += 1,
                1 if running[i] > 0 => running[i] -= 1,
                _ => {}
            }
            if next() % 2 == 0 {
                let want = running[i] + (next() % 4) as u32;
                caps[i] = fleet[i].refresh(&[demand(limit, running[i], want)]).await[0];
            }
            let sum: u32 = running.iter().sum();
            assert!(sum <= limit, "round {round}: {running:?} caps {caps:?}");
        }
        if round == 110 {
            // The vanished instance's requests end (their streams broke).
            running[2] = 0;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test]
async fn a_queue_report_reaches_the_others_with_its_arrival_rates() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let fleet = handles(&redis.url(), "t5:", 2);
    let report = QueueReport {
        pool: "p".into(),
        active: 5,
        depths: vec![1, 7],
        fronts: vec![Some(Duration::from_millis(10)), None],
        arrivals: Some(vec![2.5, 40.25]),
    };
    fleet[0]
        .exchange(&[demand(3, 1, 2)], std::slice::from_ref(&report))
        .await;
    let mine = QueueReport {
        pool: "p".into(),
        ..QueueReport::default()
    };
    let seen = fleet[1]
        .exchange(&[demand(3, 0, 0)], std::slice::from_ref(&mine))
        .await;
    let theirs = seen.queues.expect("the store answered");
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0].pool, "p");
    assert_eq!((theirs[0].active, &theirs[0].depths), (5, &vec![1, 7]));
    assert_eq!(theirs[0].arrivals, Some(vec![2.5, 40.25]));
}
