//! Where a new lease goes when the client knows several appliances: the one with the most free bytes first
//! (STATS as the tenant sees them: `stats.bytes_free`, the bytes it may still take there,
//! docs/wire-protocol.md "STATS"), then the others in that order, so an ALLOC refused for want of memory is
//! retried on the next. A program may name an appliance to try first (data that belongs together).
//!
//! A fleet client (appliances from etcd, docs/fleet.md) places by two random choices instead ([`two_choices`]):
//! two candidates drawn with probability proportional to their weight (advertised free bytes, eased after a
//! reboot by [`warmup`]), and of the two the one this client has loaded least relative to its weight (its
//! recent placements, [`Placed`]). The draw spreads leases in proportion to free bytes without any STATS round
//! trip; the second choice evens out the draw's luck and keeps many clients that act on the same advertisement
//! from piling onto one appliance.

use std::time::Duration;

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

/// An appliance placement may choose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Its index in the client's list.
    pub index: usize,
    /// Its share of new leases: advertised free bytes times the warm-up factor.
    pub weight: f64,
    /// Bytes this client placed there recently ([`Placed::now`]).
    pub placed: f64,
}

/// How long a placement keeps half its say in the second choice ([`Placed`]).
pub const PLACED_HALF_LIFE: Duration = Duration::from_secs(10);

/// The bytes a client placed on one appliance, each placement's say halving every [`PLACED_HALF_LIFE`].
///
/// Every appliance's count decays at the same rate and none is ever reset on its own (only a reboot starts one
/// afresh: its leases are gone), so the second choice compares like with like. An earlier count that was reset
/// whenever an appliance's advertisement changed made appliances whose figures moved look idle next to one
/// whose figures did not, and starved the steady one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Placed {
    bytes: f64,
    at: Option<std::time::Instant>,
}

impl Placed {
    /// The decayed count at `now`.
    pub fn now(&self, now: std::time::Instant) -> f64 {
        match self.at {
            Some(at) => {
                let halves = now.saturating_duration_since(at).as_secs_f64() / PLACED_HALF_LIFE.as_secs_f64();
                self.bytes * 0.5f64.powf(halves)
            }
            None => 0.0,
        }
    }

    /// `bytes` more placed at `now`.
    pub fn add(&mut self, now: std::time::Instant, bytes: u64) {
        self.bytes = self.now(now) + bytes as f64;
        self.at = Some(now);
    }
}

/// A weight a fresh reboot starts from: an appliance that just came back takes a tenth of its share at first.
pub const WARMUP_FLOOR: f64 = 0.1;

/// The factor on a rebooted appliance's weight `since` its new boot was seen: from [`WARMUP_FLOOR`] up to 1
/// over `over` (so every client's leases do not land on the empty appliance at once).
pub fn warmup(since: Duration, over: Duration) -> f64 {
    if over.is_zero() {
        return 1.0;
    }
    (since.as_secs_f64() / over.as_secs_f64()).clamp(WARMUP_FLOOR, 1.0)
}

/// One draw in `[0, 1)` from `rng`'s 64 bits.
fn unit(rng: &mut dyn FnMut() -> u64) -> f64 {
    (rng() >> 11) as f64 / (1u64 << 53) as f64
}

/// An index drawn with probability proportional to `weights` (none when every weight is 0).
fn draw(weights: &[f64], rng: &mut dyn FnMut() -> u64) -> Option<usize> {
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = unit(rng) * total;
    for (i, &w) in weights.iter().enumerate() {
        if x < w {
            return Some(i);
        }
        x -= w;
    }
    weights.iter().rposition(|&w| w > 0.0)
}

/// The order in which to try `candidates` (their indexes): the better of two weighted draws, the other, then
/// the rest from the heaviest to the lightest (the retries after NO_MEMORY or an unreachable appliance).
pub fn two_choices(candidates: &[Candidate], rng: &mut dyn FnMut() -> u64) -> Vec<usize> {
    let mut weights: Vec<f64> = candidates.iter().map(|c| c.weight.max(0.0)).collect();
    let mut picked = Vec::new();
    if let Some(a) = draw(&weights, rng) {
        picked.push(a);
        weights[a] = 0.0;
        if let Some(b) = draw(&weights, rng) {
            let load = |c: &Candidate| c.placed / c.weight;
            if load(&candidates[b]) < load(&candidates[a]) {
                picked.insert(0, b);
            } else {
                picked.push(b);
            }
        }
    }
    let mut rest: Vec<usize> = (0..candidates.len()).filter(|i| !picked.contains(i)).collect();
    rest.sort_by(|&x, &y| candidates[y].weight.total_cmp(&candidates[x].weight));
    picked.into_iter().chain(rest).map(|i| candidates[i].index).collect()
}

