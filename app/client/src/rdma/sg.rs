//! Scatter/gather lists over memory the requester does not own: the caller's registered memory
//! ([`crate::Region`]) that a zero-copy work request reads (RDMA WRITE) or fills (RDMA READ).
//!
//! The software requester builds a WRITE's frames straight from these pieces and writes a READ's responses
//! straight into them ([`super::rc`]), as a NIC's DMA would; the verbs backend hands them to the NIC as SGEs.
//! [`SgList`] is where the raw pointers are dereferenced, under the contract its constructor states: the
//! memory stays valid, and is not touched by anyone else, for as long as the list lives.

/// One piece of a scatter/gather work request: `len` bytes at `addr`, registered under `lkey` (verbs: the
/// memory region's local key on the requester's device; the software requester needs no registration and
/// ignores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: *mut u8,
    pub len: u32,
    pub lkey: u32,
}

/// The pieces of one work request, kept with it until it completes (or its requester is dropped).
pub(crate) struct SgList {
    pieces: Vec<Sge>,
    len: u64,
}

// SAFETY: an `SgList` is only made by `SgList::new`, whose caller promises the memory stays valid and
// untouched by others while the list lives; which thread reads or writes it through the list does not matter.
#[allow(unsafe_code)]
unsafe impl Send for SgList {}

#[allow(unsafe_code)]
impl SgList {
    /// The list over `pieces`.
    ///
    /// # Safety
    ///
    /// Every piece's `len` bytes at `addr` stay valid for reads (and, for a list an RDMA READ fills, for writes)
    /// until the list is dropped, and nothing else writes them meanwhile (nor, for a READ's list, reads them).
    pub(crate) unsafe fn new(pieces: &[Sge]) -> SgList {
        let len = pieces.iter().map(|p| u64::from(p.len)).sum();
        SgList { pieces: pieces.to_vec(), len }
    }

    /// Bytes in all pieces together.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The slices that make up bytes `from..from + len` of the list, in order, appended to `out` (fewer bytes
    /// when the list is shorter).
    pub(crate) fn gather<'s>(&'s self, from: u64, len: u64, out: &mut Vec<&'s [u8]>) {
        let (mut skip, mut want) = (from, len);
        for p in &self.pieces {
            if want == 0 {
                break;
            }
            let plen = u64::from(p.len);
            if skip >= plen {
                skip -= plen;
                continue;
            }
            let take = (plen - skip).min(want);
            // SAFETY: `skip + take <= p.len`, inside the piece, which `new`'s contract keeps valid and unwritten
            // by others while `self` (and so the returned borrow) lives.
            out.push(unsafe { std::slice::from_raw_parts(p.addr.add(skip as usize), take as usize) });
            want -= take;
            skip = 0;
        }
    }

    /// Copies `data` to bytes `at..at + data.len()` of the list (what does not fit is dropped).
    pub(crate) fn scatter(&mut self, at: u64, data: &[u8]) {
        let mut skip = at;
        let mut rest = data;
        for p in &self.pieces {
            if rest.is_empty() {
                break;
            }
            let plen = u64::from(p.len);
            if skip >= plen {
                skip -= plen;
                continue;
            }
            let take = ((plen - skip) as usize).min(rest.len());
            // SAFETY: `skip + take <= p.len`, inside the piece, which `new`'s contract keeps valid for writes and
            // untouched by anyone else while `self` lives; `rest` is our own buffer, not part of the piece.
            unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), p.addr.add(skip as usize), take) };
            rest = &rest[take..];
            skip = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn gather_and_scatter_cross_pieces() {
        let mut a = [1u8, 2, 3];
        let mut b = [4u8, 5];
        let mut c = [6u8, 7, 8, 9];
        let pieces = [
            Sge { addr: a.as_mut_ptr(), len: 3, lkey: 0 },
            Sge { addr: b.as_mut_ptr(), len: 2, lkey: 0 },
            Sge { addr: c.as_mut_ptr(), len: 4, lkey: 0 },
        ];
        // SAFETY: the arrays outlive the list, and are not touched while it lives.
        let mut l = unsafe { SgList::new(&pieces) };
        assert_eq!(l.len(), 9);
        let mut out = Vec::new();
        l.gather(2, 4, &mut out);
        assert_eq!(out, [&[3u8][..], &[4, 5][..], &[6][..]]);
        out.clear();
        l.gather(8, 10, &mut out);
        assert_eq!(out, [&[9u8][..]]);
        l.scatter(1, &[20, 30, 40, 50]);
        l.scatter(8, &[90, 91]);
        drop(l);
        assert_eq!((a, b, c), ([1, 20, 30], [40, 50], [6, 7, 8, 90]));
    }
}
