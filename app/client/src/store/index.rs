//! The store's index (docs/kv.md, "Inside the store"): which key lives in which slot ([`super::slab`]), the
//! least-recently-used order per size class, and the slots that transfers still use.
//!
//! - A put first **reserves** a slot (the value is not visible yet), writes it, then **commits** it: the key
//!   points at the new slot and its old slot (if any) is given back. A failed write **aborts**: the slot goes
//!   back, the old value stays.
//! - A get **pins** the entry while its read runs: eviction skips pinned entries, and an entry removed (or
//!   replaced, or evicted) while pinned keeps its slot until the last pin goes, so a slot is never written
//!   while a read of its old value is in flight.
//! - When a class has no free slot, its least recently used unpinned entry is evicted; when it has none to give,
//!   a page of another class is taken whole (every entry in it evicted), the class with the most pages first.
//! - A lease that is lost ([`Table::drop_lease`]) takes its keys with it at once.
//!
//! No I/O and no clock: the store's unit tests script it.

use std::collections::{BTreeMap, HashMap};

use super::slab::{Slab, Slot};

/// One stored value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Unique for the store's life: a reservation's id becomes its entry's.
    pub id: u64,
    pub slot: Slot,
    pub len: u64,
    pub class: usize,
    tick: u64,
}

/// A slot reserved for a put in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: u64,
    pub slot: Slot,
    pub class: usize,
}

/// Why a slot could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Larger than the store's largest value.
    TooLarge,
    /// Every slot is pinned or reserved, or no lease takes new values.
    NoSpace,
}

#[derive(Debug)]
struct Pin {
    count: u32,
    /// Removed from the index while pinned: the slot to give back at the last unpin.
    dead: Option<(usize, Slot)>,
}

/// The index over the slab.
#[derive(Debug)]
pub struct Table {
    slab: Slab,
    map: HashMap<Vec<u8>, Entry>,
    /// Per class: tick of last use → key.
    lru: Vec<BTreeMap<u64, Vec<u8>>>,
    pins: HashMap<u64, Pin>,
    reserved: HashMap<u64, Reservation>,
    /// Per lease: whether it is lost (revoked, fenced, its appliance rebooted).
    lost: Vec<bool>,
    tick: u64,
    next_id: u64,
    bytes: u64,
}

/// Candidates looked at per eviction before giving up on a class (all pinned: a full batch of reads).
const EVICTION_SCAN: usize = 256;

impl Table {
    pub fn new(max_value: u64) -> Table {
        let slab = Slab::new(max_value);
        let lru = vec![BTreeMap::new(); slab.classes()];
        Table {
            slab,
            map: HashMap::new(),
            lru,
            pins: HashMap::new(),
            reserved: HashMap::new(),
            lost: Vec::new(),
            tick: 0,
            next_id: 1,
            bytes: 0,
        }
    }

    pub fn slab(&self) -> &Slab {
        &self.slab
    }

