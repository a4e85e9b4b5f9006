//! `llmlb demo --quick` runs end to end (simulated fleet, proxy, load per
//! balancer), prints its table and leaves nothing running; by default its
//! output is its own (header, progress, table) with no log lines mixed in.

use std::process::{Command, Output};

const BALANCERS: [&str; 5] = ["round_robin", "least_connections", "jsq", "hash", "cache"];

/// Runs `llmlb demo --quick` with `RUST_LOG` unset or set to `rust_log`.
fn demo(args: &[&str], rust_log: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llmlb"));
    cmd.args(["demo", "--quick"]).args(args);
    match rust_log {
        Some(filter) => cmd.env("RUST_LOG", filter),
        None => cmd.env_remove("RUST_LOG"),
    };
    let out = cmd.output().expect("run llmlb demo");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `tracing` text line: a timestamp, then the level.
fn is_log_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let stamp = words.next().unwrap_or("");
    let level = words.next().unwrap_or("");
    stamp.starts_with("20")
        && stamp.contains('T')
        && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
}

#[test]
fn quick_demo_prints_a_row_per_balancer_and_no_log_lines() {
    let dir = std::env::temp_dir().join(format!("llmlb-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("demo.svg");
    let out = demo(&["--svg", plot.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let header = stdout
        .lines()
        .position(|l| l.starts_with("balancer") && l.contains("prefix hits"))
        .unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    let rows: Vec<&str> = stdout.lines().skip(header + 2).take(5).collect();
    for (row, balancer) in rows.iter().zip(BALANCERS) {
        assert!(row.starts_with(balancer), "{row}");
        // Every request completed, and the replicas reported prefix hits.
        assert!(row.trim_end().ends_with("32/0"), "{row}");
        assert!(row.contains('%'), "{row}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..40.min(svg.len())]
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Quiet by default: stdout holds no log line, and stderr holds exactly
    // one progress line per balancer, in order.
    assert!(
        !stdout.lines().any(is_log_line),
        "log lines on stdout:\n{stdout}"
    );
    let progress: Vec<String> = BALANCERS
        .iter()
        .map(|b| format!("running {b} ..."))
        .collect();
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        progress,
        "stderr is more than the progress lines:\n{stderr}"
    );
}

#[test]
fn rust_log_turns_the_fleet_and_proxy_log_lines_back_on() {
    let dir = std::env::temp_dir().join(format!("llmlb-demo-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("demo.svg");
    let out = demo(
        &[
            "--balancers",
            "round_robin",
            "--svg",
            plot.to_str().unwrap(),
        ],
        Some("info"),
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().any(|l| is_log_line(l) && l.contains("INFO")),
        "no INFO line with RUST_LOG=info:\n{stderr}"
    );
    assert!(
        stderr.lines().any(|l| l == "running round_robin ..."),
        "{stderr}"
    );
}
