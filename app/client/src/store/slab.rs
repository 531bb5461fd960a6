//! Where values live inside the store's leases (docs/kv.md, "Inside the store"): a slab allocator in the manner of
//! memcached's. Each lease is cut into pages of [`Slab::page_size`] bytes; a page is given to one size class the
//! first time that class needs room and is cut into slots of the class's size (powers of two from
//! [`MIN_SLOT`] up to the page size). A value takes one slot of the smallest class that holds it.
//!
//! A fresh page comes from the lease with the most free pages, so values spread over the leases (and their
//! appliances). Free slots and free pages are kept only for leases that take new values ("placing"): a lease that stops
//! placing (its appliance drains, it was revoked) has its free room forgotten, and a slot freed there later is
//! dropped rather than listed. No `unsafe`, no I/O: the store's tests script it directly.

/// The smallest slot.
pub const MIN_SLOT: u64 = 64;

/// One slot: which lease (the store's number for it) and the byte offset inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    pub lease: u32,
    pub offset: u64,
}

#[derive(Debug)]
struct LeaseRoom {
    placing: bool,
    free_pages: Vec<u64>,
    pages: u64,
}

/// The size classes, their free slots and each lease's free pages.
#[derive(Debug)]
pub struct Slab {
    page_size: u64,
    /// Per class: free slots, each in a placing lease.
    free: Vec<Vec<Slot>>,
    /// Per class: pages given to it (for the statistics and the page-stealing choice).
    class_pages: Vec<u64>,
    leases: Vec<LeaseRoom>,
}