    /// Adds a lease of `size` bytes; its number.
    pub fn add_lease(&mut self, size: u64) -> u32 {
        self.lost.push(false);
        self.slab.add_lease(size)
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes of the values stored.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn touch_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// A slot for a value of `len` bytes in a lease `allowed` accepts, evicting as needed; the keys evicted come
    /// back with it (or with the refusal: they were evicted anyway, for a page that then still did not do).
    pub fn reserve(
        &mut self,
        len: u64,
        allowed: impl Fn(u32) -> bool + Copy,
    ) -> (Result<Reservation, Refused>, Vec<Vec<u8>>) {
        let mut evicted = Vec::new();
        let Some(class) = self.slab.class_of(len) else { return (Err(Refused::TooLarge), evicted) };
        let slot = self
            .slab
            .take(class, allowed)
            .or_else(|| {
                self.evict_one(class, allowed, &mut evicted)?;
                self.slab.take(class, allowed)
            })
            .or_else(|| {
                self.steal_page(class, allowed, &mut evicted)?;
                self.slab.take(class, allowed)
            });
        let Some(slot) = slot else { return (Err(Refused::NoSpace), evicted) };
        let id = self.next_id;
        self.next_id += 1;
        let r = Reservation { id, slot, class };
        self.reserved.insert(id, r);
        (Ok(r), evicted)
    }

    /// Evicts the least recently used unpinned entry of `class` in a lease `allowed` accepts.
    fn evict_one(&mut self, class: usize, allowed: impl Fn(u32) -> bool, evicted: &mut Vec<Vec<u8>>) -> Option<()> {
        let victim = self.lru[class]
            .values()
            .take(EVICTION_SCAN)
            .find(|k| {
                let e = &self.map[*k];
                !self.pins.contains_key(&e.id) && self.slab.placing(e.slot.lease) && allowed(e.slot.lease)
            })?
            .clone();
        self.remove(&victim);
        evicted.push(victim);
        Some(())
    }

    /// Takes a whole page from another class for `class`: the page of the oldest entry of the class with the
    /// most pages whose page holds nothing pinned or reserved.
    fn steal_page(&mut self, class: usize, allowed: impl Fn(u32) -> bool, evicted: &mut Vec<Vec<u8>>) -> Option<()> {
        let page_size = self.slab.page_size();
        let mut donors: Vec<usize> = (0..self.lru.len()).filter(|&d| d != class && self.slab.pages_of(d) > 0).collect();
        donors.sort_by_key(|&d| std::cmp::Reverse(self.slab.pages_of(d)));
        for d in donors {
            let candidates: Vec<Slot> = self.lru[d]
                .values()
                .take(EVICTION_SCAN)
                .map(|k| self.map[k].slot)
                .filter(|s| self.slab.placing(s.lease) && allowed(s.lease))
                .collect();
            for s in candidates {
                let page = s.offset - s.offset % page_size;
                let in_page = |x: &Slot| x.lease == s.lease && (page..page + page_size).contains(&x.offset);
                let busy = self.reserved.values().any(|r| in_page(&r.slot))
                    || self.map.values().any(|e| in_page(&e.slot) && self.pins.contains_key(&e.id))
                    || self.pins.values().any(|p| p.dead.is_some_and(|(_, x)| in_page(&x)));
                if busy {
                    continue;
                }
                let keys: Vec<Vec<u8>> =
                    self.lru[d].values().filter(|k| in_page(&self.map[*k].slot)).cloned().collect();
                for k in keys {
                    self.remove(&k);
                    evicted.push(k);
                }
                self.slab.reclaim_page(d, s.lease, page);
                return Some(());
            }
        }
        None
    }

    /// The put of `r` landed: `key` is `len` bytes in its slot from now on (its old value's slot goes back).
    /// `false` (and the slot dropped) when the lease was lost meanwhile.
    pub fn commit(&mut self, key: &[u8], r: Reservation, len: u64) -> bool {
        self.reserved.remove(&r.id);
        if self.is_lost(r.slot.lease) {
            return false;
        }
        self.remove(key);
        let tick = self.touch_tick();
        self.lru[r.class].insert(tick, key.to_vec());
        self.map.insert(key.to_vec(), Entry { id: r.id, slot: r.slot, len, class: r.class, tick });
        self.bytes += len;
        true
    }

    /// The put of `r` failed: its slot goes back.
    pub fn abort(&mut self, r: Reservation) {
        if self.reserved.remove(&r.id).is_some() {
            self.slab.give(r.class, r.slot);
        }
    }

    /// `key`'s entry, marked as used now.
    pub fn touch(&mut self, key: &[u8]) -> Option<Entry> {
        let tick = self.touch_tick();
        let e = self.map.get_mut(key)?;
        let old = std::mem::replace(&mut e.tick, tick);
        let e = *e;
        self.lru[e.class].remove(&old);
        self.lru[e.class].insert(tick, key.to_vec());
        Some(e)
    }

    /// `key`'s entry, without marking it used.
    pub fn peek(&self, key: &[u8]) -> Option<Entry> {
        self.map.get(key).copied()
    }

    /// Holds entry `e`'s slot for a read.
    pub fn pin(&mut self, e: &Entry) {
        self.pins.entry(e.id).or_insert(Pin { count: 0, dead: None }).count += 1;
    }

    /// A read of entry `id` ended.
    pub fn unpin(&mut self, id: u64) {
        let Some(p) = self.pins.get_mut(&id) else { return };
        p.count -= 1;
        if p.count == 0
            && let Some(p) = self.pins.remove(&id)
            && let Some((class, slot)) = p.dead
        {
            self.slab.give(class, slot);
        }
    }

    /// Removes `key`; its entry, if it was there.
    pub fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let e = self.map.remove(key)?;
        self.lru[e.class].remove(&e.tick);
        self.bytes -= e.len;
        match self.pins.get_mut(&e.id) {
            Some(p) => p.dead = Some((e.class, e.slot)),
            None => self.slab.give(e.class, e.slot),
        }
        Some(e)
    }

