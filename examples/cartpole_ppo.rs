//! PPO on CartPole-v1 written against the library directly: the whole training loop on one screen.
//! `cargo run --release -p flotilla-examples --bin cartpole_ppo`
use flotilla_algorithms::ppo::{ActOutput, Ppo, PpoConfig};
use flotilla_algorithms::rollout::Rollout;
use flotilla_envs::{Kwargs, VecActions, VecEnv};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (n_envs, total_steps) = (8, 100_000);
    let config = PpoConfig::default(); // RL Zoo's CartPole-v1 hyperparameters
    let mut envs = VecEnv::make("CartPole-v1", &Kwargs::new(), n_envs)?;
    let mut agent = Ppo::new(envs.observation_space(), envs.action_space(), config.clone(), tch::Device::Cpu, 1)?;
    let mut rollout = Rollout::new(n_envs, config.n_steps, agent.obs_dim(), agent.act_dim());
    let (mut obs, mut out, mut steps) = (envs.reset(Some(1))?.to_vec(), ActOutput::default(), 0);
    while steps < total_steps {
        rollout.clear();
        for _ in 0..config.n_steps {
            agent.act(&obs, false, &mut out)?;
            rollout.push_policy(&obs, &out.actions, &out.log_probs, &out.values)?;
            let actions: Vec<i64> = out.actions.iter().map(|&a| a as i64).collect();
            let step = envs.step(&VecActions::Discrete(&actions))?;
            rollout.push_outcome(step.rewards, step.terminated, step.truncated)?;
            for i in (0..n_envs).filter(|&i| step.truncated[i]) {
                let final_value = agent.values(step.final_obs(i).expect("kept for finished envs"))?;
                rollout.set_final_value(i, final_value[0]); // bootstrap the time-limit cut
            }
            obs.copy_from_slice(step.obs);
            steps += n_envs;
        }
        rollout.finish(&agent.values(&obs)?, config.gamma as f32, config.gae_lambda as f32)?;
        let metrics = agent.update(&rollout, 1.0 - steps as f64 / total_steps as f64)?;
        if steps % 10_240 == 0 {
            println!("{steps:>7} steps, value loss {:.4}", metrics.get("losses/value_loss").unwrap_or(f64::NAN));
        }
    }
    let (mut env, mut episode_return) = (flotilla_envs::make("CartPole-v1", &Kwargs::new())?, 0.0);
    let (mut obs, _) = env.reset(Some(1_000))?;
    loop {
        agent.act(obs.as_f32().expect("CartPole observes f32"), true, &mut out)?; // greedy action
        let step = env.step(flotilla_core::Action::Discrete(out.actions[0] as i64))?;
        episode_return += step.reward;
        if step.terminated || step.truncated {
            break;
        }
        obs = step.obs;
    }
    println!("greedy episode return: {episode_return}");
    Ok(())
}
