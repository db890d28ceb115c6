//! `flotilla eval RUN_DIR --render DIR`: the evaluation episodes of a classic-control run as PNG frames.
//!
//! ```text
//! DIR/episode-K/frame-NNNN.png   K = 0.. (env K, reset with seed + K, as `flotilla eval` plays it);
//!                                frame 0 is the reset state, frame t the state after step t: length + 1 frames
//! ```
//! Each frame is drawn from the observation alone, as Gymnasium's `rgb_array` renderers draw the state (same
//! sizes, scales, shapes and colours; no anti-aliasing, and no torque arrow on Pendulum): for these envs the
//! observation is the state (Acrobot's and Pendulum's angles through their cos/sin). The episodes are played
//! exactly as [`flotilla_learner::eval::evaluate`] plays them (one batch, deterministic policy), so the returns
//! printed match `flotilla eval`'s.
use std::path::Path;

use anyhow::{Context, Result, bail};
use flotilla_algorithms::{ActMode, ActOutput, Memory, Policy};
use flotilla_envs::EnvRole;
use flotilla_envs::env_actions::EnvActions;
use flotilla_learner::config::ExperimentConfig;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The envs that can be drawn, each with its Gymnasium renderer's geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scene {
    /// Cart and pole: observation `[x, x_dot, theta, theta_dot]`.
    CartPole,
    /// Two links: observation `[cos θ1, sin θ1, cos θ2, sin θ2, θ1_dot, θ2_dot]`.
    Acrobot,
    /// The hill, car and flag: observation `[position, velocity]`, goal at `goal`.
    MountainCar {
        /// Goal position (0.5 for MountainCar-v0, 0.45 for MountainCarContinuous-v0).
        goal: f64,
    },
    /// The rod: observation `[cos θ, sin θ, θ_dot]`.
    Pendulum,
}

impl Scene {
    /// The scene of a native env id (or `gymnasium:` of one); an error naming the env for any other.
    pub fn for_env(id: &str) -> Result<Scene> {
        Ok(match id.strip_prefix("gymnasium:").unwrap_or(id) {
            "CartPole-v1" => Scene::CartPole,
            "Acrobot-v1" => Scene::Acrobot,
            "MountainCar-v0" => Scene::MountainCar { goal: 0.5 },
            "MountainCarContinuous-v0" => Scene::MountainCar { goal: 0.45 },
            "Pendulum-v1" => Scene::Pendulum,
            _ => bail!(
                "--render cannot draw {id}: frames are drawn for CartPole-v1, Acrobot-v1, MountainCar-v0, \
                 MountainCarContinuous-v0 and Pendulum-v1 only"
            ),
        })
    }

    /// Frame size in pixels, as Gymnasium's.
    pub fn size(self) -> (u32, u32) {
        match self {
            Scene::CartPole | Scene::MountainCar { .. } => (600, 400),
            Scene::Acrobot | Scene::Pendulum => (500, 500),
        }
    }

