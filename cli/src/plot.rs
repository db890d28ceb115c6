//! `flotilla plot`: learning curves of one or more run directories.
//!
//! ```text
//! flotilla plot RUN_DIR [RUN_DIR ...] [--metric eval/mean_return] [--x env_steps] [--out curves.png] [--group]
//! ```
//! x is `env_steps` (or the column `--x` names, e.g. `train_secs`: training seconds), y one column of each run's `metrics.csv` (rows where it is empty are skipped, so evaluation
//! columns give one point per evaluation). Where the metric has a std column beside it (`eval/std_return` for
//! `eval/mean_return`: the std of the evaluation's episodes) a ± std band is drawn around the line. One colour per
//! run, named after its directory. A return metric of an env with a registered reward threshold (Gymnasium's,
//! `flotilla_envs::spec`) gets a dashed line at that threshold. `--group` draws runs whose configs differ only in
//! `run.seed` as one line, the mean over those runs, with a ± std band across them (only env steps every run of
//! the group logged count).
//!
//! A population directory (`population.json`, `flotilla train --population`) stands for its members' run
//! directories, each a line named `POPULATION/NNN` (members that have logged nothing yet are skipped). With
//! `--group` a population is one line instead: the IQM across its members at each env step all of them logged,
//! with a 95 % stratified bootstrap band (`flotilla_learner::stats`, as `flotilla report` computes), labelled
//! "IQM of N members"; the job directories of one sweep given together are one population.
//!
//! `--reference CSV` adds published curves (e.g. another library's, read off its plots) as lines of their own
//! after the runs': the file's header is `label,env_steps,value`, and each label's rows, in file order, are one
//! line. Only against env steps; a malformed file is refused naming its line.
//!
//! The format follows `--out`'s extension: `.svg` writes SVG (text as `<text>` elements), anything else PNG. The
//! file is written atomically (a temporary file renamed over `--out`).
//! Text is drawn with the DejaVu Sans font bundled in the binary (`cli/assets/`), so no system font is needed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::population::POPULATION_FILE;
use flotilla_learner::run_dir::{METRICS_FILE, RunDir};
use flotilla_learner::stats;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report;

/// DejaVu Sans (Bitstream Vera license, `cli/assets/DejaVuSans.LICENSE`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Matplotlib's "tab10" colours, one per run.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Bootstrap resamples of each point of a population's IQM band (one interval per evaluation).
const CURVE_RESAMPLES: usize = 2_000;

/// Chart size in pixels (PNG) or SVG units.
const SIZE: (u32, u32) = (1000, 600);

/// Make the bundled font plotters' "sans-serif" (once per process).
pub fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ok = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok();
        debug_assert!(ok, "the bundled font parses");
    });
}

/// The colour `flotilla plot` gives the `i`-th line.
pub fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// One column of a run's metrics, with its std column where there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// The points in row order.
    pub points: Vec<Point>,
}

/// `(env_steps, value, band)`: the band is `(lower, upper)` (value ± std, or a confidence interval).
pub type Point = (f64, f64, Option<(f64, f64)>);

/// A run directory read for plotting.
struct Run {
    name: String,
    config: ExperimentConfig,
    series: Series,
    /// For a population's member: the population it belongs to (index into the populations read).
    population: Option<usize>,
}

/// A population directory given to `flotilla plot` (several for the jobs of one sweep).
struct Population {
    name: String,
    /// What makes two job directories one population: the record's size, seeds, keys and jobs, env and algorithm.
    key: String,
}

