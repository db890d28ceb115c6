//! Sum and min trees over a fixed number of priorities, for proportional prioritized sampling (Schaul et al.
//! 2016, "Prioritized Experience Replay", §3.3 and Appendix B.2.1).
//!
//! A complete binary tree whose leaves are the priorities `p_i` and whose inner nodes hold the sum (and, in a
//! second array, the minimum) of their children. Setting a priority re-sums its `log₂ n` ancestors;
//! [`SumTree::find_many`] walks from the root to the leaf `i` with `Σ_{j<i} p_j ≤ mass < Σ_{j≤i} p_j`, so drawing
//! `mass` uniformly in `[0, total)` picks `i` with probability `p_i / Σ p`. The minimum gives the largest
//! importance weight for normalising (`w_max = (N · p_min / Σ p)^(−β)`).
//!
//! Everything is f64. Each inner node is recomputed from its two children (never updated by adding a
//! difference), so the tree is a pure function of its leaves: no drift over millions of updates, and
//! [`SumTree::rebuild`] from saved leaves reproduces every node bit for bit.
use crate::{Error, Result};

/// Priorities of `capacity` slots with O(log n) updates, prefix-sum search, total and minimum.
///
/// A slot never set holds 0 in the sum (it is never found) and does not count for the minimum.
#[derive(Debug, Clone, PartialEq)]
pub struct SumTree {
    capacity: usize,
    /// Number of leaves: `capacity` rounded up to a power of two. Node `k` has children `2k`, `2k + 1`; the
    /// root is node 1 and slot `i` is node `leaves + i`.
    leaves: usize,
    sums: Vec<f64>,
    mins: Vec<f64>,
}

impl SumTree {
    /// A tree of `capacity` unset slots (allocated once).
    pub fn new(capacity: usize) -> Self {
        let leaves = capacity.max(1).next_power_of_two();
        SumTree { capacity, leaves, sums: vec![0.0; 2 * leaves], mins: vec![f64::INFINITY; 2 * leaves] }
    }

    /// `Σ p_i` over all slots.
    pub fn total(&self) -> f64 {
        self.sums[1]
    }

    /// The smallest priority set so far (`+∞` when none is).
    pub fn min(&self) -> f64 {
        self.mins[1]
    }

    /// The priority of slot `index` (0 if never set).
    ///
    /// # Panics
    /// If `index >= capacity`.
    pub fn get(&self, index: usize) -> f64 {
        assert!(index < self.capacity, "sum tree slot {index} out of range (capacity {})", self.capacity);
        self.sums[self.leaves + index]
    }

    /// The priorities of all slots in order (0 for those never set).
    pub fn priorities(&self) -> &[f64] {
        &self.sums[self.leaves..self.leaves + self.capacity]
    }

    /// Set slot `index` to `priority` (finite, ≥ 0) and update its ancestors.
    pub fn set(&mut self, index: usize, priority: f64) -> Result<()> {
        if index >= self.capacity {
            let what = format!("sum tree slot index {index}");
            return Err(Error::length(what, index + 1, self.capacity));
        }
        check_priority(index, priority)?;
        let mut k = self.leaves + index;
        self.sums[k] = priority;
        self.mins[k] = priority;
        while k > 1 {
            k /= 2;
            self.sums[k] = self.sums[2 * k] + self.sums[2 * k + 1];
            self.mins[k] = self.mins[2 * k].min(self.mins[2 * k + 1]);
        }
        Ok(())
    }

    /// Replace the whole tree: slots `0..priorities.len()` get `priorities`, the others become unset. O(n).
    pub fn rebuild(&mut self, priorities: &[f64]) -> Result<()> {
        if priorities.len() > self.capacity {
            return Err(Error::length("sum tree priorities", priorities.len(), self.capacity));
        }
        for (i, &p) in priorities.iter().enumerate() {
            check_priority(i, p)?;
        }
        let leaves = &mut self.sums[self.leaves..];
        leaves[..priorities.len()].copy_from_slice(priorities);
        leaves[priorities.len()..].fill(0.0);
        let leaves = &mut self.mins[self.leaves..];
        leaves[..priorities.len()].copy_from_slice(priorities);
        leaves[priorities.len()..].fill(f64::INFINITY);
        for k in (1..self.leaves).rev() {
            self.sums[k] = self.sums[2 * k] + self.sums[2 * k + 1];
            self.mins[k] = self.mins[2 * k].min(self.mins[2 * k + 1]);
        }
        Ok(())
    }

