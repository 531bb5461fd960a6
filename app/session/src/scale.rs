//! How many session places a host's memory affords, and what each costs (docs/operations.md, "Scale"). The
//! session core owns the per-session heap figure ([`crate::SESSION_HEAP_BYTES`]); the transport's buffers are
//! the host's (the image's smoltcp sockets, the hosted appliance's per-connection buffers), so they come in as
//! parameters. Pure arithmetic, so both hosts size alike and the host tests pin the figures.

use crate::server::SESSION_HEAP_BYTES;

/// The fewest places a computed budget gives (the budget small machines always had).
pub const MIN_DEFAULT_SESSIONS: u32 = 16;
/// The most places a computed budget gives; more only by `sessions=` (up to its limit, 4096).
pub const MAX_DEFAULT_SESSIONS: u32 = 1024;
/// The share of the heap that session state may take in a computed budget (the rest: the lease service, the
/// network stack, requests in flight), in percent.
pub const SESSION_HEAP_SHARE_PCT: u64 = 50;

/// The session budget when `sessions=` is absent: as many places as both `heap` (bytes of heap for the control
/// service, of which [`SESSION_HEAP_SHARE_PCT`] % go to sessions at [`SESSION_HEAP_BYTES`] each) and
/// `transport` (bytes set aside for connection buffers, `per_place` each) afford, within
/// [`MIN_DEFAULT_SESSIONS`]..=[`MAX_DEFAULT_SESSIONS`].
pub fn default_sessions(heap: u64, transport: u64, per_place: u64) -> u32 {
    let by_heap = heap.saturating_mul(SESSION_HEAP_SHARE_PCT) / 100 / SESSION_HEAP_BYTES as u64;
    let by_transport = transport / per_place.max(1);
    let n = by_heap.min(by_transport).min(u64::from(MAX_DEFAULT_SESSIONS)) as u32;
    n.max(MIN_DEFAULT_SESSIONS)
}

/// The largest power-of-two buffer from `min` to `max` bytes such that `buffers` of them fit in `budget`
/// (`min` when none does: the allocation then says whether the memory is there).
pub fn buffer_size(buffers: u64, budget: u64, min: usize, max: usize) -> usize {
    let mut b = max.max(min);
    while b > min && (b as u64).saturating_mul(buffers) > budget {
        b /= 2;
    }
    b.max(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_follows_the_smaller_of_heap_and_transport_memory() {
        const MIB: u64 = 1 << 20;
        // A 256 MiB guest: 16 MiB of heap, 16 MiB for socket buffers of 128 KiB a place.
        assert_eq!(default_sessions(16 * MIB, 16 * MIB, 128 << 10), 128);
        // 512 MiB: twice as much of each.
        assert_eq!(default_sessions(32 * MIB, 32 * MIB, 128 << 10), 256);
        // The heap can be the limit: 4 MiB, half of it at 16 KiB a session.
        assert_eq!(default_sessions(4 * MIB, 1 << 40, 128 << 10), 128);
        assert_eq!(default_sessions(1, 1, 1), MIN_DEFAULT_SESSIONS, "never below today's default");
        assert_eq!(default_sessions(u64::MAX, u64::MAX, 0), MAX_DEFAULT_SESSIONS, "capped; no division by zero");
    }

    #[test]
    fn buffers_shrink_by_halves_to_fit() {
        assert_eq!(buffer_size(100, 100 * 65536, 8192, 65536), 65536);
        assert_eq!(buffer_size(100, 100 * 65536 - 1, 8192, 65536), 32768);
        assert_eq!(buffer_size(2066, 32 << 20, 8192, 65536), 8192);
        assert_eq!(buffer_size(1 << 20, 1, 8192, 65536), 8192, "never below the floor");
        assert_eq!(buffer_size(0, 0, 8192, 65536), 65536);
    }
}
