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
//! P(X > Y)   rliable's probability_of_improvement: per stratum, over every pair of a run of X and a run of Y,
//!            1 where X's score is higher, ½ where equal (the Mann–Whitney U over n·m); the mean over strata.
//!            Its interval resamples X and Y independently, each within every stratum
//!            (rliable's StratifiedIndependentBootstrap), as does the IQM difference's
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
    for _ in 0..resamples {
        let mut sample = resample_within(&strata, &mut rng).concat();
        sample.sort_by(f64::total_cmp);
        for (k, statistic) in statistics.iter().enumerate() {
            draws[k].push(statistic(&sample));
        }
    }
    let mut draws = draws.into_iter();
    std::array::from_fn(|k| percentile_interval(statistics[k](&pooled), draws.next().expect("K draws")))
}

/// One stratified resample: within each stratum, as many values as it has, drawn with replacement from it.
fn resample_within<S: AsRef<[f64]>>(strata: &[S], rng: &mut Pcg64) -> Vec<Vec<f64>> {
    strata
        .iter()
        .map(|s| {
            let s = s.as_ref();
            (0..s.len()).map(|_| s[rng.random_range(0..s.len())]).collect()
        })
        .collect()
}

/// `point` with the [`CONFIDENCE`] percentile interval of its resampled `draws`.
fn percentile_interval(point: f64, mut draws: Vec<f64>) -> Estimate {
    let tail = (1.0 - CONFIDENCE) / 2.0 * 100.0;
    draws.sort_by(f64::total_cmp);
    Estimate { point, lo: percentile_sorted(&draws, tail), hi: percentile_sorted(&draws, 100.0 - tail) }
}

/// The [`iqm`] of `strata` pooled, with its stratified bootstrap interval from `resamples` resamples (fewer than
/// [`BOOTSTRAP_RESAMPLES`] where many are needed, e.g. one per point of a learning curve).
pub fn iqm_interval(strata: &[Vec<f64>], resamples: usize) -> Estimate {
    let [iqm] = stratified_bootstrap(strata, &[|s| trim_mean_sorted(s, 0.25)], resamples, BOOTSTRAP_SEED);
    iqm
}

/// Two sets of runs, X and Y, compared as rliable does ([`compare`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// rliable's probability of improvement P(X > Y): the chance that a run of X scores higher than a run of
    /// Y on the same env (ties count half), averaged over envs; 0.5 is "neither is better".
    pub improvement: Estimate,
    /// IQM of X minus IQM of Y (each pooled over its strata).
    pub iqm_difference: Estimate,
}

/// P(X > Y) of one stratum, both sorted ascending: the pairs where `x` is higher, plus half the ties, over all
/// `x.len() · y.len()` pairs (one merge, not every pair).
fn improvement_sorted(x: &[f64], y: &[f64]) -> f64 {
    let (mut below, mut up_to) = (0, 0); // y[..below] < x_i, y[..up_to] <= x_i
    let mut wins = 0.0;
    for &v in x {
        while below < y.len() && y[below] < v {
            below += 1;
        }
        up_to = up_to.max(below);
        while up_to < y.len() && y[up_to] <= v {
            up_to += 1;
        }
        wins += below as f64 + 0.5 * (up_to - below) as f64;
    }
    wins / (x.len() * y.len()) as f64
}

/// rliable's probability of improvement of X over Y: per stratum (the same env in both, position for
/// position), the fraction of pairs where X's run scores higher (ties half), averaged over the strata. NaN
/// where a stratum is empty on either side.
pub fn probability_of_improvement(x: &[Vec<f64>], y: &[Vec<f64>]) -> f64 {
    let sorted = |s: &Vec<f64>| {
        let mut s = s.clone();
        s.sort_by(f64::total_cmp);
        s
    };
    strata_improvement(&x.iter().map(sorted).collect::<Vec<_>>(), &y.iter().map(sorted).collect::<Vec<_>>())
}

fn strata_improvement(x: &[Vec<f64>], y: &[Vec<f64>]) -> f64 {
    assert_eq!(x.len(), y.len(), "X and Y have one stratum per env, the same envs");
    if x.is_empty() || x.iter().chain(y).any(Vec::is_empty) {
        return f64::NAN;
    }
    x.iter().zip(y).map(|(x, y)| improvement_sorted(x, y)).sum::<f64>() / x.len() as f64
}

