//! Runs fuzz inputs through a target's harness on stable Rust, without libFuzzer:
//! `cargo run --manifest-path fuzz/Cargo.toml --example replay -- <target> <file or dir>...`
//! (a crash reproduces as a panic; `all` replays every committed corpus).

use std::path::{Path, PathBuf};

fn files(path: &Path) -> Vec<PathBuf> {
    if path.is_dir() {
        let mut out: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        out.sort();
        out
    } else {
        vec![path.to_path_buf()]
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first() else {
        eprintln!("usage: replay <target>|all <file or dir>...");
        std::process::exit(2);
    };
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let runs: Vec<(&str, fn(&[u8]), Vec<PathBuf>)> = countersign_fuzz::TARGETS
        .iter()
        .filter(|(name, _)| target == "all" || name == target)
        .map(|(name, run)| {
            let inputs = if args.len() > 1 {
                args[1..].iter().flat_map(|a| files(Path::new(a))).collect()
            } else {
                files(&corpus.join(name))
            };
            (*name, *run, inputs)
        })
        .collect();
    if runs.is_empty() {
        eprintln!("no target named {target}");
        std::process::exit(2);
    }
    for (name, run, inputs) in runs {
        for input in &inputs {
            eprintln!("{name}: {}", input.display());
            run(&std::fs::read(input).unwrap());
        }
        println!("{name}: {} inputs ran without a failure", inputs.len());
    }
}
