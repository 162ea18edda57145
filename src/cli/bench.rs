//! `stepcast bench …`, `stepcast models check …` and `stepcast retrain …` run `stepcast-bench`
//! (the GPU harness, a binary of the profiler crate), found beside this executable or on PATH:
//! the core never links GPU code, the harness depends on the core.

use std::path::PathBuf;
use std::process::Command;

const HARNESS: &str = "stepcast-bench";

fn harness() -> Option<PathBuf> {
    let beside = std::env::current_exe().ok()?.with_file_name(HARNESS);
    if beside.is_file() {
        return Some(beside);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(HARNESS))
            .find(|p| p.is_file())
    })
}

/// Runs the harness with `args` in place of this process (on Unix: the same process, so a
/// signal sent to `stepcast` reaches the collector itself and its exit status is ours), or as
/// a child whose exit code, or signal, becomes ours.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(path) = harness() else {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{HARNESS} is not installed beside stepcast or on PATH: install it with \
             `cargo install --path profiler --features cuda` from the checkout (no CUDA toolkit \
             needed to build; on the GPU node the libraries are loaded at run time; without \
             `--features cuda` only `--device mock` works)"
        )));
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = Command::new(&path).args(args).exec();
        anyhow::bail!("cannot run {}: {err}", path.display());
    }
    #[cfg(not(unix))]
    {
        let status = Command::new(&path).args(args).status()?;
        std::process::exit(status.code().unwrap_or(1));
    }
}
