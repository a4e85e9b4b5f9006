//! `llmlb check` on the shipped example configs and on a broken file.

use std::path::Path;
use std::process::Command;

fn check(path: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["check", "--config"])
        .arg(path)
        .output()
        .expect("run llmlb check")
}

#[test]
fn every_example_config_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut checked = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "toml") && !is_sim_profile(&path) {
                let out = check(&path);
                assert!(
                    out.status.success(),
                    "{} rejected:\n{}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "only {checked} configs found");
}

/// Simulator profile files under `config/sim/` are not proxy configs.
fn is_sim_profile(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "sim")
}

#[test]
fn broken_config_is_rejected_with_dotted_keys() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/broken.toml");
    let out = check(&path);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.toml: pools[0].replicas[1].url:"),
        "{err}"
    );
    assert!(err.contains("needs a scheme"), "{err}");
    assert!(
        err.contains("broken.toml: pools[0].replicas[1].weight: must be at least 1"),
        "{err}"
    );
    assert!(err.contains("2 error(s)"), "{err}");
}

#[test]
fn unknown_key_is_named() {
    let dir = std::env::temp_dir().join(format!("llmlb-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("typo.toml");
    std::fs::write(
        &path,
        "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nbalancr = \"round_robin\"\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("typo.toml: pools[0]"), "{err}");
    assert!(err.contains("balancr"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_file_is_reported() {
    let out = check(Path::new("/nonexistent/llmlb.toml"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read file"));
}

#[test]
fn every_section_with_a_mistake_is_named_in_one_run() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/several_mistakes.toml");
    let out = check(&path);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("several_mistakes.toml: pools[1].timeouts.connect: a duration needs a unit"),
        "{err}"
    );
    assert!(
        err.contains("several_mistakes.toml: server.max_body_byts: unknown field"),
        "{err}"
    );
    assert!(err.contains("2 error(s)"), "{err}");
}

#[test]
fn a_prefix_mode_that_events_would_serve_better_gets_a_hint_and_still_passes() {
    let dir = tempfile_dir();
    let path = dir.join("events.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"cache\"\n\
         [[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\nkv_events = \"tcp://127.0.0.1:5557\"\n",
    )
    .unwrap();
    let out = check(&path);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hint: prefix mode \"cache\" while replicas publish KV events"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("llmlb-check-hint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