    /// Draw the state `obs` on `area` (white background first).
    pub fn draw<DB: DrawingBackend>(
        self,
        area: &DrawingArea<DB, Shift>,
        obs: &[f32],
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let (w, h) = self.size();
        let s: Vec<f64> = obs.iter().map(|&v| v as f64).collect();
        // Gymnasium draws with y up, then flips the image: `px` does both.
        let px = |x: f64, y: f64| -> (i32, i32) { (x.round() as i32, (h as f64 - y).round() as i32) };
        let rotate = |(x, y): (f64, f64), a: f64| (x * a.cos() - y * a.sin(), x * a.sin() + y * a.cos());
        let shape = |corners: &[(f64, f64)], angle: f64, at: (f64, f64)| -> Vec<(i32, i32)> {
            corners
                .iter()
                .map(|&c| {
                    let (x, y) = rotate(c, angle);
                    px(x + at.0, y + at.1)
                })
                .collect()
        };
        let circle = |at: (f64, f64), r: f64, c: RGBColor| Circle::new(px(at.0, at.1), r.round() as i32, c.filled());
        area.fill(&WHITE)?;
        match self {
            Scene::CartPole => {
                let (x, theta) = (s[0], s[2]);
                let scale = w as f64 / (2.4 * 2.0);
                let (pole_w, pole_len, cart_w, cart_h) = (10.0, scale * 1.0, 50.0, 30.0);
                let cart_x = x * scale + w as f64 / 2.0;
                let cart_y = 100.0;
                let axle = (cart_x, cart_y + cart_h / 4.0);
                let (l, r, t, b) = (-cart_w / 2.0, cart_w / 2.0, cart_h / 2.0, -cart_h / 2.0);
                area.draw(&Polygon::new(
                    shape(&[(l, b), (l, t), (r, t), (r, b)], 0.0, (cart_x, cart_y)),
                    BLACK.filled(),
                ))?;
                let (l, r, t, b) = (-pole_w / 2.0, pole_w / 2.0, pole_len - pole_w / 2.0, -pole_w / 2.0);
                let pole = shape(&[(l, b), (l, t), (r, t), (r, b)], -theta, axle);
                area.draw(&Polygon::new(pole, RGBColor(202, 152, 101).filled()))?;
                area.draw(&circle(axle, pole_w / 2.0, RGBColor(129, 132, 203)))?;
                area.draw(&PathElement::new(vec![px(0.0, cart_y), px(w as f64, cart_y)], BLACK))?;
            }
            Scene::Acrobot => {
                let (t1, t2) = (s[1].atan2(s[0]), s[3].atan2(s[2]));
                let bound = 1.0 + 1.0 + 0.2;
                let scale = w as f64 / (bound * 2.0);
                let offset = w as f64 / 2.0;
                let goal_y = scale + offset;
                area.draw(&PathElement::new(
                    vec![px(-bound * scale + offset, goal_y), px(bound * scale + offset, goal_y)],
                    BLACK,
                ))?;
                let p1 = (-t1.cos() * scale, t1.sin() * scale);
                let p2 = (p1.0 - (t1 + t2).cos() * scale, p1.1 + (t1 + t2).sin() * scale);
                // Gymnasium swaps the coordinates ([:, ::-1]) before drawing.
                let joints = [(0.0, 0.0), (p1.1, p1.0)];
                let _ = p2;
                let angles = [t1 - std::f64::consts::FRAC_PI_2, t1 + t2 - std::f64::consts::FRAC_PI_2];
                for (&(x, y), &th) in joints.iter().zip(&angles) {
                    let at = (x + offset, y + offset);
                    let (l, r, t, b) = (0.0, scale, 0.1 * scale, -0.1 * scale);
                    let link = shape(&[(l, b), (l, t), (r, t), (r, b)], th, at);
                    area.draw(&Polygon::new(link, RGBColor(0, 204, 204).filled()))?;
                    area.draw(&circle(at, 0.1 * scale, RGBColor(204, 204, 0)))?;
                }
            }
            Scene::MountainCar { goal } => {
                let pos = s[0];
                let (min, max) = (-1.2, 0.6);
                let scale = w as f64 / (max - min);
                let (car_w, car_h, clearance) = (40.0, 20.0, 10.0);
                let height = |x: f64| (3.0 * x).sin() * 0.45 + 0.55;
                let hill: Vec<(i32, i32)> = (0..100)
                    .map(|i| min + (max - min) * i as f64 / 99.0)
                    .map(|x| px((x - min) * scale, height(x) * scale))
                    .collect();
                area.draw(&PathElement::new(hill, BLACK))?;
                let at = ((pos - min) * scale, clearance + height(pos) * scale);
                let tilt = (3.0 * pos).cos();
                let (l, r, t, b) = (-car_w / 2.0, car_w / 2.0, car_h, 0.0);
                area.draw(&Polygon::new(shape(&[(l, b), (l, t), (r, t), (r, b)], tilt, at), BLACK.filled()))?;
                for wheel in [(car_w / 4.0, 0.0), (-car_w / 4.0, 0.0)] {
                    let (x, y) = rotate(wheel, tilt);
                    area.draw(&circle((x + at.0, y + at.1), car_h / 2.5, RGBColor(128, 128, 128)))?;
                }
                let flag_x = (goal - min) * scale;
                let (y1, y2) = (height(goal) * scale, height(goal) * scale + 50.0);
                area.draw(&PathElement::new(vec![px(flag_x, y1), px(flag_x, y2)], BLACK))?;
                let flag = vec![px(flag_x, y2), px(flag_x, y2 - 10.0), px(flag_x + 25.0, y2 - 5.0)];
                area.draw(&Polygon::new(flag, RGBColor(204, 204, 0).filled()))?;
            }
            Scene::Pendulum => {
                let theta = s[1].atan2(s[0]);
                let scale = w as f64 / (2.2 * 2.0);
                let offset = w as f64 / 2.0;
                let (len, width) = (scale, 0.2 * scale);
                let (l, r, t, b) = (0.0, len, width / 2.0, -width / 2.0);
                let angle = theta + std::f64::consts::FRAC_PI_2;
                let rod = shape(&[(l, b), (l, t), (r, t), (r, b)], angle, (offset, offset));
                let red = RGBColor(204, 77, 77);
                area.draw(&Polygon::new(rod, red.filled()))?;
                area.draw(&circle((offset, offset), width / 2.0, red))?;
                let (ex, ey) = rotate((len, 0.0), angle);
                area.draw(&circle((ex + offset, ey + offset), width / 2.0, red))?;
                area.draw(&circle((offset, offset), 0.05 * scale, BLACK))?;
            }
        }
        Ok(())
    }