    /// For each of `masses` (overwritten: used as scratch), the slot `i` with `Σ_{j<i} p_j ≤ mass < Σ_{j≤i} p_j`,
    /// into `out`: drawing `mass` uniformly in `[0, total)` samples slot `i` with probability `p_i / total`.
    /// The walks go down the tree level by level together, so their cache misses overlap instead of queueing.
    ///
    /// Each result has a positive priority when `total() > 0`, even where rounding puts `mass` at or past the
    /// total (the last slot with positive priority is returned) or below 0 (the first). With `total() == 0`
    /// it is 0.
    ///
    /// # Panics
    /// If the two slices differ in length.
    pub fn find_many(&self, masses: &mut [f64], out: &mut [usize]) {
        assert_eq!(masses.len(), out.len(), "sum tree find_many: masses and outputs of different lengths");
        for (mass, k) in masses.iter_mut().zip(out.iter_mut()) {
            *mass = if *mass > 0.0 { *mass } else { 0.0 };
            *k = 1;
        }
        for _ in 0..self.leaves.trailing_zeros() {
            for (mass, k) in masses.iter_mut().zip(out.iter_mut()) {
                let left = self.sums[2 * *k];
                if *mass < left || self.sums[2 * *k + 1] == 0.0 {
                    *k *= 2;
                } else {
                    *mass -= left;
                    *k = 2 * *k + 1;
                }
            }
        }
        for k in out {
            *k = (*k - self.leaves).min(self.capacity.saturating_sub(1));
        }
    }
}

fn check_priority(index: usize, priority: f64) -> Result<()> {
    if priority.is_finite() && priority >= 0.0 {
        return Ok(());
    }
    let detail = format!("priority of slot {index} must be finite and ≥ 0");
    Err(Error::config("prioritized replay", "priority", priority, detail))
}

