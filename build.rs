//! Records the git commit this stepcast is built from (`STEPCAST_COMMIT`), so that
//! `--version` and every JSON output say exactly which code produced them: the commit's first
//! 12 hex digits, `-modified` when tracked files differ from it, `unknown` outside a checkout.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let modified = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if modified {
                format!("{c}-modified")
            } else {
                c
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=STEPCAST_COMMIT={commit}");
    // rerun on a new commit, a change of what is staged, and any change of the sources
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = PathBuf::from(dir);
        for f in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={}", dir.join(f).display());
        }
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(head).display());
        }
    }
    for path in [
        "src",
        "build.rs",
        "Cargo.toml",
        "Cargo.lock",
        "models",
        "hardware-profiles",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