/// Read every RUN_DIR, a population directory as its members.
fn read_runs(dirs: &[PathBuf], x: &str, metric: &str) -> Result<(Vec<Run>, Vec<Population>)> {
    let (mut runs, mut populations) = (Vec::new(), Vec::<Population>::new());
    for dir in dirs {
        if !dir.join(POPULATION_FILE).is_file() {
            runs.push(read_run(dir, x, metric)?);
            continue;
        }
        let source = report::Source::read(dir)?;
        let record = source.record.as_ref().expect("a population directory has a record");
        let name = dir_name(dir);
        // A job of a split sweep joins the other jobs of a population like it; a whole population is its own.
        let key = match (record.jobs, source.member_dirs().first()) {
            (2.., Some((_, first))) => {
                let (_, config) = RunDir::open(first)?;
                let (size, seed, keys) = (record.size, record.base_seed, &record.sweep_keys);
                format!("{size} {seed} {keys:?} {} {} {}", record.jobs, config.env.id, config.algorithm.name())
            }
            _ => format!("{}", std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone()).display()),
        };
        let p = match populations.iter().position(|p| p.key == key) {
            Some(p) => p,
            None => {
                populations.push(Population { name: name.clone(), key });
                populations.len() - 1
            }
        };
        for (index, member) in source.member_dirs() {
            if report::read_metric(&member, metric)?.is_empty() {
                eprintln!("{}: no values of {metric} yet; left out", member.display());
                continue;
            }
            let mut run = read_run(&member, x, metric)?;
            run.name = format!("{name}/{:03}", index.unwrap_or(0));
            run.series.label = run.name.clone();
            run.population = Some(p);
            runs.push(run);
        }
    }
    Ok((runs, populations))
}

/// A directory's own name (of its canonical path: `.` gives the current directory's).
fn dir_name(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

/// `flotilla plot`: read every run's `metric`, draw the chart, write it to `out`.
pub fn plot_command(
    runs: &[PathBuf],
    metric: &str,
    x: &str,
    out: &Path,
    group: bool,
    references: &[PathBuf],
) -> Result<()> {
    anyhow::ensure!(!runs.is_empty(), "give at least one RUN_DIR");
    anyhow::ensure!(
        !group || x == "env_steps",
        "--group averages runs at the env steps they share: it needs --x env_steps, not {x}"
    );
    anyhow::ensure!(
        references.is_empty() || x == "env_steps",
        "--reference curves are against env steps: they need --x env_steps, not {x}"
    );
    let reference_series = references.iter().map(|r| read_reference(r)).collect::<Result<Vec<_>>>()?;
    let (runs, populations) = read_runs(runs, x, metric)?;
    anyhow::ensure!(!runs.is_empty(), "no run has values of {metric} yet");
    let mut thresholds: Vec<(String, f64)> = Vec::new();
    if metric.ends_with("return") {
        for run in &runs {
            if let Some(t) = reward_threshold(&run.config)
                && !thresholds.contains(&t)
            {
                thresholds.push(t);
            }
        }
    }
    let mut envs: Vec<&str> = runs.iter().map(|r| r.config.env.id.as_str()).collect();
    envs.dedup();
    let title = format!("{metric} on {}", envs.join(", "));
    let mut series = if group { grouped(runs, &populations) } else { runs.into_iter().map(|r| r.series).collect() };
    series.extend(reference_series.into_iter().flatten());
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let svg = out.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    register_font();
    // Drawn to a temporary file beside `out` and renamed over it: a plot redrawn over an old one (a long run's
    // curve, refreshed) is never seen half-written, and a failed drawing leaves the old one.
    flotilla_algorithms::atomic_write::write_atomic(out, |tmp| {
        let drawn = if svg {
            draw(SVGBackend::new(tmp, SIZE).into_drawing_area(), &title, x, metric, &series, &thresholds)
        } else {
            draw(BitMapBackend::new(tmp, SIZE).into_drawing_area(), &title, x, metric, &series, &thresholds)
        };
        drawn.map_err(|e| std::io::Error::other(e.to_string()))
    })
    .map_err(|e| anyhow::anyhow!("drawing {}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Read `metric` (and its std column) from the run directory `dir`.
fn read_run(dir: &Path, x: &str, metric: &str) -> Result<Run> {
    let (_, config) = RunDir::open(dir)?;
    let path = dir.join(METRICS_FILE);
    let std = std_column(metric);
    let Some(rows) = report::read_columns_against(dir, x, metric, std.as_deref())? else {
        bail!("{} is empty (or missing): the run has logged nothing yet", path.display())
    };
    let points: Vec<_> =
        rows.into_iter().map(|(steps, value, sd)| (steps, value, sd.map(|sd| (value - sd, value + sd)))).collect();
    anyhow::ensure!(!points.is_empty(), "{} has no values of {metric} yet", path.display());
    let name = dir_name(dir);
    Ok(Run { name: name.clone(), config, series: Series { label: name, points }, population: None })
}

/// The curves of a `--reference` CSV (header `label,env_steps,value`): one series per label, in the order the
/// labels first appear, each its rows in file order. A label may hold commas, bare or inside CSV quotes.
fn read_reference(path: &Path) -> Result<Vec<Series>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --reference {}", path.display()))?;
    parse_reference(&text).with_context(|| format!("--reference {}", path.display()))
}

/// [`read_reference`] on the file's text.
fn parse_reference(text: &str) -> Result<Vec<Series>> {
    let mut lines = text.lines().enumerate();
    match lines.next().map(|(_, h)| h.trim()) {
        Some("label,env_steps,value") => {}
        Some(other) => bail!("the first line must be the header `label,env_steps,value`, not {other:?}"),
        None => bail!("an empty file (its first line must be the header `label,env_steps,value`)"),
    }
    let mut series: Vec<Series> = Vec::new();
    for (i, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |why: &str| anyhow::anyhow!("line {}: {why}: {line:?}", i + 1);
        let mut fields = line.rsplitn(3, ',');
        let (value, steps, label) = match (fields.next(), fields.next(), fields.next()) {
            (Some(v), Some(s), Some(l)) => (v.trim(), s.trim(), l.trim()),
            _ => return Err(bad("expected label,env_steps,value")),
        };
        let label = match label.strip_prefix('"').and_then(|l| l.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\"\"", "\""),
            None => label.to_string(),
        };
        anyhow::ensure!(!label.is_empty(), bad("the label is empty"));
        let number = |s: &str, what: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(&format!("{what} is not a finite number")))
        };
        let (x, y) = (number(steps, "env_steps")?, number(value, "value")?);
        anyhow::ensure!(x >= 0.0, bad("env_steps is negative"));
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((x, y, None)),
            None => series.push(Series { label, points: vec![(x, y, None)] }),
        }
    }
    anyhow::ensure!(!series.is_empty(), "no rows after the header");
    Ok(series)
}

