//! The bytes of request bodies held at once, across all connections: each
//! request reserves its body's size (the declared `Content-Length` before
//! reading, the actual size after) until it has been forwarded, and a
//! reservation beyond `server.max_buffered_bytes` is refused (503
//! `server_busy`), so many slow or large uploads cannot exhaust memory.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub struct BodyBudget {
    used: AtomicUsize,
}

/// Bytes reserved in a [`BodyBudget`], given back on drop.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a BodyBudget,
    bytes: usize,
}

impl BodyBudget {
    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// An empty reservation, grown with [`Reservation::grow`].
    pub fn empty(&self) -> Reservation<'_> {
        Reservation {
            budget: self,
            bytes: 0,
        }
    }
}

impl Reservation<'_> {
    /// Reserves `more` bytes unless that takes the total over `limit`.
    pub fn grow(&mut self, more: usize, limit: usize) -> bool {
        let taken = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|&total| total <= limit)
            });
        if taken.is_ok() {
            self.bytes += more;
        }
        taken.is_ok()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit_and_give_back_on_drop() {
        let b = BodyBudget::default();
        let mut a = b.empty();
        assert!(a.grow(600, 1000));
        let mut c = b.empty();
        assert!(!c.grow(500, 1000), "600 + 500 > 1000");
        assert!(c.grow(400, 1000));
        assert_eq!(b.used(), 1000);
        drop(a);
        assert_eq!(b.used(), 400);
        drop(c);
        assert_eq!(b.used(), 0);
    }
}