/// A small fast generator for the draws (xorshift64*; placement needs spread, not secrecy).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Seeded from the OS (`/dev/urandom`), else from the clock.
    pub fn from_os() -> Rng {
        use std::io::Read;
        let mut b = [0u8; 8];
        let seed = match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            }
        };
        Rng::new(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn c(index: usize, weight: f64, placed: f64) -> Candidate {
        Candidate { index, weight, placed }
    }

    #[test]
    fn draws_follow_the_weights() {
        let mut rng = Rng::new(7);
        let mut next = || rng.next_u64();
        let mut hits = [0u32; 3];
        for _ in 0..30_000 {
            hits[draw(&[1.0, 2.0, 4.0], &mut next).unwrap()] += 1;
        }
        // 1 : 2 : 4 of 30,000, within 5 %.
        for (h, want) in hits.iter().zip([30_000.0 / 7.0, 60_000.0 / 7.0, 120_000.0 / 7.0]) {
            assert!((f64::from(*h) - want).abs() < want * 0.05, "{hits:?}");
        }
        assert_eq!(draw(&[0.0, 0.0], &mut next), None);
        assert_eq!(draw(&[0.0, 3.0], &mut next), Some(1));
    }

    /// Placing with each choice counted as placed: the spread follows the weights closely (the second choice
    /// takes the draw's luck out), and every candidate is in the order exactly once.
    #[test]
    fn two_choices_spread_in_proportion_and_list_everyone() {
        let mut rng = Rng::new(42);
        let mut next = || rng.next_u64();
        let mut cands = vec![c(10, 1.0, 0.0), c(11, 2.0, 0.0), c(12, 5.0, 0.0)];
        for _ in 0..800 {
            let order = two_choices(&cands, &mut next);
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, vec![10, 11, 12]);
            let first = cands.iter_mut().find(|x| x.index == order[0]).unwrap();
            first.placed += 1.0;
        }
        assert_eq!(cands.iter().map(|x| x.placed).sum::<f64>(), 800.0);
        for x in &cands {
            let want = 800.0 * x.weight / 8.0;
            assert!((x.placed - want).abs() <= want * 0.1, "{cands:?}");
        }
        // Nothing to weigh: no draw, the rest by weight.
        assert_eq!(two_choices(&[c(1, 0.0, 0.0), c(2, 0.0, 0.0)], &mut next), vec![1, 2]);
        assert_eq!(two_choices(&[], &mut next), Vec::<usize>::new());
        assert_eq!(two_choices(&[c(5, 3.0, 9.0)], &mut next), vec![5]);
    }

    #[test]
    fn placements_fade_at_one_rate() {
        let t0 = std::time::Instant::now();
        let mut p = Placed::default();
        assert_eq!(p.now(t0), 0.0);
        p.add(t0, 1000);
        assert_eq!(p.now(t0), 1000.0);
        assert!((p.now(t0 + PLACED_HALF_LIFE) - 500.0).abs() < 1e-9);
        p.add(t0 + PLACED_HALF_LIFE, 500);
        assert!((p.now(t0 + PLACED_HALF_LIFE) - 1000.0).abs() < 1e-9);
        assert!((p.now(t0 + 3 * PLACED_HALF_LIFE) - 250.0).abs() < 1e-9);
        // A clock read before the last placement counts it whole.
        assert!((p.now(t0) - 1000.0).abs() < 1e-9);
    }

    /// The fleet test's case: leases allocated and freed one after another on appliances of 1 : 2 : 4 free
    /// bytes, while the advertised figures of two of them wobble (a poll catches a lease in flight). Each
    /// lease goes to the first of the order and is counted in its `Placed`; the spread stays 1 : 2 : 4.
    #[test]
    fn wobbling_advertisements_do_not_starve_a_steady_appliance() {
        let mut rng = Rng::new(5);
        let t0 = std::time::Instant::now();
        let free = [32.0, 64.0, 128.0];
        let mut placed = [Placed::default(); 3];
        let mut hits = [0u32; 3];
        for n in 0..700u32 {
            let now = t0 + Duration::from_millis(u64::from(n) * 20);
            let wobble = if n % 3 == 0 { 4.0 } else { 0.0 };
            let cands: Vec<Candidate> = (0..3)
                .map(|i| Candidate {
                    index: i,
                    weight: free[i] - if i > 0 { wobble } else { 0.0 },
                    placed: placed[i].now(now),
                })
                .collect();
            let first = two_choices(&cands, &mut || rng.next_u64())[0];
            placed[first].add(now, 2 << 20);
            hits[first] += 1;
        }
        for (h, f) in hits.iter().zip(free) {
            let want = 700.0 * f / 224.0;
            assert!((f64::from(*h) - want).abs() <= want * 0.15, "{hits:?}");
        }
    }

    #[test]
    fn a_reboot_is_eased_in() {
        let over = Duration::from_secs(30);
        assert_eq!(warmup(Duration::ZERO, over), WARMUP_FLOOR);
        assert_eq!(warmup(Duration::from_secs(15), over), 0.5);
        assert_eq!(warmup(Duration::from_secs(60), over), 1.0);
        assert_eq!(warmup(Duration::ZERO, Duration::ZERO), 1.0);
    }
}
