//! No import circles inside any crate: the files of each crate form layers, each using only those below it.
//!
//! A file's uses are its `crate::a::b` and `super::x` paths in library code (inline `#[cfg(test)]` modules,
//! comments and `tests/` / `bin/` folders left out), each resolved to the longest module path that names a
//! file of the crate. Files that reach each other through such paths, directly or around a loop, are a
//! circle; the test lists every circle it finds.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The crates of the workspace: folders with a Cargo.toml and a src/.
fn crates(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            out.push(dir);
        }
    }
    out.sort();
    out
}

/// Every library source file under `src`, by module path (`a/mod.rs` and `lib.rs`/`main.rs` name their folder).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "tests" && name != "bin" {
                    walk(&path, src, out);
                }
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let rel = path.parent().unwrap().strip_prefix(src).unwrap();
                let mut module: Module = rel.iter().map(|c| c.to_string_lossy().to_string()).collect();
                if !matches!(stem, "mod" | "lib" | "main") {
                    module.push(stem.to_string());
                }
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The library code of a file: up to its first `#[cfg(test)]`, without `//` comments.
fn library_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The `crate::…` and `super::…` paths in `code`, as their segments.
fn paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let at_word = i == 0 || !ident(bytes[i - 1]);
        let start = if at_word && bytes[i..].starts_with(b"crate::") {
            Some("crate")
        } else if at_word && bytes[i..].starts_with(b"super::") {
            Some("super")
        } else {
            None
        };
        let Some(first) = start else {
            i += 1;
            continue;
        };
        let mut segments = vec![first.to_string()];
        let mut j = i + first.len();
        while bytes[j..].starts_with(b"::") {
            let s = j + 2;
            let mut e = s;
            while e < bytes.len() && ident(bytes[e]) {
                e += 1;
            }
            if e == s {
                break;
            }
            segments.push(String::from_utf8_lossy(&bytes[s..e]).into_owned());
            j = e;
        }
        out.push(segments);
        i = j.max(i + 1);
    }
    out
}

/// Which files each file uses.
fn graph(mods: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph = BTreeMap::new();
    for (module, path) in mods {
        let folder_file = matches!(path.file_name().unwrap().to_str().unwrap(), "mod.rs" | "lib.rs" | "main.rs");
        let here: Module = if folder_file { module.clone() } else { module[..module.len() - 1].to_vec() };
        let mut uses = BTreeSet::new();
        for segments in paths(&library_code(path)) {
            let (mut base, mut rest) = (Vec::new(), &segments[..]);
            if rest[0] == "crate" {
                rest = &rest[1..];
            } else {
                base = here.clone();
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            let full: Module = base.into_iter().chain(rest.iter().cloned()).collect();
            for k in (1..=full.len()).rev() {
                let prefix = full[..k].to_vec();
                if mods.contains_key(&prefix) {
                    if &prefix != module {
                        uses.insert(prefix);
                    }
                    break;
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let crates = crates(root);
    assert!(crates.len() >= 10, "found the workspace's crates: {crates:?}");
    let mut found = Vec::new();
    for dir in crates {
        let mods = modules(&dir.join("src"));
        for circle in circles(&graph(&mods)) {
            let files: Vec<String> =
                circle.iter().map(|m| mods[m].strip_prefix(root).unwrap().display().to_string()).collect();
            found.push(format!("circle of {}: {}", files.len(), files.join(" ")));
        }
    }
    assert!(
        found.is_empty(),
        "import circles (a file must not use, directly or around a loop, one that uses it):\n{}",
        found.join("\n")
    );
}

/// The checker finds what it is for: a circle through `super::`, one through `crate::` with a nested
/// module, and none in layered code.
#[test]
fn the_checker_finds_circles_and_passes_layers() {
    let dir = std::env::temp_dir().join(format!("flotilla-layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("nn")).unwrap();
    let write = |p: &str, text: &str| std::fs::write(src.join(p), text).unwrap();
    write("lib.rs", "pub mod nn; pub mod ppo; pub mod registry;");
    write("nn/mod.rs", "pub mod adam; pub use adam::Adam;");
    write("nn/adam.rs", "// crate::ppo::Ppo in a comment does not count\npub struct Adam;");
    write(
        "ppo.rs",
        "use crate::nn::adam::Adam;\npub struct Ppo(Adam);\n#[cfg(test)]\nmod tests { use crate::registry::X; }",
    );
    write("registry.rs", "use crate::ppo::Ppo; pub struct X;");
    assert!(circles(&graph(&modules(&src))).is_empty(), "layered code");
    write("nn/adam.rs", "pub struct Adam; fn f(_: super::super::ppo::Ppo) {}");
    let found = circles(&graph(&modules(&src)));
    assert_eq!(found, vec![vec![vec!["nn".to_string(), "adam".to_string()], vec!["ppo".to_string()]]]);
    write("nn/adam.rs", "pub struct Adam;");
    write("nn/mod.rs", "pub mod adam; pub use adam::Adam; fn g(_: crate::registry::X) {}");
    write("ppo.rs", "pub struct Ppo(crate::nn::Adam);");
    let found = circles(&graph(&modules(&src)));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3, "nn → registry → ppo → nn: {found:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
