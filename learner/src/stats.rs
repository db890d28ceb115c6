//! Statistics of a population's final returns, as `flotilla report` prints them and the `rliable` package
//! (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", NeurIPS 2021) computes them.
//!
//! ```text
//! iqm(x)     scipy.stats.trim_mean(x, 0.25): sort, drop int(0.25·n) values at each end, mean of the rest
//! mean(x)    np.mean(x)
//! median(x)  np.median(x): the mean of the two middle values for even n
//! bootstrap  rliable's StratifiedBootstrap: each resample draws, within every stratum (env id) independently
//!            and with replacement, as many members as the stratum has, pools the draws and computes the
//!            statistic; the 95 % interval is np.percentile(resampled statistics, [2.5, 97.5]) (linear)
//! ```
//! The resamples come from a [`Pcg64`] with a fixed seed, so a report is reproducible. Every statistic of an
//! empty sample is NaN, as NumPy's is.
//!
//! One run's evaluations against a threshold — reached, held, settled — are a [`Course`].
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

/// Resamples of a bootstrap confidence interval (rliable's default `reps`).
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Seed of the bootstrap's resampling stream: fixed, so the same data gives the same interval.
pub const BOOTSTRAP_SEED: u64 = 0;

/// Coverage of the confidence intervals: the percentiles 2.5 and 97.5 of the resampled statistic.
pub const CONFIDENCE: f64 = 0.95;

/// `scipy.stats.trim_mean(x, proportion)`: the mean after cutting `int(proportion · n)` of the smallest and as
/// many of the largest values.
pub fn trim_mean(x: &[f64], proportion: f64) -> f64 {
    let mut sorted = x.to_vec();
    sorted.sort_by(f64::total_cmp);
    trim_mean_sorted(&sorted, proportion)
}

fn trim_mean_sorted(sorted: &[f64], proportion: f64) -> f64 {
    // scipy refuses proportions over 0.5 (the cuts would cross); here they leave nothing: NaN.
    let cut = ((proportion * sorted.len() as f64) as usize).min(sorted.len() / 2);
    mean(&sorted[cut..sorted.len() - cut])
}

/// The interquartile mean: [`trim_mean`] with a quarter cut at each end (rliable's `aggregate_iqm`).
pub fn iqm(x: &[f64]) -> f64 {
    trim_mean(x, 0.25)
}

/// The arithmetic mean.
pub fn mean(x: &[f64]) -> f64 {
    if x.is_empty() {
        return f64::NAN;
    }
    x.iter().sum::<f64>() / x.len() as f64
}

/// NumPy's median: the middle value, or the mean of the two middle values when `x` has an even length.
pub fn median(x: &[f64]) -> f64 {
    let mut sorted = x.to_vec();
    sorted.sort_by(f64::total_cmp);
    median_sorted(&sorted)
}

fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `np.percentile(x, q)` with NumPy's default (`"linear"`) method, `q` in 0–100.
pub fn percentile(x: &[f64], q: f64) -> f64 {
    let mut sorted = x.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile_sorted(&sorted, q)
}

fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let position = (q / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
    let below = (position.floor() as usize).min(n - 1);
    let above = (below + 1).min(n - 1);
    let t = position - below as f64;
    // NumPy's _lerp: from the nearer end, so a weight of 1 gives the upper value exactly.
    let (a, b) = (sorted[below], sorted[above]);
    if t >= 0.5 { b - (b - a) * (1.0 - t) } else { a + (b - a) * t }
}

/// A point estimate with its bootstrap confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The statistic of the sample itself.
    pub point: f64,
    /// Lower end of the [`CONFIDENCE`] interval (the 2.5th percentile of the resampled statistic).
    pub lo: f64,
    /// Upper end (the 97.5th percentile).
    pub hi: f64,
}

/// IQM, mean and median of a sample stratified by env, each with its stratified bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Values over all strata.
    pub n: usize,
    /// The interquartile mean ([`iqm`]) of the pooled values.
    pub iqm: Estimate,
    /// Their [`mean`].
    pub mean: Estimate,
    /// Their [`median`].
    pub median: Estimate,
}

/// IQM, mean and median of the pooled `strata` with [`BOOTSTRAP_RESAMPLES`] stratified resamples from
/// [`BOOTSTRAP_SEED`] (the three statistics share each resample). Empty strata are ignored; no values at all
/// give NaN everywhere.
pub fn summarize(strata: &[Vec<f64>]) -> Summary {
    let statistics: [fn(&[f64]) -> f64; 3] = [|s| trim_mean_sorted(s, 0.25), mean, median_sorted];
    let [iqm, mean, median] = stratified_bootstrap(strata, &statistics, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED);
    Summary { n: strata.iter().map(Vec::len).sum(), iqm, mean, median }
}

