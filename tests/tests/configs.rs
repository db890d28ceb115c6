//! Every config in `examples/configs/` parses, validates (env ids and kwargs built, algorithm checked) and, for
//! runs with actors, plans; Atari ones resolve their env settings into the config.
use flotilla_learner::config::ExperimentConfig;

#[test]
fn every_example_config_loads() {
    flotilla_envs_python::register();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        // A3C runs only with actor processes: its config is checked as `--actors 2` would run it.
        let config = ExperimentConfig::load(&path, &[])
            .or_else(|e| match e.to_string().contains("needs actor processes") {
                true => ExperimentConfig::load(&path, &["actors.count=2".to_string()]),
                false => Err(e),
            })
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if config.env.id.starts_with("atari:") {
            assert!(config.env.kwargs.contains_key("repeat_action_probability"), "{}", path.display());
            config.plan(2).unwrap_or_else(|e| panic!("{} with 2 actors: {e}", path.display()));
        }
        seen += 1;
    }
    assert!(seen >= 12, "only {seen} configs found in {dir}");
}
