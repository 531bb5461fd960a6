//! Where a new lease goes when the client knows several appliances: the one with the most free bytes first
//! (STATS as the tenant sees them: `stats.bytes_free`, the bytes it may still take there,
//! docs/wire-protocol.md "STATS"), then the others in that order, so an ALLOC refused for want of memory is
//! retried on the next. A program may name an appliance to try first (data that belongs together).

/// The order in which to try appliances: `prefer` first, then those with free-byte figures from the most to
/// the fewest (ties: list order), then those without a figure (STATS failed; likely down).
pub fn order(free: &[Option<u64>], prefer: Option<usize>) -> Vec<usize> {
    let mut known: Vec<(usize, u64)> =
        free.iter().enumerate().filter(|&(i, _)| Some(i) != prefer).filter_map(|(i, f)| f.map(|f| (i, f))).collect();
    // Stable: equal figures keep the list's order.
    known.sort_by_key(|k| std::cmp::Reverse(k.1));
    let unknown = free.iter().enumerate().filter(|&(i, f)| f.is_none() && Some(i) != prefer).map(|(i, _)| i);
    prefer.filter(|&p| p < free.len()).into_iter().chain(known.into_iter().map(|(i, _)| i)).chain(unknown).collect()
}

#[cfg(test)]
mod tests {
    use super::order;

    #[test]
    fn most_free_bytes_first_then_the_rest() {
        assert_eq!(order(&[Some(8), Some(32), Some(16)], None), vec![1, 2, 0]);
        assert_eq!(order(&[Some(8), Some(8), Some(16)], None), vec![2, 0, 1]);
        assert_eq!(order(&[None, Some(1), Some(0)], None), vec![1, 2, 0]);
        assert_eq!(order(&[], None), Vec::<usize>::new());
    }

    #[test]
    fn a_preferred_appliance_is_tried_first_whatever_its_figure() {
        assert_eq!(order(&[Some(8), Some(32)], Some(0)), vec![0, 1]);
        assert_eq!(order(&[None, Some(32)], Some(0)), vec![0, 1]);
        // A preference outside the list is ignored.
        assert_eq!(order(&[Some(1), Some(2)], Some(9)), vec![1, 0]);
    }
}