    pub fn is_lost(&self, lease: u32) -> bool {
        self.lost.get(lease as usize).copied().unwrap_or(true)
    }

    /// Lease `lease` is gone: no more placing there, and its keys leave the index; they come back.
    pub fn drop_lease(&mut self, lease: u32) -> Vec<Vec<u8>> {
        if let Some(l) = self.lost.get_mut(lease as usize) {
            *l = true;
        }
        self.slab.stop_placing(lease);
        let keys: Vec<Vec<u8>> =
            self.map.iter().filter(|(_, e)| e.slot.lease == lease).map(|(k, _)| k.clone()).collect();
        for k in &keys {
            self.remove(k);
        }
        keys
    }

    /// Lease `lease` takes no new values (its appliance drains); what it holds stays readable.
    pub fn stop_placing(&mut self, lease: u32) {
        self.slab.stop_placing(lease);
    }

    /// Lease `lease`'s keys, most recently used first.
    pub fn keys_of(&self, lease: u32) -> Vec<(Vec<u8>, Entry)> {
        let mut v: Vec<(Vec<u8>, Entry)> =
            self.map.iter().filter(|(_, e)| e.slot.lease == lease).map(|(k, e)| (k.clone(), *e)).collect();
        v.sort_by_key(|(_, e)| std::cmp::Reverse(e.tick));
        v
    }

