//! The config parser and validator on arbitrary text: never panics, and a
//! rejection always says why.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(issues) = llmlb::config::parse(text) {
        assert!(!issues.is_empty());
    }
});
