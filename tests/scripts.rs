//! The driver-update check script (scripts/check-after-driver-update.sh), run by bash against a
//! fake `nvidia-smi` and a fake `stepcast` that log their calls: what the script does for an
//! unchanged stamp, a clean check, a drift and a drift with automatic retraining.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn executable(path: &Path, body: &str) {
    fs::write(path, format!("#!/usr/bin/env bash\n{body}")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let node = Node {
            dir: tempfile::tempdir().unwrap(),
        };
        node.set_driver("560.35.03");
        node.set_check_exit(0);
        // the fake stepcast logs each call, exits with the code in check-exit for `models check`
        // and writes the dataset a retrain names unless no-retrain-drift exists
        executable(
            &node.path("stepcast"),
            &format!(
                "echo \"$*\" >> {log}\nif [[ $1 == models ]]; then echo '{{}}'; exit $(cat {code}); fi\n\
                 [[ -f no-retrain-drift ]] && exit 0\n\
                 while [[ $# -gt 0 ]]; do\n\
                 [[ $1 == --out ]] && mkdir -p \"$2\" && touch \"$2/meta.yaml\"\nshift\ndone\n",
                log = node.path("calls").display(),
                code = node.path("check-exit").display()
            ),
        );
        node
    }
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
    fn set_driver(&self, version: &str) {
        executable(
            &self.path("nvidia-smi"),
            &format!(
                "case \"$*\" in\n\
                 '') echo '| NVIDIA-SMI {version}  Driver Version: {version}  CUDA Version: 13.0 |' ;;\n\
                 *=name,driver_version*) printf 'NVIDIA H100 80GB HBM3, {version}\\n%.0s' 1 2 ;;\n\
                 *=name\\ *) printf 'NVIDIA H100 80GB HBM3\\n%.0s' 1 2 ;;\n\
                 *) exit 9 ;;\n\
                 esac\n"
            ),
        );
    }
    fn set_check_exit(&self, code: i32) {
        fs::write(self.path("check-exit"), code.to_string()).unwrap();
    }
    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.path("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
    fn run(&self, auto_retrain: bool) -> Output {
        self.run_with(auto_retrain, None)
    }
    fn run_with(&self, auto_retrain: bool, previous: Option<&str>) -> Output {
        let mut command = Command::new("bash");
        if let Some(p) = previous {
            command.env("STEPCAST_PREVIOUS", p);
        }
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/check-after-driver-update.sh"
            ))
            .current_dir(self.dir.path())
            .env("STEPCAST_CLUSTER", "cluster.yaml")
            .env("STEPCAST_STATE_DIR", self.path("state"))
            .env("STEPCAST", self.path("stepcast"))
            .env("NVIDIA_SMI", self.path("nvidia-smi"))
            .env("STEPCAST_EXTRA_ARGS", "--gpus 0,1")
            .env(
                "STEPCAST_AUTO_RETRAIN",
                if auto_retrain { "1" } else { "0" },
            )
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn checks_once_per_software_stamp() {
    let node = Node::new();
    let o = node.run(false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let calls = node.calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].starts_with("models check --cluster cluster.yaml --threshold 10 --json"));
    assert!(calls[0].ends_with("--gpus 0,1"), "{}", calls[0]);
    // unchanged driver: nothing runs
    let o = node.run(false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(node.calls().len(), 1);
}

#[test]
fn a_drift_is_reported_until_it_is_dealt_with() {
    let node = Node::new();
    assert!(node.run(false).status.success());
    node.set_driver("575.51.03");
    node.set_check_exit(3);
    let o = node.run(false);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("stepcast retrain --cluster cluster.yaml"));
    // the stamp was not recorded: the next run checks again, and retrains when allowed to
    let o = node.run(true);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let calls = node.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    let retrain = &calls[3];
    assert!(
        retrain.starts_with(
            "retrain --cluster cluster.yaml --threshold 10 --out datasets/nvidia-h100-80gb-hbm3/"
        ),
        "{retrain}"
    );
    assert!(node.run(true).status.success());
    assert_eq!(node.calls().len(), 4);
    // the next update's check probes the retrained models' own dataset, STEPCAST_PREVIOUS aside
    let day = retrain
        .split("--out ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let dataset = node.path(day);
    assert!(dataset.join("meta.yaml").is_file(), "{day}");
    node.set_driver("580.65.06");
    node.set_check_exit(0);
    let o = node.run_with(false, Some("datasets/first"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let check = node.calls().pop().unwrap();
    let previous = format!("--previous {} --gpus 0,1", dataset.display());
    assert!(check.ends_with(&previous), "{check}");
}

/// The dataset the models came from (STEPCAST_PREVIOUS) goes to the check and the retrain; a
/// retrain whose own probe finds nothing past the threshold writes nothing and exits 0.
#[test]
fn the_models_dataset_goes_to_the_check_and_the_retrain() {
    let node = Node::new();
    node.set_check_exit(3);
    fs::write(node.path("no-retrain-drift"), "").unwrap();
    let o = node.run_with(true, Some("datasets/first"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("found no drift"), "{}", text(&o));
    let calls = node.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[0].ends_with("--previous datasets/first --gpus 0,1"),
        "{}",
        calls[0]
    );
    assert!(
        calls[1].contains("--previous datasets/first"),
        "{}",
        calls[1]
    );
    assert!(!node.path("state/models-dataset").exists());
    // the stamp is recorded: nothing runs again until the software changes
    assert!(node.run_with(true, Some("datasets/first")).status.success());
    assert_eq!(node.calls().len(), 2);
}

#[test]
fn a_failed_check_is_an_error_and_is_tried_again() {
    let node = Node::new();
    node.set_check_exit(2);
    let o = node.run(false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    node.set_check_exit(0);
    assert!(node.run(false).status.success());
    assert_eq!(node.calls().len(), 2);
}
