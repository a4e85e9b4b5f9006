//! Request-body extraction on arbitrary client bytes: never panics, and
//! whatever it accepts is JSON whose `model` is the model it found.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(meta) = llmlb::server::request::extract(data) {
        let v: serde_json::Value = serde_json::from_slice(data).expect("accepted invalid JSON");
        assert_eq!(v["model"].as_str(), Some(meta.model.as_str()));
        let _ = meta.estimated_prompt_tokens();
    }
});
