//! The hash of the maps a request looks names up in (a model's pool, a
//! pool's pending gate): FNV-1a over the name's bytes, about a tenth of the
//! instructions of the standard map's SipHash on a short name (0.2 k a
//! lookup). The keys come from the config, not from clients, so no client
//! can make them collide; a name a client sends costs one hash and a probe.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a, 64 bits.
#[derive(Debug, Clone, Copy)]
pub struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map from names to `V` under [`NameHasher`].
pub type NameMap<V> = HashMap<String, V, BuildHasherDefault<NameHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// The published FNV-1a test values, and distinct hashes for the
    /// names a config holds.
    #[test]
    fn hashes_as_fnv_1a() {
        let fnv = |s: &[u8]| {
            let mut h = NameHasher::default();
            h.write(s);
            h.finish()
        };
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv(b"foobar"), 0x8594_4171_f739_67e8);
        let build = BuildHasherDefault::<NameHasher>::default();
        let names = [
            "llama",
            "llama-3-8b",
            "qwen",
            "instant",
            "a",
            "b",
            "p",
            "pool-1",
            "pool-2",
        ];
        let mut hashes: Vec<u64> = names.iter().map(|n| build.hash_one(n)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), names.len());
        let map: NameMap<usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), i))
            .collect();
        for (i, n) in names.iter().enumerate() {
            assert_eq!(map.get(*n), Some(&i));
        }
        assert_eq!(map.get("llama-3"), None);
    }
}
