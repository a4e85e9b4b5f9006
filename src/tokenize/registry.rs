//! Loaded model tokenizers, shared per directory: config validation, the
//! topology build and every reload ask for the same directory and get the
//! same `Arc` while its files are unchanged (same sizes and modification
//! times), so a tokenizer is parsed once, not once per reload.
//!
//! Used at startup and reload only, never on the request path; the lock is
//! held while a directory loads.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::model::{LoadError, ModelTokenizer};

const FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];

type Stamp = Vec<Option<(u64, SystemTime)>>;

static LOADED: Mutex<Vec<(PathBuf, Stamp, Arc<ModelTokenizer>)>> = Mutex::new(Vec::new());

fn stamp(dir: &Path) -> Stamp {
    FILES
        .iter()
        .map(|f| {
            let m = std::fs::metadata(dir.join(f)).ok()?;
            Some((m.len(), m.modified().ok()?))
        })
        .collect()
}

/// The tokenizer of `dir`, loaded now or earlier if its files are unchanged.
pub fn load_shared(dir: &Path) -> Result<Arc<ModelTokenizer>, LoadError> {
    let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let now = stamp(&key);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, t)) = loaded.iter().find(|(d, s, _)| *d == key && *s == now) {
        return Ok(Arc::clone(t));
    }
    let t = Arc::new(ModelTokenizer::load(dir)?);
    loaded.retain(|(d, _, _)| *d != key);
    loaded.push((key, now, Arc::clone(&t)));
    Ok(t)
}
