//! The process's allocator: mimalloc, asked for an alignment only when a
//! type needs more than a machine word.
//!
//! A proxied request makes tens of small, short-lived allocations across
//! the worker threads, which mimalloc's per-thread free lists serve in a
//! fraction of glibc malloc's instructions (docs/BENCHMARKS.md, "Proxy
//! cost"). The `mimalloc` crate's allocator passes every request through
//! `mi_malloc_aligned`; in mimalloc 3 that call takes its fast path only for
//! blocks up to 1 KiB, and larger ones (a connection's task, a request's
//! future) go through the over-allocating fallback. Every mimalloc block is
//! aligned to at least a word, so a layout that asks no more than that is
//! served by plain `mi_malloc`, as the C library's `malloc` would serve it.
//!
//! Built without transparent huge pages (`no_thp`): with them, the first
//! touch of fresh memory zeroed 2 MiB at a time, most of llmlb's CPU in the
//! first seconds of a run (docs/lab/allocator-huge-pages.md).
//!
//! This file is part of the binary, not of the library (which has no unsafe
//! code); `examples/hyper_floor.rs` includes it too, so the floor that
//! llmlb's request cost is measured against runs on the same allocator.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The alignment every mimalloc block has, whatever its size.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc, with the alignment left out where the block's own suffices.
pub struct Allocator;

/// A mimalloc allocation function without an alignment, and its aligned twin.
type Plain = unsafe extern "C" fn(usize) -> *mut c_void;
type Aligned = unsafe extern "C" fn(usize, usize) -> *mut c_void;

/// `layout`'s block from `plain` when a word's alignment suffices, else
/// from `aligned`.
///
/// # Safety
/// As `GlobalAlloc::alloc`: `layout` has a non-zero size.
#[inline(always)]
unsafe fn block(layout: Layout, plain: Plain, aligned: Aligned) -> *mut u8 {
    // SAFETY: mimalloc's allocation functions take any size and any
    // power-of-two alignment, which a `Layout` always has.
    unsafe {
        if layout.align() <= WORD {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

// SAFETY: each method hands its layout to the mimalloc call that honours
// it: the size always, the alignment either explicitly or, when it is at
// most a word, through mimalloc's guarantee that every block is
// word-aligned. Blocks are freed with `mi_free`, which takes both kinds.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { block(layout, mi_malloc, mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { block(layout, mi_zalloc, mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`'s alignment,
        // which the new block keeps.
        unsafe {
            if layout.align() <= WORD {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the `n` bytes at `p` are all `byte` (compared as slices:
    /// one `memcmp`, quick in a debug build too).
    ///
    /// # Safety
    /// `p` points to `n` initialised bytes.
    unsafe fn all(p: *const u8, n: usize, byte: u8) -> bool {
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts(p, n) == vec![byte; n].as_slice() }
    }

    /// Every size class from a byte to past a huge page, at every
    /// alignment up to a page: the block is aligned as asked, writable over
    /// its whole size, zeroed when asked, and keeps its bytes and alignment
    /// when it grows and shrinks.
    #[test]
    fn blocks_have_the_layouts_alignment_and_keep_their_bytes() {
        let a = Allocator;
        let sizes = (0..23).flat_map(|shift| {
            let s = 1usize << shift;
            [s, s + 1, s + s / 2 + 8]
        });
        for size in sizes {
            for align in (0..13).map(|shift| 1usize << shift) {
                let layout = Layout::from_size_align(size, align).unwrap();
                let half = size.div_ceil(2);
                // SAFETY: the layout has a non-zero size; each block is
                // written and read within its size and freed once, with
                // its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    p.write_bytes(0xA5, size);
                    let grown = a.realloc(p, layout, size * 2);
                    assert_eq!(
                        grown as usize % align,
                        0,
                        "grown: size {size}, align {align}"
                    );
                    assert!(all(grown, size, 0xA5));
                    let grown_layout = Layout::from_size_align(size * 2, align).unwrap();
                    let shrunk = a.realloc(grown, grown_layout, half);
                    assert_eq!(shrunk as usize % align, 0);
                    assert!(all(shrunk, half, 0xA5));
                    a.dealloc(shrunk, Layout::from_size_align(half, align).unwrap());

                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!(all(z, size, 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