/// The std column that goes with a mean column: `eval/std_return` for `eval/mean_return`.
fn std_column(metric: &str) -> Option<String> {
    let (head, last) = metric.rsplit_once('/').map_or(("", metric), |(h, l)| (h, l));
    let rest = last.strip_prefix("mean_")?;
    Some(if head.is_empty() { format!("std_{rest}") } else { format!("{head}/std_{rest}") })
}

/// The registered reward threshold of a single-env run's env (native or `gymnasium:` id of a native env).
fn reward_threshold(config: &ExperimentConfig) -> Option<(String, f64)> {
    if !config.env.tasks.is_empty() {
        return None;
    }
    let id = config.env.id.strip_prefix("gymnasium:").unwrap_or(&config.env.id);
    let threshold = flotilla_envs::spec(id).ok()?.reward_threshold?;
    Some((id.to_string(), threshold))
}

/// Runs whose configs differ only in `run.seed` and in `[checkpoint]` and `[metrics]`, each group as one series: the mean over its runs at the env
/// steps all of them logged, with the std across runs as the band. A group of one is drawn as it is. Each
/// population is one series of its own: [`population_iqm`].
fn grouped(runs: Vec<Run>, populations: &[Population]) -> Vec<Series> {
    let mut groups: Vec<(String, Vec<Run>)> = Vec::new();
    for run in runs {
        let key = match run.population {
            Some(p) => format!("population {}", populations[p].key),
            None => {
                // What the runs learn: neither the seed nor the bookkeeping (checkpoint and metrics-row
                // intervals change no step of training: resume is bit for bit) tells them apart.
                let mut key = run.config.clone();
                key.run.seed = 0;
                key.checkpoint = Default::default();
                key.metrics = Default::default();
                key.to_toml()
            }
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(run),
            None => groups.push((key, vec![run])),
        }
    }
    groups
        .into_iter()
        .map(|(_, mut members)| {
            if let Some(p) = members[0].population {
                return population_iqm(&populations[p].name, &members);
            }
            if members.len() == 1 {
                return members.pop().expect("one member").series;
            }
            let n = members.len();
            let mut at: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            for m in &members {
                for &(x, y, _) in &m.series.points {
                    at.entry(x as u64).or_default().push(y);
                }
            }
            let points = at
                .into_iter()
                .filter(|(_, ys)| ys.len() == n)
                .map(|(x, ys)| {
                    let mean = ys.iter().sum::<f64>() / n as f64;
                    let std = (ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
                    (x as f64, mean, Some((mean - std, mean + std)))
                })
                .collect();
            let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
            Series { label: format!("{} ({n} seeds, mean ± std)", group_name(&names)), points }
        })
        .collect()
}

/// A population's members as one series: at each env step every member logged, the IQM across them with its 95 %
/// bootstrap interval (members resampled within each env id) as the band.
fn population_iqm(name: &str, members: &[Run]) -> Series {
    let n = members.len();
    let mut at: BTreeMap<u64, BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    for m in members {
        for &(x, y, _) in &m.series.points {
            at.entry(x as u64).or_default().entry(m.config.env.id.as_str()).or_default().push(y);
        }
    }
    let points: Vec<_> = at
        .into_iter()
        .filter_map(|(x, by_env)| {
            let strata: Vec<Vec<f64>> = by_env.into_values().collect();
            (strata.iter().map(Vec::len).sum::<usize>() == n).then(|| {
                let iqm = stats::iqm_interval(&strata, CURVE_RESAMPLES);
                (x as f64, iqm.point, Some((iqm.lo, iqm.hi)))
            })
        })
        .collect();
    if points.is_empty() {
        eprintln!("{name}: no env step at which all {n} members logged a value; its IQM line is empty");
    }
    Series { label: format!("{name}: IQM of {n} members (95% CI)"), points }
}

/// A group's label: the run names' common prefix (without a trailing separator, "seed" or "_s"), else the first name.
fn group_name(names: &[&str]) -> String {
    let first = names[0];
    let mut len = first.len();
    for name in &names[1..] {
        len = len.min(first.bytes().zip(name.bytes()).take_while(|(a, b)| a == b).count());
    }
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    let prefix = first[..len].trim_end_matches(|c: char| c.is_ascii_digit());
    // `…seed1`, `…_s1`: the seed's own marker goes with its number.
    let marked =
        prefix.strip_suffix("seed").or_else(|| prefix.strip_suffix("_s")).or_else(|| prefix.strip_suffix("-s"));
    let prefix = marked.unwrap_or(prefix).trim_end_matches(['-', '_', '.', ' ']);
    if prefix.is_empty() { first.to_string() } else { prefix.to_string() }
}

/// `12500` as "12.5k", `2000000` as "2M".
fn steps_label(x: f64) -> String {
    let short = |v: f64, unit: &str| {
        let s = format!("{v:.2}");
        format!("{}{unit}", s.trim_end_matches('0').trim_end_matches('.'))
    };
    match x.abs() {
        a if a >= 1e9 => short(x / 1e9, "G"),
        a if a >= 1e6 => short(x / 1e6, "M"),
        a if a >= 1e3 => short(x / 1e3, "k"),
        _ => short(x, ""),
    }
}

/// The chart: bands, lines, threshold lines, axes and legend.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x: &str,
    metric: &str,
    series: &[Series],
    thresholds: &[(String, f64)],
) -> std::result::Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(0.0, f64::max).max(1.0);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(_, y, band) in series.iter().flat_map(|s| &s.points) {
        let (l, h) = band.unwrap_or((y, y));
        (lo, hi) = (lo.min(l).min(y), hi.max(h).max(y));
    }
    for &(_, t) in thresholds {
        (lo, hi) = (lo.min(t), hi.max(t));
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 1.0 };
    let (lo, hi) = (lo - pad, hi + pad);

    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..x_max, lo..hi)?;
    chart
        .configure_mesh()
        .x_desc(if x == "env_steps" { "env steps".to_string() } else { x.replace('_', " ") })
        .y_desc(metric)
        .x_label_formatter(&|x| steps_label(*x))
        .y_label_formatter(&|y| {
            let s = format!("{y:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        })
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .bold_line_style(RGBColor(220, 220, 220))
        .light_line_style(RGBColor(246, 246, 246))
        .draw()?;

    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        let band: Vec<(f64, f64)> = s.points.iter().filter_map(|&(x, _, b)| b.map(|(_, h)| (x, h))).collect();
        if band.len() == s.points.len() && band.len() > 1 {
            let lower = s.points.iter().rev().map(|&(x, y, b)| (x, b.map_or(y, |(l, _)| l)));
            let polygon: Vec<(f64, f64)> = band.into_iter().chain(lower).collect();
            chart.draw_series(std::iter::once(Polygon::new(polygon, c.mix(0.18).filled())))?;
        }
        chart
            .draw_series(LineSeries::new(s.points.iter().map(|&(x, y, _)| (x, y)), c.stroke_width(2)))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
        if s.points.len() == 1 {
            let (x, y, _) = s.points[0];
            chart.draw_series(std::iter::once(Circle::new((x, y), 4, c.filled())))?;
        }
    }
    for (env, t) in thresholds {
        let dashed = DashedLineSeries::new(vec![(0.0, *t), (x_max, *t)], 10, 6, BLACK.mix(0.7).stroke_width(2));
        chart
            .draw_series(dashed)?
            .label(format!("{env} threshold ({t})"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.mix(0.7).stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .margin(12)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_columns_pair_with_mean_columns() {
        assert_eq!(std_column("eval/mean_return").as_deref(), Some("eval/std_return"));
        assert_eq!(std_column("eval/walk/mean_return").as_deref(), Some("eval/walk/std_return"));
        assert_eq!(std_column("mean_x").as_deref(), Some("std_x"));
        assert_eq!(std_column("charts/episodic_return"), None);
    }

    #[test]
    fn step_labels_are_short() {
        assert_eq!(steps_label(0.0), "0");
        assert_eq!(steps_label(12500.0), "12.5k");
        assert_eq!(steps_label(100000.0), "100k");
        assert_eq!(steps_label(2_000_000.0), "2M");
    }

    #[test]
    fn reference_curves_parse_by_label_and_refuse_bad_rows_by_line() {
        let text = "label,env_steps,value\r\nA,10,1.5\r\n\"B, \"\"quoted\"\"\",10,2\nA, 20 ,-3\n\nB, bare,5,4\n";
        let series = parse_reference(text).unwrap();
        let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["A", "B, \"quoted\"", "B, bare"]);
        assert_eq!(series[0].points, [(10.0, 1.5, None), (20.0, -3.0, None)]);
        assert_eq!(series[1].points, [(10.0, 2.0, None)]);
        assert_eq!(series[2].points, [(5.0, 4.0, None)]);
        for (text, expected) in [
            ("", "an empty file"),
            ("steps,value\n1,2\n", "not \"steps,value\""),
            ("label,env_steps,value\n", "no rows"),
            ("label,env_steps,value\nA,1,2\nA,2\n", "line 3: expected label,env_steps,value"),
            ("label,env_steps,value\n,1,2\n", "line 2: the label is empty"),
            ("label,env_steps,value\nA,-1,2\n", "line 2: env_steps is negative"),
            ("label,env_steps,value\nA,1,nan\n", "line 2: value is not a finite number"),
        ] {
            let err = format!("{:#}", parse_reference(text).unwrap_err());
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        // The game table's CleanRL curves, as committed: one line each, 40 points to 2.5 M agent steps.
        let table = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/benchmarks/atari-table");
        for game in ["pong", "breakout", "beam_rider"] {
            let series = read_reference(Path::new(&format!("{table}/cleanrl_ppo_atari_{game}.csv"))).unwrap();
            assert_eq!(series.len(), 1, "{game}");
            assert_eq!((series[0].points.len(), series[0].points[39].0), (40, 2_500_000.0), "{game}");
        }
    }

    #[test]
    fn group_names_drop_the_seed() {
        assert_eq!(group_name(&["ppo-seed1", "ppo-seed2"]), "ppo");
        assert_eq!(group_name(&["run_1", "run_2", "run_3"]), "run");
        assert_eq!(group_name(&["a", "b"]), "a");
        assert_eq!(group_name(&["table_pong_s1", "table_pong_s2"]), "table_pong");
        assert_eq!(group_name(&["runs1", "runs2"]), "runs");
    }
}