impl Slab {
    /// Slabs for values of at most `max_value` bytes: pages of `max_value` rounded up to a power of two (at least
    /// [`MIN_SLOT`]).
    pub fn new(max_value: u64) -> Slab {
        let page_size = max_value.max(MIN_SLOT).next_power_of_two();
        let classes = (page_size / MIN_SLOT).trailing_zeros() as usize + 1;
        Slab { page_size, free: vec![Vec::new(); classes], class_pages: vec![0; classes], leases: Vec::new() }
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    pub fn classes(&self) -> usize {
        self.free.len()
    }

    /// The class of a value of `len` bytes, or `None` when it is larger than a page.
    pub fn class_of(&self, len: u64) -> Option<usize> {
        if len > self.page_size {
            return None;
        }
        let slot = len.max(MIN_SLOT).next_power_of_two();
        Some((slot / MIN_SLOT).trailing_zeros() as usize)
    }

    /// The slot size of class `c`.
    pub fn slot_size(&self, c: usize) -> u64 {
        MIN_SLOT << c
    }

    /// Adds a lease of `size` bytes (whole pages of it are used); its number.
    pub fn add_lease(&mut self, size: u64) -> u32 {
        let pages = size / self.page_size;
        // Handed out from the low end first.
        let free_pages = (0..pages).rev().map(|p| p * self.page_size).collect();
        self.leases.push(LeaseRoom { placing: pages > 0, free_pages, pages });
        (self.leases.len() - 1) as u32
    }

    /// Whether lease `l` takes new values.
    pub fn placing(&self, l: u32) -> bool {
        self.leases.get(l as usize).is_some_and(|r| r.placing)
    }

    /// Stops placing on lease `l` (drained, revoked): its free room is forgotten.
    pub fn stop_placing(&mut self, l: u32) {
        if let Some(r) = self.leases.get_mut(l as usize) {
            r.placing = false;
            r.free_pages.clear();
        }
        for f in &mut self.free {
            f.retain(|s| s.lease != l);
        }
    }

    /// A free slot of class `c` in a placing lease, cutting a fresh page for the class when none is free and
    /// `allowed(lease)` says a page of that lease may be taken.
    pub fn take(&mut self, c: usize, allowed: impl Fn(u32) -> bool) -> Option<Slot> {
        if let Some(i) = self.free[c].iter().rposition(|s| allowed(s.lease)) {
            return Some(self.free[c].swap_remove(i));
        }
        let size = self.slot_size(c);
        // The lease with the most free pages (the first of equals): values spread over the leases, and so
        // over the appliances.
        let (l, room) = self
            .leases
            .iter_mut()
            .enumerate()
            .filter(|(l, r)| r.placing && !r.free_pages.is_empty() && allowed(*l as u32))
            .min_by_key(|(_, r)| std::cmp::Reverse(r.free_pages.len()))?;
        let (l, page) = (l as u32, room.free_pages.pop()?);
        self.class_pages[c] += 1;
        let per_page = self.page_size / size;
        // The rest of the page, lowest offsets taken first.
        for k in (1..per_page).rev() {
            self.free[c].push(Slot { lease: l, offset: page + k * size });
        }
        Some(Slot { lease: l, offset: page })
    }

    /// Gives back slot `s` of class `c` (dropped when its lease no longer places).
    pub fn give(&mut self, c: usize, s: Slot) {
        if self.placing(s.lease) {
            self.free[c].push(s);
        }
    }

    /// Takes back the page at `page` of lease `l` from class `c` (every value in it already gone): its free slots
    /// leave the class's list and the page is free for any class.
    pub fn reclaim_page(&mut self, c: usize, l: u32, page: u64) {
        let end = page + self.page_size;
        self.free[c].retain(|s| !(s.lease == l && (page..end).contains(&s.offset)));
        self.class_pages[c] = self.class_pages[c].saturating_sub(1);
        if let Some(r) = self.leases.get_mut(l as usize)
            && r.placing
        {
            r.free_pages.push(page);
        }
    }

    /// Pages given to class `c`.
    pub fn pages_of(&self, c: usize) -> u64 {
        self.class_pages[c]
    }

    /// Free bytes in placing leases: whole free pages plus free slots.
    pub fn free_bytes(&self) -> u64 {
        let pages: u64 = self.leases.iter().map(|r| r.free_pages.len() as u64 * self.page_size).sum();
        let slots: u64 = self.free.iter().enumerate().map(|(c, f)| f.len() as u64 * self.slot_size(c)).sum();
        pages + slots
    }

    /// Bytes of every lease's pages.
    pub fn capacity(&self) -> u64 {
        self.leases.iter().filter(|r| r.placing).map(|r| r.pages * self.page_size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_up_to_the_page() {
        let s = Slab::new(1 << 20);
        assert_eq!(s.page_size(), 1 << 20);
        assert_eq!(s.class_of(0), Some(0));
        assert_eq!(s.class_of(64), Some(0));
        assert_eq!(s.class_of(65), Some(1));
        assert_eq!(s.class_of(4096), Some(6));
        assert_eq!(s.class_of(1 << 20), Some(s.classes() - 1));
        assert_eq!(s.class_of((1 << 20) + 1), None);
        assert_eq!(s.slot_size(s.classes() - 1), 1 << 20);
        // A maximum that is no power of two: the page is the next one.
        assert_eq!(Slab::new(100_000).page_size(), 131_072);
    }

    #[test]
    fn a_page_is_cut_into_slots_and_given_back() {
        let mut s = Slab::new(4096);
        let l = s.add_lease(3 * 4096 + 100); // three whole pages
        assert_eq!(s.capacity(), 3 * 4096);
        let c = s.class_of(1024).unwrap();
        let a = s.take(c, |_| true).unwrap();
        assert_eq!(a, Slot { lease: l, offset: 0 });
        let b = s.take(c, |_| true).unwrap();
        assert_eq!(b.offset, 1024);
        assert_eq!(s.free_bytes(), 2 * 4096 + 2 * 1024);
        s.give(c, a);
        assert_eq!(s.take(c, |_| true).unwrap(), a);
        // Three pages in all: a fourth is not there.
        let big = s.class_of(4096).unwrap();
        assert!(s.take(big, |_| true).is_some());
        assert!(s.take(big, |_| true).is_some());
        assert_eq!(s.take(big, |_| true), None);
        assert_eq!(s.pages_of(big), 2);
    }

    #[test]
    fn a_lease_that_stops_placing_takes_nothing_more() {
        let mut s = Slab::new(4096);
        let a = s.add_lease(2 * 4096);
        let b = s.add_lease(2 * 4096);
        let c = s.class_of(64).unwrap();
        let x = s.take(c, |_| true).unwrap();
        assert_eq!(x.lease, a);
        s.stop_placing(a);
        let y = s.take(c, |_| true).unwrap();
        assert_eq!(y.lease, b, "the drained lease's free slots were forgotten");
        s.give(c, x);
        assert!(s.free[c].iter().all(|s| s.lease == b), "a slot given back to a drained lease is dropped");
        assert_eq!(s.take(c, |l| l != b), None, "only lease b places");
    }

    #[test]
    fn a_reclaimed_page_serves_another_class() {
        let mut s = Slab::new(4096);
        s.add_lease(4096);
        let small = s.class_of(64).unwrap();
        let x = s.take(small, |_| true).unwrap();
        let big = s.class_of(4096).unwrap();
        assert_eq!(s.take(big, |_| true), None);
        s.give(small, x);
        s.reclaim_page(small, x.lease, 0);
        assert_eq!(s.pages_of(small), 0);
        assert_eq!(s.take(big, |_| true), Some(Slot { lease: 0, offset: 0 }));
        assert_eq!(s.take(small, |_| true), None, "the small class's slots of that page are gone");
    }
}