/// X against Y, each given as strata (one per env, the same envs in the same order on both sides): the
/// probability of improvement and the IQM difference, each with its percentile interval over
/// [`BOOTSTRAP_RESAMPLES`] resamples from [`BOOTSTRAP_SEED`] in which X and Y are resampled independently,
/// each within every stratum, keeping its sizes. NaN everywhere where a stratum is empty on either side.
pub fn compare(x: &[Vec<f64>], y: &[Vec<f64>]) -> Comparison {
    assert_eq!(x.len(), y.len(), "X and Y have one stratum per env, the same envs");
    let nan = Estimate { point: f64::NAN, lo: f64::NAN, hi: f64::NAN };
    if x.is_empty() || x.iter().chain(y).any(Vec::is_empty) {
        return Comparison { improvement: nan, iqm_difference: nan };
    }
    let iqm_pooled = |strata: &[Vec<f64>]| {
        let mut pooled = strata.concat();
        pooled.sort_by(f64::total_cmp);
        trim_mean_sorted(&pooled, 0.25)
    };
    let mut rng = Pcg64::seed_from_u64(BOOTSTRAP_SEED);
    let mut sorted_resample = |strata: &[Vec<f64>]| {
        let mut r = resample_within(strata, &mut rng);
        r.iter_mut().for_each(|s| s.sort_by(f64::total_cmp));
        r
    };
    let (mut improvements, mut differences) =
        (Vec::with_capacity(BOOTSTRAP_RESAMPLES), Vec::with_capacity(BOOTSTRAP_RESAMPLES));
    for _ in 0..BOOTSTRAP_RESAMPLES {
        let (rx, ry) = (sorted_resample(x), sorted_resample(y));
        improvements.push(strata_improvement(&rx, &ry));
        differences.push(iqm_pooled(&rx) - iqm_pooled(&ry));
    }
    Comparison {
        improvement: percentile_interval(probability_of_improvement(x, y), improvements),
        iqm_difference: percentile_interval(iqm_pooled(x) - iqm_pooled(y), differences),
    }
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

    /// Every pair counted by hand, against the merge.
    fn improvement_by_pairs(x: &[f64], y: &[f64]) -> f64 {
        let wins: f64 = x
            .iter()
            .flat_map(|a| {
                y.iter().map(move |b| {
                    if a > b {
                        1.0
                    } else if a == b {
                        0.5
                    } else {
                        0.0
                    }
                })
            })
            .sum();
        wins / (x.len() * y.len()) as f64
    }

    #[test]
    fn probability_of_improvement_counts_pairs_with_ties_half_and_averages_strata() {
        // 10 > 5; 20 > 5, 20 = 20; 30 > 5, 20, 25: (1 + 1.5 + 3) / 9.
        let (x, y) = (vec![30.0, 10.0, 20.0], vec![20.0, 5.0, 25.0]);
        assert!(close(probability_of_improvement(std::slice::from_ref(&x), std::slice::from_ref(&y)), 5.5 / 9.0));
        assert!(
            close(probability_of_improvement(std::slice::from_ref(&y), std::slice::from_ref(&x)), 3.5 / 9.0),
            "P(Y > X) = 1 − P(X > Y)"
        );
        // Two strata: the mean of theirs, whatever their sizes.
        let p = probability_of_improvement(&[x.clone(), vec![1.0]], &[y.clone(), vec![2.0, 0.0, 1.0, 5.0]]);
        assert!(close(p, (5.5 / 9.0 + (1.0 + 0.5) / 4.0) / 2.0), "{p}");
        // The merge against every pair, on ties-heavy samples.
        let a = [3.0, 1.0, 3.0, 2.0, 2.0, 5.0, 3.0];
        let b = [2.0, 3.0, 3.0, 0.0, 6.0];
        let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
        sa.sort_by(f64::total_cmp);
        sb.sort_by(f64::total_cmp);
        assert!(close(improvement_sorted(&sa, &sb), improvement_by_pairs(&a, &b)));
        assert!(close(improvement_sorted(&sb, &sa), improvement_by_pairs(&b, &a)));
        assert!(probability_of_improvement(&[vec![1.0]], &[vec![]]).is_nan());
    }

    #[test]
    fn a_comparison_holds_its_points_and_separates_only_what_differs() {
        let x = vec![vec![30.0, 10.0, 20.0, 40.0]];
        let y = vec![vec![20.0, 5.0, 25.0, 15.0]];
        let c = compare(&x, &y);
        assert_eq!(c, compare(&x, &y), "a fixed seed gives the same intervals");
        assert!(close(c.improvement.point, probability_of_improvement(&x, &y)));
        assert!(close(c.iqm_difference.point, iqm(&x[0]) - iqm(&y[0])));
        for e in [c.improvement, c.iqm_difference] {
            assert!(e.lo <= e.point && e.point <= e.hi, "{e:?}");
        }
        assert!(c.improvement.lo >= 0.0 && c.improvement.hi <= 1.0);
        // Sets far apart: X above Y in every resample.
        let far = compare(&[vec![100.0, 101.0, 102.0]], &[vec![0.0, 1.0, 2.0]]);
        assert_eq!((far.improvement.lo, far.improvement.hi), (1.0, 1.0));
        assert!(far.iqm_difference.lo >= 98.0 && far.iqm_difference.hi <= 102.0, "{:?}", far.iqm_difference);
        // The same set against itself: 0.5 at the point, an interval around it.
        let same = compare(&x, &x);
        assert_eq!(same.improvement.point, 0.5);
        assert!(same.improvement.lo < 0.5 && same.improvement.hi > 0.5, "{:?}", same.improvement);
        assert!(compare(&x, &[vec![]]).improvement.point.is_nan());
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