    /// Moves `key` to the slot of `r` (its value copied there) if it is still entry `was`; whether it moved.
    pub fn relocate(&mut self, key: &[u8], was: u64, r: Reservation) -> bool {
        match self.map.get(key) {
            Some(e) if e.id == was => {
                let len = e.len;
                self.commit(key, r, len)
            }
            _ => {
                self.abort(r);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: &mut Table, key: &str, len: u64) -> Reservation {
        let (r, _) = t.reserve(len, |_| true);
        let r = r.unwrap();
        assert!(t.commit(key.as_bytes(), r, len));
        r
    }

    #[test]
    fn the_least_recently_used_key_is_evicted_first() {
        let mut t = Table::new(4096);
        t.add_lease(4096); // one page: four slots of 1 KiB
        for k in ["a", "b", "c", "d"] {
            put(&mut t, k, 1000);
        }
        assert!(t.touch(b"a").is_some()); // order of use now: b c d a
        let (r, evicted) = t.reserve(1000, |_| true);
        assert_eq!(evicted, vec![b"b".to_vec()]);
        assert!(t.commit(b"e", r.unwrap(), 1000));
        let (_, evicted) = t.reserve(1000, |_| true);
        assert_eq!(evicted, vec![b"c".to_vec()]);
        assert!(t.peek(b"a").is_some() && t.peek(b"b").is_none());
    }

    #[test]
    fn a_pinned_entry_is_not_evicted_and_keeps_its_slot_until_unpinned() {
        let mut t = Table::new(4096);
        t.add_lease(4096);
        let first = put(&mut t, "a", 4096);
        let e = t.touch(b"a").unwrap();
        t.pin(&e);
        assert_eq!(t.reserve(4096, |_| true).0, Err(Refused::NoSpace));
        // Replaced while pinned: the old slot stays out of use until the read ends.
        assert_eq!(t.remove(b"a").unwrap().slot, first.slot);
        assert_eq!(t.reserve(4096, |_| true).0, Err(Refused::NoSpace));
        t.unpin(e.id);
        assert_eq!(t.reserve(4096, |_| true).0.unwrap().slot, first.slot);
    }

    #[test]
    fn an_aborted_put_keeps_the_old_value_and_gives_its_slot_back() {
        let mut t = Table::new(4096);
        t.add_lease(2 * 4096);
        let old = put(&mut t, "k", 4096);
        let (r, _) = t.reserve(4096, |_| true);
        let r = r.unwrap();
        t.abort(r);
        assert_eq!(t.peek(b"k").unwrap().slot, old.slot);
        assert_eq!(t.reserve(4096, |_| true).0.unwrap().slot, r.slot);
        assert_eq!(t.bytes(), 4096);
    }

    #[test]
    fn a_lost_lease_takes_its_keys_and_refuses_late_commits() {
        let mut t = Table::new(4096);
        let a = t.add_lease(4096);
        let b = t.add_lease(4096);
        put(&mut t, "x", 10);
        let (r, _) = t.reserve(10, |l| l == b);
        let in_b = r.unwrap();
        assert!(t.commit(b"y", in_b, 10));
        let (late, _) = t.reserve(10, |l| l == a);
        let late = late.unwrap();
        let mut lost = t.drop_lease(a);
        lost.sort();
        assert_eq!(lost, vec![b"x".to_vec()]);
        assert!(t.peek(b"x").is_none() && t.peek(b"y").is_some());
        assert!(!t.commit(b"z", late, 10), "a put into a lost lease does not land in the index");
        assert_eq!(t.len(), 1);
        assert_eq!(t.reserve(10, |l| l == a).0, Err(Refused::NoSpace));
    }

    #[test]
    fn a_class_without_room_takes_a_page_from_another() {
        let mut t = Table::new(4096);
        t.add_lease(2 * 4096);
        for i in 0..128 {
            put(&mut t, &format!("small{i}"), 64); // both pages to the 64-byte class
        }
        let (r, evicted) = t.reserve(4096, |_| true);
        assert!(r.is_ok());
        assert_eq!(evicted.len(), 64, "one page of small values went");
        assert!(evicted.contains(&b"small0".to_vec()), "the page of the oldest value");
        assert_eq!(t.len(), 64);
    }

    #[test]
    fn too_large_is_refused() {
        let mut t = Table::new(4096);
        t.add_lease(4096);
        assert_eq!(t.reserve(4097, |_| true).0, Err(Refused::TooLarge));
    }

    #[test]
    fn relocate_moves_only_the_same_entry() {
        let mut t = Table::new(4096);
        let a = t.add_lease(4096);
        let b = t.add_lease(4096);
        put(&mut t, "k", 100);
        let e = t.peek(b"k").unwrap();
        assert_eq!(e.slot.lease, a);
        t.stop_placing(a);
        let (r, _) = t.reserve(100, |_| true);
        assert!(t.relocate(b"k", e.id, r.unwrap()));
        assert_eq!(t.peek(b"k").unwrap().slot.lease, b);
        // Overwritten meanwhile: the copy is dropped.
        let (r, _) = t.reserve(100, |_| true);
        assert!(!t.relocate(b"k", e.id, r.unwrap()));
        assert_eq!(t.len(), 1);
    }
}
