//! docs/CONFIG.md against the config schema: every key the parser accepts
//! is documented there (as a `` `dotted.key` `` row), and every key
//! documented there is one the parser accepts. The schema is read from the
//! parser itself: an unknown key in a table makes it list the table's keys
//! (`deny_unknown_fields`), so the walk needs no list of its own.

use std::collections::BTreeSet;

const UNKNOWN: &str = "zz_not_a_key";

/// The keys of the table at `path` (each segment `name` or `name[]` for an
/// array of tables), or None when it is not a table of known fields.
fn keys_of(path: &[String]) -> Option<Vec<String>> {
    let mut text = String::new();
    for i in 1..=path.len() {
        let header: Vec<&str> = path[..i].iter().map(|s| s.trim_end_matches("[]")).collect();
        let header = header.join(".");
        if path[i - 1].ends_with("[]") {
            text.push_str(&format!("[[{header}]]\n"));
        } else {
            text.push_str(&format!("[{header}]\n"));
        }
    }
    if path.is_empty() {
        text.clear();
    }
    text.push_str(&format!("{UNKNOWN} = 1\n"));
    let issues = match llmlb::config::parse(&text) {
        Ok(_) => return None,
        Err(issues) => issues,
    };
    let issue = issues.iter().find(|i| i.key.ends_with(UNKNOWN))?;
    let reason = &issue.reason;
    if reason.contains("there are no fields") {
        return Some(Vec::new());
    }
    // serde: "expected `a`", "expected `a` or `b`", "expected one of `a`, `b`, ...".
    let list = reason.split_once("expected ")?.1;
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every dotted key of the schema: tables as `a.b`, their keys as `a.b.c`
/// (arrays of tables without brackets, as the reference writes them).
fn schema_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let Some(keys) = keys_of(&path) else { continue };
        for k in keys {
            let mut dotted: Vec<String> = path
                .iter()
                .map(|s| s.trim_end_matches("[]").to_owned())
                .collect();
            dotted.push(k.clone());
            out.insert(dotted.join("."));
            for form in [k.clone(), format!("{k}[]")] {
                let mut child = path.clone();
                child.push(form);
                if child.len() <= 5 && keys_of(&child).is_some() {
                    todo.push(child);
                    break;
                }
            }
        }
    }
    out
}

/// The keys docs/CONFIG.md documents: the first cell of each table row,
/// when it is a backticked dotted key.
fn documented_keys(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|k| !k.is_empty() && !k.contains(' '))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_reference_documents_every_key_of_the_schema_and_no_other() {
    let schema = schema_keys();
    assert!(
        schema.contains("pools.replicas.url") && schema.contains("server.listen"),
        "the schema walk found too little: {schema:?}"
    );
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIG.md"))
        .expect("docs/CONFIG.md");
    let documented = documented_keys(&doc);
    let missing: Vec<_> = schema.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&schema).collect();
    if std::env::var_os("LLMLB_PRINT_SCHEMA").is_some() {
        for k in &schema {
            println!("{k}");
        }
    }
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/CONFIG.md is out of step with the config schema.\n\
         keys the parser accepts that CONFIG.md does not document: {missing:?}\n\
         keys CONFIG.md documents that the parser rejects: {unknown:?}"
    );
}