    /// Write the state `obs` as a PNG at `path`.
    pub fn save_png(self, obs: &[f32], path: &Path) -> Result<()> {
        let area = BitMapBackend::new(path, self.size()).into_drawing_area();
        self.draw(&area, obs).and_then(|()| area.present()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}

/// One rendered evaluation episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Undiscounted return.
    pub episode_return: f64,
    /// Steps.
    pub length: usize,
    /// Observations: the reset one, then the one after each step (the true final one last).
    pub states: Vec<Vec<f32>>,
}

/// Play `episodes` evaluation episodes as `flotilla eval` does (env `k` reset with `seed + k`, deterministic
/// actions, one batch), keeping every state of each env's first episode.
pub fn play(config: &ExperimentConfig, agent: &mut dyn Policy, episodes: usize, seed: u64) -> Result<Vec<Episode>> {
    anyhow::ensure!(config.env.tasks.is_empty(), "--render draws single-env runs only, not [[tasks]] runs");
    // The scenes draw from the env's whole state vector: an `[env] observe` subset does not hold it.
    anyhow::ensure!(
        config.env.observe.is_none(),
        "--render draws from the env's whole observation; this run keeps only components {:?} ([env] observe)",
        config.env.observe.as_deref().unwrap_or_default()
    );
    let mut envs = config.env.make_vector(episodes, EnvRole::Evaluation)?;
    let dim = envs.observation_space().shape().iter().product::<usize>();
    let action_space = envs.action_space().clone();
    let rows = |obs: flotilla_core::ObsRef<'_>| -> Result<Vec<f32>> {
        obs.as_f32().map(<[f32]>::to_vec).context("--render needs f32 observations (a state vector)")
    };
    let mut obs = envs.reset(Some(seed))?.to_buf();
    let first = rows(obs.as_ref())?;
    let mut played: Vec<Episode> = (0..episodes)
        .map(|k| Episode { episode_return: 0.0, length: 0, states: vec![first[k * dim..(k + 1) * dim].to_vec()] })
        .collect();
    let mut done = vec![false; episodes];
    let mut out = ActOutput::default();
    let mut env_actions = EnvActions::default();
    let mut memory = Memory::new(agent, episodes);
    while done.iter().any(|d| !d) {
        memory.act(agent, obs.as_ref(), ActMode::Deterministic, &mut out)?;
        let step = envs.step(&env_actions.convert(&action_space, &out.actions))?;
        memory.end_episodes(step.terminated, step.truncated);
        let next = rows(step.obs)?;
        for k in (0..episodes).filter(|&k| !done[k]) {
            let state = match step.final_obs(k) {
                Some(last) => rows(last)?,
                None => next[k * dim..(k + 1) * dim].to_vec(),
            };
            played[k].states.push(state);
        }
        for ep in step.episodes {
            if !std::mem::replace(&mut done[ep.env_index], true) {
                played[ep.env_index].episode_return = ep.episode_return;
                played[ep.env_index].length = ep.length as usize;
            }
        }
        obs.clear();
        let same = obs.extend(step.obs);
        debug_assert!(same, "one dtype per batch");
    }
    Ok(played)
}

