//! The same config and seed give bit-identical training (CPU, one torch thread); another seed does not.
use flotilla_tests::cartpole_ppo_config;

fn trained_weights(seed: u64) -> (tch::Tensor, Vec<f64>) {
    let seed = format!("run.seed={seed}");
    let config =
        cartpole_ppo_config(&[&seed, "run.total_env_steps=2048", "run.device=cpu", "eval.interval_steps=1024"]);
    let (agent, report) = flotilla_learner::train::train(&config, &mut |_| Ok(())).expect("training runs");
    (agent.policy_params().flat().detach().copy(), report.evals.iter().map(|e| e.result.mean()).collect())
}

#[test]
fn same_seed_same_weights_and_evaluations() {
    let (a, evals_a) = trained_weights(7);
    let (b, evals_b) = trained_weights(7);
    assert!(a.equal(&b), "weights differ between two runs with seed 7");
    assert_eq!(evals_a, evals_b);
    let (c, _) = trained_weights(8);
    assert!(!a.equal(&c), "seed 8 trained the same weights as seed 7");
}