#[cfg(test)]
impl SumTree {
    /// [`SumTree::find_many`] for one `mass`, one walk at a time (the reference it is tested against).
    pub(crate) fn find(&self, mass: f64) -> usize {
        // `!(mass > 0.0)` also catches NaN.
        let mut mass = if mass > 0.0 { mass } else { 0.0 };
        let mut k = 1;
        // Invariant: the subtree at `k` has a positive sum (when the total is), so one child does too.
        while k < self.leaves {
            let left = self.sums[2 * k];
            if mass < left || self.sums[2 * k + 1] == 0.0 {
                k *= 2;
            } else {
                mass -= left;
                k = 2 * k + 1;
            }
        }
        // Unreachable for a positive total (unset slots past `capacity` sum to 0), kept for total == 0.
        (k - self.leaves).min(self.capacity.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    /// The paper's definition by brute force: the first `i` whose inclusive prefix sum exceeds `mass`.
    fn brute_find(p: &[f64], mass: f64) -> usize {
        let mut prefix = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            prefix += pi;
            if mass < prefix {
                return i;
            }
        }
        p.iter().rposition(|&x| x > 0.0).unwrap_or(0)
    }

    /// `find_many` gives `find`'s answers.
    fn assert_batch_matches(tree: &SumTree, masses: &[f64]) {
        let (mut scratch, mut out) = (masses.to_vec(), vec![usize::MAX; masses.len()]);
        tree.find_many(&mut scratch, &mut out);
        let one_by_one: Vec<usize> = masses.iter().map(|&m| tree.find(m)).collect();
        assert_eq!(out, one_by_one);
    }

    #[test]
    fn matches_brute_force_exactly_on_integer_priorities() {
        // Small integers keep every partial sum exact in f64, so tree and brute force must agree exactly,
        // boundaries included.
        let mut rng = Pcg64::seed_from_u64(1);
        for capacity in [1usize, 2, 3, 5, 8, 13, 64, 100] {
            let mut tree = SumTree::new(capacity);
            let mut p = vec![0.0f64; capacity];
            let mut set = vec![false; capacity];
            for round in 0..200 {
                let i = rng.random_range(0..capacity);
                // Zeros included: they must never be found.
                p[i] = rng.random_range(0..6) as f64;
                set[i] = true;
                tree.set(i, p[i]).unwrap();
                let total: f64 = p.iter().sum();
                assert_eq!(tree.total(), total);
                let min = p.iter().zip(&set).filter(|(_, s)| **s).map(|(x, _)| *x).fold(f64::INFINITY, f64::min);
                assert_eq!(tree.min(), min);
                assert_eq!(tree.priorities(), &p[..]);
                if total == 0.0 {
                    continue;
                }
                let masses: Vec<f64> = (0..50).map(|_| rng.random::<f64>() * total).collect();
                for &mass in &masses {
                    assert_eq!(tree.find(mass), brute_find(&p, mass), "capacity {capacity} round {round}");
                }
                assert_batch_matches(&tree, &masses);
                // Every integer boundary, where `<` versus `≤` matters.
                for b in 0..total as usize {
                    let found = tree.find(b as f64);
                    assert_eq!(found, brute_find(&p, b as f64));
                    assert!(p[found] > 0.0);
                }
                // At or past the total, and below 0: the last and first positive slots.
                let last = p.iter().rposition(|&x| x > 0.0).unwrap();
                let first = p.iter().position(|&x| x > 0.0).unwrap();
                assert_eq!(tree.find(total), last);
                assert_eq!(tree.find(total * 2.0), last);
                assert_eq!(tree.find(-1.0), first);
                assert_eq!(tree.find(f64::NAN), first);
                assert_batch_matches(&tree, &[total, -1.0, f64::NAN, 0.0, total * 0.5]);
            }
        }
    }

    #[test]
    fn matches_brute_force_on_real_priorities() {
        let mut rng = Pcg64::seed_from_u64(2);
        let capacity = 1000;
        let mut tree = SumTree::new(capacity);
        let mut p = vec![0.0f64; capacity];
        for _ in 0..20 {
            for _ in 0..300 {
                let i = rng.random_range(0..capacity);
                p[i] = rng.random::<f64>().powi(3) * 10.0;
                tree.set(i, p[i]).unwrap();
            }
            let total: f64 = p.iter().sum();
            assert!((tree.total() - total).abs() <= 1e-12 * total);
            let masses: Vec<f64> = (0..2000).map(|_| rng.random::<f64>() * total).collect();
            assert_batch_matches(&tree, &masses);
            for &mass in &masses {
                let (got, want) = (tree.find(mass), brute_find(&p, mass));
                if got != want {
                    // Only where the two summation orders round differently, right at a boundary.
                    let prefix: f64 = p[..got.min(want) + 1].iter().sum();
                    assert!((prefix - mass).abs() < 1e-9 * total, "mass {mass}: tree {got}, brute force {want}");
                }
                assert!(p[got] > 0.0);
            }
        }
    }

    #[test]
    fn rebuild_reproduces_incremental_updates_bit_for_bit() {
        let mut rng = Pcg64::seed_from_u64(3);
        let mut tree = SumTree::new(37);
        for _ in 0..500 {
            tree.set(rng.random_range(0..30), rng.random::<f64>() * 3.0).unwrap();
        }
        let mut other = SumTree::new(37);
        other.set(36, 5.0).unwrap();
        other.rebuild(&tree.priorities()[..30]).unwrap();
        assert_eq!(other, tree);
        assert!(other.rebuild(&[1.0; 38]).is_err());
    }

    #[test]
    fn refuses_bad_priorities_and_slots() {
        let mut tree = SumTree::new(4);
        tree.set(1, 2.0).unwrap();
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let e = tree.set(0, bad).unwrap_err().to_string();
            assert!(e.contains("slot 0"), "{e}");
        }
        assert!(matches!(tree.set(4, 1.0), Err(Error::BadLength { .. })));
        assert!(tree.rebuild(&[1.0, f64::NAN]).is_err());
        assert_eq!((tree.total(), tree.min(), tree.find(0.5)), (2.0, 2.0, 1));
        assert_eq!(SumTree::new(3).find(0.0), 0, "an empty tree answers 0");
        assert_batch_matches(&SumTree::new(3), &[0.0, 1.0]);
        assert_batch_matches(&SumTree::new(1), &[0.0, 1.0]);
    }
}
