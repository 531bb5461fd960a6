//! Fixed-capacity single-producer single-consumer rings between cores (docs/architecture.md "Cores and roles").
//! The producer and consumer halves are separate, non-`Clone` values, so each side has exactly one owner;
//! head and tail are atomics, and each slot has its own lock that only one side ever contends for briefly
//! (the consumer takes a slot only after the producer published it), which keeps this free of `unsafe`.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use spin::Mutex;

/// `head` and `tail` count items for ever and wrap at `usize::MAX` to 0 (`wrapping_add`); the number held is
/// `tail - head` (wrapping) and an item's slot is its count modulo the capacity. That slot stays continuous across
/// the wrap only when the capacity divides 2^64, so the capacity is a power of two: with 3, the items counted
/// `usize::MAX` and 0 would share slot 0, and the second would overwrite the first before it was read
/// (`counters_wrap_at_usize_max`). At a million items a second the wrap is 584,000 years away, but the ring is
/// right there too.
struct Inner<T> {
    slots: Vec<Mutex<Option<T>>>,
    /// Next slot the consumer reads (count of items taken, wrapping).
    head: AtomicUsize,
    /// Next slot the producer writes (count of items pushed, wrapping).
    tail: AtomicUsize,
}

pub struct Producer<T> {
    inner: Arc<Inner<T>>,
}

pub struct Consumer<T> {
    inner: Arc<Inner<T>>,
}

/// A ring holding up to `capacity` items, a power of two (the engines' rings are 8 to 256).
pub fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    ring_from(capacity, 0)
}

/// A ring whose counters start at `start` (tests start them just below their wrap).
fn ring_from<T>(capacity: usize, start: usize) -> (Producer<T>, Consumer<T>) {
    assert!(capacity.is_power_of_two(), "a ring's capacity is a power of two (its counters wrap at 2^64)");
    let inner = Arc::new(Inner {
        slots: (0..capacity).map(|_| Mutex::new(None)).collect(),
        head: AtomicUsize::new(start),
        tail: AtomicUsize::new(start),
    });
    (Producer { inner: inner.clone() }, Consumer { inner })
}

impl<T> Producer<T> {
    /// Adds `item`, or gives it back when the ring is full.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        let tail = self.inner.tail.load(Ordering::Relaxed);
        let head = self.inner.head.load(Ordering::Acquire);
        let cap = self.inner.slots.len();
        if tail.wrapping_sub(head) >= cap {
            return Err(item);
        }
        *self.inner.slots[tail % cap].lock() = Some(item);
        self.inner.tail.store(tail.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    pub fn free(&self) -> usize {
        let tail = self.inner.tail.load(Ordering::Relaxed);
        let head = self.inner.head.load(Ordering::Acquire);
        self.inner.slots.len() - tail.wrapping_sub(head)
    }
}

impl<T> Consumer<T> {
    pub fn pop(&mut self) -> Option<T> {
        let head = self.inner.head.load(Ordering::Relaxed);
        let tail = self.inner.tail.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let cap = self.inner.slots.len();
        let item = self.inner.slots[head % cap].lock().take();
        self.inner.head.store(head.wrapping_add(1), Ordering::Release);
        item
    }

    pub fn len(&self) -> usize {
        let head = self.inner.head.load(Ordering::Relaxed);
        self.inner.tail.load(Ordering::Acquire).wrapping_sub(head)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_capacity() {
        let (mut p, mut c) = ring::<u32>(4);
        assert_eq!(c.pop(), None);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9));
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        assert_eq!((c.pop(), c.pop(), c.pop(), c.pop(), c.pop()), (Some(1), Some(2), Some(3), Some(4), None));
    }

    /// The counters started just below `usize::MAX`: items pass in order across the wrap, a full ring stays
    /// full across it (and `len`/`free` stay right), for each capacity the engines use.
    #[test]
    fn counters_wrap_at_usize_max() {
        for cap in [1usize, 8, 16, 64, 256] {
            for start in [usize::MAX - cap, usize::MAX - 1, usize::MAX] {
                let (mut p, mut c) = ring_from::<usize>(cap, start);
                let mut next = 0;
                let mut want = 0;
                for round in 0..3 * cap + 2 {
                    // Fill it, check it is full, then take a varying number out.
                    while p.push(next).is_ok() {
                        next += 1;
                    }
                    assert_eq!((c.len(), p.free()), (cap, 0), "cap {cap} start {start:#x} round {round}");
                    for _ in 0..=(round % cap) {
                        assert_eq!(c.pop(), Some(want), "cap {cap} start {start:#x}");
                        want += 1;
                    }
                }
                while let Some(v) = c.pop() {
                    assert_eq!(v, want);
                    want += 1;
                }
                assert_eq!((want, c.len(), p.free()), (next, 0, cap));
                assert!(c.inner.head.load(Ordering::Relaxed) < start, "cap {cap}: the counters wrapped");
            }
        }
    }

    /// With a capacity that does not divide 2^64 the item counted `usize::MAX` and the next one would share a
    /// slot: such a ring is refused.
    #[test]
    #[should_panic(expected = "power of two")]
    fn a_capacity_that_is_not_a_power_of_two_is_refused() {
        let _ = ring::<u8>(3);
    }

    #[test]
    fn two_threads_pass_a_million_items_in_order() {
        let (mut p, mut c) = ring::<u64>(64);
        let n = 1_000_000u64;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                if p.push(i).is_ok() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut want = 0;
        while want < n {
            if let Some(v) = c.pop() {
                assert_eq!(v, want);
                want += 1;
            }
        }
        t.join().unwrap();
    }
}
