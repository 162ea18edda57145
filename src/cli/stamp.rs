//! The `provenance` every JSON output carries (see `stepcast::provenance`): the inputs of each
//! kind of command, and printing or writing a stamped document.

use std::path::Path;

use serde::Serialize;
use stepcast::hardware::Cluster;
use stepcast::provenance::{digest, Input, Provenance};
use stepcast::regress::ModelSet;

/// A file given on the command line, with a digest of what it held when it was read.
pub fn file(role: &'static str, path: &Path) -> Input {
    let held = std::fs::read(path).ok().map(|b| digest(&b));
    Input::new(role, path.display().to_string(), held)
}

/// A cluster, from its file or built in.
pub fn cluster(c: &Cluster) -> Input {
    Input::new("cluster", c.path.display().to_string(), c.digest.clone())
}

/// The training framework whose calibration the steps were composed under (`--framework`),
/// so that a later command (`export --from-search`) composes them the same way.
pub fn framework(name: &str) -> Input {
    Input::new("framework", name, None)
}

/// A model architecture: a file, or a preset by name (which the commit identifies).
pub fn architecture(name_or_path: &str) -> Input {
    let path = Path::new(name_or_path);
    if path.is_file() {
        file("architecture", path)
    } else {
        Input::new("architecture", name_or_path, None)
    }
}

/// A set of trained models, by its fingerprint.
pub fn models(m: &ModelSet) -> Input {
    Input::new(
        "models",
        m.dir.display().to_string(),
        Some(m.fingerprint().to_string()),
    )
}

/// `value` as a JSON document stamped with this run's provenance.
pub fn document(value: &impl Serialize, inputs: Vec<Input>) -> anyhow::Result<String> {
    let stamped = Provenance::of_this_run(inputs).stamp(serde_json::to_value(value)?);
    Ok(serde_json::to_string_pretty(&stamped)?)
}

/// Prints `value` as a stamped JSON document.
pub fn print(value: &impl Serialize, inputs: Vec<Input>) -> anyhow::Result<()> {
    println!("{}", document(value, inputs)?);
    Ok(())
}
