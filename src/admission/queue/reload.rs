//! A pool queue across a config reload: kept when its shape is unchanged
//! (only its capacity callback is replaced), else replaced by a queue of the
//! new shape that inherits its requests in flight, its waiters and what it
//! measured, and to which it forwards from then on.

use std::sync::Arc;

use super::{Capacity, PoolQueue, QueueParams};

impl PoolQueue {
    /// Whether a config with `params` can keep using this queue on reload.
    pub fn same_params(&self, params: &QueueParams) -> bool {
        self.params.max_depth == params.max_depth
            && self.params.fair == params.fair
            && self.params.prefix_handoff == params.prefix_handoff
            && self.params.levels.len() == params.levels.len()
            && self.params.levels.iter().zip(&params.levels).all(|(a, b)| {
                a.name == b.name
                    && a.max_wait == b.max_wait
                    && a.promote_after == b.promote_after
                    && a.ttft_objective == b.ttft_objective
            })
    }

    /// A queue with new `params` that takes this one's place: it starts with
    /// this queue's requests in flight counted as active and its waiters in
    /// line (at the same level, or the lowest new one), and from now on this
    /// queue passes admissions, cancellations and releases to it. Permits
    /// handed out by this queue stay valid and free their slot in the new
    /// one.
    pub fn replace(self: &Arc<Self>, params: QueueParams, capacity: Capacity) -> Arc<PoolQueue> {
        let mut old = self.lock();
        if let Some(next) = old.successor.clone() {
            drop(old);
            return next.replace(params, capacity);
        }
        let next = PoolQueue::counting_from(params, capacity, self.origin);
        {
            let mut inner = next.lock();
            inner.active = old.active;
            inner.started = std::mem::take(&mut old.started);
            inner.next_id = old.next_id;
            inner.drain = old.drain.clone();
            let top = inner.waiting.len() - 1;
            for (level, q) in old.waiting.iter_mut().enumerate() {
                inner.waiting[level.min(top)].absorb(std::mem::take(q));
            }
        }
        old.active = 0;
        old.successor = Some(Arc::clone(&next));
        drop(old);
        next.poke();
        next
    }

    pub(super) fn successor(&self) -> Option<Arc<PoolQueue>> {
        self.lock().successor.clone()
    }

    /// Replaces where capacity comes from (a reload changed the replicas)
    /// and grants waiters the new capacity allows.
    pub fn set_capacity(&self, capacity: Capacity) {
        self.capacity.store(std::sync::Arc::new(capacity));
        self.poke();
    }
}
