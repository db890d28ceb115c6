//! `flotilla plot` (learning curves) and `flotilla eval --render` (frames of evaluation episodes) on tiny CartPole
//! PPO runs: the images decode, have the promised size, and show what they should.
mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use common::{config, flotilla, scratch, text};

/// `flotilla plot`'s first two line colours (matplotlib's tab10 blue and orange).
const FIRST: [u8; 3] = [31, 119, 180];
const SECOND: [u8; 3] = [255, 127, 14];

/// Train a 4096-step CartPole PPO run with seed `seed` (an evaluation every 1024 steps) into `dir/name`.
fn train(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let out = dir.join(name);
    let seed = format!("run.seed={seed}");
    let o = flotilla(&[
        "train",
        &config("cartpole_ppo.toml"),
        "--set",
        "run.total_env_steps=4096",
        "--set",
        "eval.interval_steps=1024",
        "--set",
        &seed,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    out
}

/// A PNG's width, height and RGB pixels.
fn decode(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("{}: colour type {other:?}", path.display()),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let pixels = buf[..info.buffer_size()].chunks_exact(channels).map(|p| [p[0], p[1], p[2]]).collect();
    (info.width, info.height, pixels)
}

#[test]
fn plot_draws_two_runs_with_bands_legend_and_threshold() {
    let dir = scratch("plot", "curves");
    let a = train(&dir, "ppo-seed1", 1);
    let b = train(&dir, "ppo-seed2", 2);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    let png = dir.join("curves.png");
    let o = flotilla(&["plot", a, b, "--out", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (w, h, pixels) = decode(&png);
    assert_eq!((w, h), (1000, 600));
    let colours: HashSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(colours.len() > 10, "a nearly blank image: {} colours", colours.len());
    for (run, c) in [("first", FIRST), ("second", SECOND)] {
        let n = pixels.iter().filter(|p| **p == c).count();
        assert!(n > 100, "the {run} run's colour {c:?} covers {n} pixels");
    }
    // Drawn again over it (one run now): replaced whole, through a temporary file that does not stay.
    let o = flotilla(&["plot", a, "--out", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (_, _, again) = decode(&png);
    assert_eq!(again.iter().filter(|p| **p == SECOND).count(), 0, "the second run's line is gone");
    // A target that cannot be replaced (a directory) is an error naming it, and leaves nothing behind.
    let blocked = dir.join("blocked.png");
    std::fs::create_dir(&blocked).unwrap();
    let o = flotilla(&["plot", a, "--out", blocked.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("blocked.png"), "{}", text(&o));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");

    let svg = dir.join("curves.svg");
    let o = flotilla(&["plot", a, b, "--out", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let svg = std::fs::read_to_string(&svg).unwrap();
    for expected in ["ppo-seed1", "ppo-seed2", "CartPole-v1 threshold (475)", "env steps", "eval/mean_return"] {
        assert!(svg.contains(expected), "the SVG has no {expected:?}");
    }

    // --group: the two seeds as one line with a band across them.
    let grouped = dir.join("grouped.svg");
    let o = flotilla(&["plot", a, b, "--group", "--out", grouped.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let grouped = std::fs::read_to_string(&grouped).unwrap();
    assert!(grouped.contains("ppo (2 seeds, mean ± std)"), "{grouped}");
    assert!(!grouped.contains("ppo-seed1"));
    // A third seed that wrote checkpoints and metrics rows at other intervals joins them (bookkeeping, not
    // learning); one with another learning rate is a line of its own.
    let edited = |name: &str, from: &str, to: &str| {
        let d = dir.join(name);
        let o = std::process::Command::new("cp").arg("-r").arg(b).arg(&d).output().unwrap();
        assert!(o.status.success());
        let config = std::fs::read_to_string(d.join("config.toml")).unwrap();
        assert!(config.contains(from), "{config}");
        std::fs::write(d.join("config.toml"), config.replace(from, to).replace("seed = 2\n", "seed = 3\n")).unwrap();
        d.to_str().unwrap().to_string()
    };
    let c = edited("ppo-seed3", "[checkpoint]\ninterval_steps = 0", "[checkpoint]\ninterval_steps = 2048");
    let lr = edited("other-lr", "learning_rate = 0.001\n", "learning_rate = 0.0003\n");
    let three = dir.join("three.svg");
    let o = flotilla(&["plot", a, b, &c, &lr, "--group", "--out", three.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let three = std::fs::read_to_string(&three).unwrap();
    assert!(three.contains("ppo (3 seeds, mean ± std)") && three.contains("other-lr"), "{three}");

    // --reference: a published curve (label, env_steps, value rows; a label with a comma) beside the group, in
    // the next colour; a malformed file is refused naming its line, and so is --reference against train_secs.
    let reference = dir.join("reference.csv");
    std::fs::write(&reference, "label,env_steps,value\nSB3, RL Zoo,1024,40.5\nSB3, RL Zoo,4096,210\n").unwrap();
    let with_ref = dir.join("reference.png");
    let r = reference.to_str().unwrap();
    let o = flotilla(&["plot", a, b, "--group", "--reference", r, "--out", with_ref.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (_, _, pixels) = decode(&with_ref);
    let n = pixels.iter().filter(|p| **p == SECOND).count();
    assert!(n > 100, "the reference line's colour {SECOND:?} covers {n} pixels");
    let with_ref = dir.join("reference.svg");
    let o = flotilla(&["plot", a, b, "--group", "--reference", r, "--out", with_ref.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let svg = std::fs::read_to_string(&with_ref).unwrap();
    assert!(svg.contains("SB3, RL Zoo") && svg.contains("ppo (2 seeds, mean ± std)"), "{svg}");
    std::fs::write(&reference, "label,env_steps,value\nSB3,1024,40.5\nSB3,lots,210\n").unwrap();
    let o = flotilla(&["plot", a, "--reference", r, "--out", dir.join("x.png").to_str().unwrap()]);
    let err = text(&o);
    assert!(!o.status.success() && err.contains("line 3") && err.contains("env_steps is not a finite"), "{err}");
    std::fs::write(&reference, "steps,value\n1024,40.5\n").unwrap();
    let o = flotilla(&["plot", a, "--reference", r, "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("label,env_steps,value"), "{}", text(&o));
    let o = flotilla(&["plot", a, "--reference", r, "--x", "train_secs", "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("--x env_steps"), "{}", text(&o));
    assert!(!dir.join("x.png").exists());

    // --x train_secs: the same curves against training seconds; another column, or --group with it, is refused.
    let secs = dir.join("secs.svg");
    let o = flotilla(&["plot", a, b, "--x", "train_secs", "--out", secs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let secs = std::fs::read_to_string(&secs).unwrap();
    assert!(secs.contains("train secs") && !secs.contains("env steps") && secs.contains("ppo-seed1"), "{secs}");
    let o = flotilla(&["plot", a, "--x", "wall", "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("no wall column") && text(&o).contains("train_secs"),
        "{}",
        text(&o)
    );
    let o = flotilla(&["plot", a, b, "--group", "--x", "train_secs", "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("--x env_steps"), "{}", text(&o));

    // Errors name what is wrong.
    let o = flotilla(&["plot", a, "--metric", "eval/nope", "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o);
    assert!(err.contains("\"eval/nope\"") && err.contains("metrics.csv") && err.contains("eval/std_return"), "{err}");
    let not_a_run = dir.join("empty");
    std::fs::create_dir_all(&not_a_run).unwrap();
    let o = flotilla(&["plot", not_a_run.to_str().unwrap(), "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains(not_a_run.to_str().unwrap()), "{}", text(&o));
    assert!(!dir.join("x.png").exists());

    // A run that has logged nothing yet.
    let fresh = dir.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::copy(Path::new(a).join("config.toml"), fresh.join("config.toml")).unwrap();
    std::fs::write(fresh.join("metrics.csv"), "").unwrap();
    let o = flotilla(&["plot", fresh.to_str().unwrap(), "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("metrics.csv is empty"), "{}", text(&o));
    std::fs::write(fresh.join("metrics.csv"), "env_steps,eval/mean_return\n1024,\n").unwrap();
    let o = flotilla(&["plot", fresh.to_str().unwrap(), "--out", dir.join("x.png").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no values of eval/mean_return"), "{}", text(&o));

    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eval_render_writes_a_frame_per_state() {
    let dir = scratch("plot", "render");
    let run = train(&dir, "ppo", 3);
    let run = run.to_str().unwrap();
    let frames = dir.join("frames");
    let o = flotilla(&["eval", run, "--episodes", "2", "--render", frames.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();

    // The same episodes as plain `flotilla eval` plays.
    let plain = flotilla(&["eval", run, "--episodes", "2"]);
    assert!(plain.status.success(), "{}", text(&plain));
    let summary = |s: &str| s.lines().find(|l| l.starts_with("CartPole-v1: mean return")).map(|l| l[..40].to_string());
    assert_eq!(summary(&stdout), summary(&String::from_utf8_lossy(&plain.stdout)), "{stdout}");

    for k in 0..2 {
        // "episode K: return R, length L, N frames in DIR"
        let line = stdout.lines().find(|l| l.starts_with(&format!("episode {k}:"))).expect("a line per episode");
        let length: usize = line.split("length ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        let folder = frames.join(format!("episode-{k}"));
        let mut names: Vec<String> =
            std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        // The reset state, then the state after each of the episode's steps.
        assert_eq!(names.len(), length + 1, "{line}");
        assert_eq!(names[0], "frame-0000.png");
        assert_eq!(names[length], format!("frame-{length:04}.png"));
        let decoded: Vec<Vec<[u8; 3]>> = names
            .iter()
            .map(|n| {
                let (w, h, pixels) = decode(&folder.join(n));
                assert_eq!((w, h), (600, 400));
                pixels
            })
            .collect();
        // The cart moves or the pole turns every step, but a balanced pole can move less than a pixel (no
        // anti-aliasing): 178 of 216 steps changed the frame in one run.
        let differ = decoded.windows(2).filter(|f| f[0] != f[1]).count();
        assert!(differ * 2 >= length, "episode {k}: {differ} of {length} steps change the frame");
        assert_ne!(decoded[0], decoded[length]);
        let colours: HashSet<[u8; 3]> = decoded[0].iter().copied().collect();
        assert!(colours.len() >= 4, "cart, pole, axle and background: {colours:?}");
    }

    // Envs without a renderer are named.
    let latency = dir.join("latency");
    let o = flotilla(&[
        "train",
        &config("cartpole_ppo.toml"),
        "--set",
        "env.id=\"Latency-v0\"",
        "--set",
        "env.kwargs.step_latency_us=0",
        "--set",
        "run.total_env_steps=512",
        "--set",
        "eval.episodes=1",
        "--out",
        latency.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = flotilla(&["eval", latency.to_str().unwrap(), "--render", dir.join("none").to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--render cannot draw Latency-v0"), "{}", text(&o));

    let _ = std::fs::remove_dir_all(&dir);
}
