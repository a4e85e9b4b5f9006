//! `llmlb demo --quick` runs end to end (simulated fleet, proxy, load per
//! balancer), prints its table and leaves nothing running.

use std::process::Command;

#[test]
fn quick_demo_prints_a_row_per_balancer() {
    let dir = std::env::temp_dir().join(format!("llmlb-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("demo.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["demo", "--quick", "--plot"])
        .arg(&plot)
        .env("RUST_LOG", "error")
        .output()
        .expect("run llmlb demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = stdout
        .lines()
        .position(|l| l.starts_with("balancer") && l.contains("prefix hits"))
        .unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    let rows: Vec<&str> = stdout.lines().skip(header + 2).take(5).collect();
    for (row, balancer) in
        rows.iter()
            .zip(["round_robin", "least_connections", "jsq", "hash", "cache"])
    {
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
}
