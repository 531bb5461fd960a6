//! The service's counters and latency histograms (STATS).

/// Log2 buckets of microseconds: bucket i < 15 counts 2^i ≤ v < 2^(i+1) (bucket 0 also 0 and 1), bucket 15
/// everything from 2^15 µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hist {
    pub buckets: [u32; 16],
}

impl Hist {
    pub fn push(&mut self, us: u64) {
        let i = if us < 2 { 0 } else { (63 - us.leading_zeros() as usize).min(15) };
        self.buckets[i] = self.buckets[i].saturating_add(1);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&b| u64::from(b)).sum()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub allocs_started: u64,
    pub allocs: u64,
    pub revokes: u64,
    pub expiries: u64,
    pub reconnects: u64,
    pub fenced: u64,
    pub swept: u64,
    pub commands: u64,
    pub failed_commands: u64,
    pub drop_failures: u64,
    pub alloc_us: Hist,
    pub revoke_us: Hist,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        let mut h = Hist::default();
        for v in [0, 1, 2, 3, 4, 1000, 1 << 20] {
            h.push(v);
        }
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 2);
        assert_eq!(h.buckets[2], 1);
        assert_eq!(h.buckets[9], 1);
        assert_eq!(h.buckets[15], 1);
        assert_eq!(h.count(), 7);
    }
}
