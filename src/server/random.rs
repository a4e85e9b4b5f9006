//! Random bits for the request path (request ids, the router's draw): a
//! fast generator per thread (`SmallRng`, seeded from the OS), not
//! `rand::random`'s ChaCha, whose block refills and thread-local handle
//! cost about 0.3 k instructions a request. Neither use needs secrecy: an
//! id must be unique, a draw uniform (Envoy's request ids come from a
//! non-cryptographic generator too).

use std::cell::RefCell;

use rand::distr::{Distribution, StandardUniform};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static FAST: RefCell<SmallRng> = RefCell::new(SmallRng::from_os_rng());
}

/// A random value from this thread's generator.
pub fn random<T>() -> T
where
    StandardUniform: Distribution<T>,
{
    FAST.with(|rng| rng.borrow_mut().random())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ_and_threads_are_seeded_apart() {
        let here: [u64; 4] = std::array::from_fn(|_| random());
        assert!(here.windows(2).all(|w| w[0] != w[1]), "{here:?}");
        let there: u64 = std::thread::spawn(random).join().unwrap();
        assert!(!here.contains(&there));
    }
}
