//! Fixed-capacity single-producer single-consumer rings between cores (docs/architecture.md "Cores and roles").
//! The producer and consumer halves are separate, non-`Clone` values, so each side has exactly one owner;
//! head and tail are atomics, and each slot has its own lock that only one side ever contends for briefly
//! (the consumer takes a slot only after the producer published it), which keeps this free of `unsafe`.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use spin::Mutex;

struct Inner<T> {
    slots: Vec<Mutex<Option<T>>>,
    /// Next slot the consumer reads (count of items taken).
    head: AtomicUsize,
    /// Next slot the producer writes (count of items pushed).
    tail: AtomicUsize,
}

pub struct Producer<T> {
    inner: Arc<Inner<T>>,
}

pub struct Consumer<T> {
    inner: Arc<Inner<T>>,
}

/// A ring holding up to `capacity` items.
pub fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    assert!(capacity > 0);
    let inner = Arc::new(Inner {
        slots: (0..capacity).map(|_| Mutex::new(None)).collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
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
        let (mut p, mut c) = ring::<u32>(3);
        assert_eq!(c.pop(), None);
        for i in 0..3 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9));
        assert_eq!(c.pop(), Some(0));
        p.push(3).unwrap();
        assert_eq!((c.pop(), c.pop(), c.pop(), c.pop()), (Some(1), Some(2), Some(3), None));
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