/// Each of `statistics` (called on the pooled values, sorted ascending) with its percentile interval over
/// `resamples` stratified bootstrap resamples drawn from a [`Pcg64`] seeded with `seed`.
pub fn stratified_bootstrap<const K: usize>(
    strata: &[Vec<f64>],
    statistics: &[fn(&[f64]) -> f64; K],
    resamples: usize,
    seed: u64,
) -> [Estimate; K] {
    let strata: Vec<&Vec<f64>> = strata.iter().filter(|s| !s.is_empty()).collect();
    let mut pooled: Vec<f64> = strata.iter().copied().flatten().copied().collect();
    pooled.sort_by(f64::total_cmp);
    if pooled.is_empty() {
        return [Estimate { point: f64::NAN, lo: f64::NAN, hi: f64::NAN }; K];
    }
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut draws: Vec<Vec<f64>> = vec![Vec::with_capacity(resamples); K];
    let mut sample = Vec::with_capacity(pooled.len());
    for _ in 0..resamples {
        sample.clear();
        for stratum in &strata {
            sample.extend((0..stratum.len()).map(|_| stratum[rng.random_range(0..stratum.len())]));
        }
        sample.sort_by(f64::total_cmp);
        for (k, statistic) in statistics.iter().enumerate() {
            draws[k].push(statistic(&sample));
        }
    }
    let tail = (1.0 - CONFIDENCE) / 2.0 * 100.0;
    std::array::from_fn(|k| {
        draws[k].sort_by(f64::total_cmp);
        Estimate {
            point: statistics[k](&pooled),
            lo: percentile_sorted(&draws[k], tail),
            hi: percentile_sorted(&draws[k], 100.0 - tail),
        }
    })
}

/// The [`iqm`] of `strata` pooled, with its stratified bootstrap interval from `resamples` resamples (fewer than
/// [`BOOTSTRAP_RESAMPLES`] where many are needed, e.g. one per point of a learning curve).
pub fn iqm_interval(strata: &[Vec<f64>], resamples: usize) -> Estimate {
    let [iqm] = stratified_bootstrap(strata, &[|s| trim_mean_sorted(s, 0.25)], resamples, BOOTSTRAP_SEED);
    iqm
}

/// How a run's evaluations went against a threshold. A learning result counts when the policy reaches the
/// threshold *and stays there*, so both are read from every evaluation, not from the last alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Course {
    /// The threshold.
    pub threshold: f64,
    /// Env steps of the first evaluation at or above it.
    pub first: Option<u64>,
    /// Its index among the evaluations.
    pub first_index: Option<usize>,
    /// Evaluations after that one.
    pub after: usize,
    /// The lowest of those evaluations.
    pub lowest_after: Option<f64>,
    /// Env steps of the first evaluation from which every one to the last is at or above it (`None`: the last
    /// is below).
    pub settled: Option<u64>,
}

impl Course {
    /// `points` (`(env_steps, value)` of each evaluation, in order) against `threshold`.
    pub fn of(points: &[(u64, f64)], threshold: f64) -> Self {
        let first = points.iter().position(|(_, v)| *v >= threshold);
        let after = first.map_or(&[][..], |i| &points[i + 1..]);
        let lowest_after = after.iter().map(|(_, v)| *v).reduce(f64::min);
        let tail = points.iter().rev().take_while(|(_, v)| *v >= threshold).count();
        let settled = (tail > 0).then(|| points[points.len() - tail].0);
        let (first_index, after) = (first, after.len());
        Course { threshold, first: first.map(|i| points[i].0), first_index, after, lowest_after, settled }
    }

    /// `None` where the threshold was never reached; else whether every later evaluation stayed at or above it
    /// (true, too, when the first was the last).
    pub fn held(&self) -> Option<bool> {
        self.first?;
        Some(self.lowest_after.is_none_or(|l| l >= self.threshold))
    }

