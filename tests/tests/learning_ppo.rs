//! Learning test: PPO with the quick-start config reaches a mean deterministic evaluation return ≥ 475 over
//! 10 episodes on CartPole-v1 within 100,000 env steps, for at least 2 of seeds 1, 2, 3 — and the policy
//! it ends with (after the full budget, with the learning rate annealed to 0) is the one evaluated, so a
//! seed that touched 475 once and fell back does not count.
use flotilla_tests::cartpole_ppo_config;

#[test]
fn ppo_solves_cartpole_within_100k_steps_for_2_of_3_seeds() {
    let results: Vec<(u64, f64, Option<u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = [1u64, 2, 3]
            .into_iter()
            .map(|seed| {
                s.spawn(move || {
                    let seed_override = format!("run.seed={seed}");
                    let config = cartpole_ppo_config(&[
                        &seed_override,
                        "run.total_env_steps=100000",
                        "eval.interval_steps=5120",
                    ]);
                    let (_, report) = flotilla_learner::train::train(&config, &mut |_| Ok(())).expect("training runs");
                    assert!(report.env_steps <= 100_000 + 256, "budget respected: {}", report.env_steps);
                    let first = report.first_reaching(475.0).map(|e| e.env_steps);
                    (seed, report.final_eval().mean(), first)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("seed thread")).collect()
    });
    for (seed, final_return, first) in &results {
        eprintln!("seed {seed}: final eval return {final_return:.1}, first ≥ 475 at {first:?} env steps");
    }
    let solved = results.iter().filter(|(_, r, _)| *r >= 475.0).count();
    assert!(solved >= 2, "only {solved} of 3 seeds end with eval return ≥ 475: {results:?}");
}
