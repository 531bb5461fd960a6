//! What the machine's memory gives the kernel's own budgets (docs/operations.md, "Scale"): the heap grows with
//! the memory, because the session state of a memory node's clients lives there (a few KiB each, a thousand
//! sessions and more on a large machine), while a small guest keeps the heap it always had.

/// The heap of the smallest machine (and the floor).
pub const MIN_HEAP_BYTES: u64 = 4 << 20;
/// The most the heap takes, whatever the memory: beyond it the control service's budgets stop growing.
pub const MAX_HEAP_BYTES: u64 = 64 << 20;
/// The heap's share of usable memory: one part in this many.
pub const HEAP_SHARE: u64 = 16;

/// The heap for a machine with `usable` bytes of usable memory: a sixteenth of it, from 4 MiB to 64 MiB, in
/// whole MiB.
pub fn heap_bytes(usable: u64) -> u64 {
    (usable / HEAP_SHARE).clamp(MIN_HEAP_BYTES, MAX_HEAP_BYTES) & !((1 << 20) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_follows_memory_within_its_bounds() {
        const MIB: u64 = 1 << 20;
        assert_eq!(heap_bytes(0), 4 * MIB);
        assert_eq!(heap_bytes(64 * MIB), 4 * MIB);
        assert_eq!(heap_bytes(255 * MIB), 15 * MIB, "whole MiB");
        assert_eq!(heap_bytes(512 * MIB), 32 * MIB);
        assert_eq!(heap_bytes(1 << 40), 64 * MIB);
        assert_eq!(heap_bytes(u64::MAX), 64 * MIB);
    }
}