    /// `held at the N evaluations after it` / `not held: lowest X at the N evaluations after it` (empty when
    /// the threshold was never reached or nothing came after it): the clause the training summaries print.
    pub fn held_clause(&self) -> String {
        let after = match self.after {
            1 => "the evaluation after it".to_string(),
            n => format!("the {n} evaluations after it"),
        };
        match (self.held(), self.lowest_after) {
            (Some(true), Some(_)) => format!("held at {after}"),
            (Some(false), Some(lowest)) => format!("not held: lowest {lowest:.1} at {after}"),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn iqm_cuts_as_scipy_trim_mean_does() {
        // n = 1, 2, 3: int(0.25 n) = 0, nothing is cut.
        assert_eq!(iqm(&[7.0]), 7.0);
        assert_eq!(iqm(&[1.0, 4.0]), 2.5);
        assert_eq!(iqm(&[9.0, 1.0, 2.0]), 4.0);
        // n = 4: one from each end of [1, 2, 3, 100].
        assert_eq!(iqm(&[100.0, 3.0, 1.0, 2.0]), 2.5);
        // n = 5: int(1.25) = 1: mean of [2, 3, 4].
        assert_eq!(iqm(&[5.0, 4.0, 3.0, 2.0, 1.0]), 3.0);
        // n = 7: int(1.75) = 1: mean of the middle five.
        assert!(close(iqm(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 70.0]), 4.0));
        // n = 8: int(2) = 2: mean of [3, 4, 5, 6] (sorted).
        assert_eq!(iqm(&[8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]), 4.5);
        // Ties: [1, 5, 5, 5, 5, 9] cut 1 each end.
        assert_eq!(iqm(&[5.0, 9.0, 5.0, 1.0, 5.0, 5.0]), 5.0);
        assert!(iqm(&[]).is_nan());
        assert_eq!(trim_mean(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.1), 5.5);
    }

    #[test]
    fn mean_and_median_are_numpys() {
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
        assert!(mean(&[]).is_nan());
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[500.0, 500.0, 10.0, 500.0]), 500.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn percentiles_interpolate_linearly() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&x, 0.0), 1.0);
        assert_eq!(percentile(&x, 100.0), 4.0);
        assert_eq!(percentile(&x, 50.0), 2.5);
        // np.percentile([1, 2, 3, 4], 2.5) = 1 + 0.075 and 97.5 → 4 - 0.075.
        assert!(close(percentile(&x, 2.5), 1.075));
        assert!(close(percentile(&x, 97.5), 3.925));
        assert_eq!(percentile(&[5.0], 97.5), 5.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn bootstrap_intervals_hold_their_points_and_are_reproducible() {
        let strata = vec![vec![10.0, 20.0, 30.0, 40.0, 500.0], vec![-1.0, -2.0, -3.0]];
        let a = summarize(&strata);
        assert_eq!(a, summarize(&strata), "a fixed seed gives the same intervals");
        assert_eq!(a.n, 8);
        let pooled: Vec<f64> = strata.concat();
        assert_eq!(a.iqm.point, iqm(&pooled));
        assert_eq!(a.mean.point, mean(&pooled));
        assert_eq!(a.median.point, median(&pooled));
        for e in [a.iqm, a.mean, a.median] {
            assert!(e.lo <= e.point && e.point <= e.hi, "{e:?}");
            assert!(e.lo >= -3.0 && e.hi <= 500.0, "{e:?}");
            assert!(e.lo < e.hi, "{e:?}");
        }
        // One value: every resample is that value.
        let one = summarize(&[vec![3.5]]);
        assert_eq!(one.iqm, Estimate { point: 3.5, lo: 3.5, hi: 3.5 });
        // All equal (ties): no spread.
        let same = summarize(&[vec![500.0; 6]]);
        assert_eq!((same.median.lo, same.median.hi), (500.0, 500.0));
        let empty = summarize(&[vec![], vec![]]);
        assert_eq!(empty.n, 0);
        assert!(empty.iqm.point.is_nan() && empty.mean.lo.is_nan());
    }

    #[test]
    fn stratified_resamples_keep_each_strata_size() {
        // Two strata far apart: every resample has exactly 2 low and 2 high values, so the mean's interval is
        // bounded by the stratum means' extremes and the median is always between the strata (mean of 0 & 100
        // ranges): an unstratified bootstrap would sometimes draw 4 low values (median 0).
        let strata = vec![vec![0.0, 1.0], vec![100.0, 101.0]];
        let s = summarize(&strata);
        assert!(s.median.lo >= 50.0 && s.median.hi <= 51.0, "{:?}", s.median);
        assert!(s.mean.lo >= 50.0 && s.mean.hi <= 51.0, "{:?}", s.mean);
    }

    #[test]
    fn a_course_is_reached_held_and_settled_from_every_evaluation() {
        let points = [(100, 10.0), (200, 480.0), (300, 450.0), (400, 500.0), (500, 475.0)];
        let c = Course::of(&points, 475.0);
        assert_eq!(
            (c.first, c.first_index, c.after, c.lowest_after, c.settled),
            (Some(200), Some(1), 3, Some(450.0), Some(400))
        );
        assert_eq!(c.held(), Some(false));
        assert_eq!(c.held_clause(), "not held: lowest 450.0 at the 3 evaluations after it");
        let c = Course::of(&points[3..], 475.0);
        assert_eq!((c.first, c.held(), c.settled), (Some(400), Some(true), Some(400)));
        assert_eq!(c.held_clause(), "held at the evaluation after it");
        // Reached at the last evaluation: held, nothing after; never reached: no verdict; the last below: unsettled.
        let c = Course::of(&points[..2], 475.0);
        assert_eq!((c.held(), c.lowest_after, c.settled, c.held_clause().as_str()), (Some(true), None, Some(200), ""));
        let c = Course::of(&points[..1], 475.0);
        assert_eq!((c.first, c.held(), c.settled), (None, None, None));
        assert_eq!(Course::of(&points[..3], 475.0).settled, None);
    }
}