/// `flotilla eval RUN_DIR --render DIR`: play the episodes, write their frames, print each episode and the
/// summary `flotilla eval` prints.
pub fn render_command(
    config: &ExperimentConfig,
    agent: &mut dyn Policy,
    episodes: usize,
    seed: u64,
    dir: &Path,
) -> Result<()> {
    let scene = Scene::for_env(&config.env.id)?;
    let played = play(config, agent, episodes, seed)?;
    for (k, ep) in played.iter().enumerate() {
        let folder = dir.join(format!("episode-{k}"));
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
        for (t, state) in ep.states.iter().enumerate() {
            scene.save_png(state, &folder.join(format!("frame-{t:04}.png")))?;
        }
        println!(
            "episode {k}: return {:.2}, length {}, {} frames in {}",
            ep.episode_return,
            ep.length,
            ep.states.len(),
            folder.display()
        );
    }
    let returns: Vec<f64> = played.iter().map(|e| e.episode_return).collect();
    let mean = returns.iter().sum::<f64>() / returns.len() as f64;
    let std = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / returns.len() as f64).sqrt();
    println!(
        "{}: mean return {mean:.2} ± {std:.2} over {} episodes (deterministic policy, frames in {})",
        config.env.id,
        returns.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scene draws something other than the background, and different states draw differently.
    #[test]
    fn every_scene_draws_its_state() {
        let dir = std::env::temp_dir().join(format!("flotilla-render-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, s) = (0.3f32.cos(), 0.3f32.sin());
        let cases: [(&str, Vec<f32>, Vec<f32>); 5] = [
            ("CartPole-v1", vec![0.0, 0.0, 0.05, 0.0], vec![1.0, 0.0, -0.2, 0.0]),
            ("Acrobot-v1", vec![1.0, 0.0, 1.0, 0.0, 0.0, 0.0], vec![c, s, c, -s, 0.0, 0.0]),
            ("MountainCar-v0", vec![-0.5, 0.0], vec![0.3, 0.0]),
            ("MountainCarContinuous-v0", vec![-1.0, 0.0], vec![0.4, 0.0]),
            ("Pendulum-v1", vec![1.0, 0.0, 0.0], vec![c, s, 0.0]),
        ];
        for (id, a, b) in cases {
            let scene = Scene::for_env(id).unwrap();
            let mut frames = Vec::new();
            for (k, state) in [a, b].iter().enumerate() {
                let path = dir.join(format!("{id}-{k}.png"));
                scene.save_png(state, &path).unwrap();
                frames.push(std::fs::read(&path).unwrap());
            }
            assert_ne!(frames[0], frames[1], "{id}: two states, one frame");
        }
        let err = Scene::for_env("atari:Pong").unwrap_err().to_string();
        assert!(err.contains("atari:Pong") && err.contains("CartPole-v1"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
