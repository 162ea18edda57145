//! `--model` as users give it: a preset name, a YAML architecture file or a Hugging Face
//! `config.json`, read into a checked `Arch`.

use std::path::Path;

use super::arch::{Arch, ArchSpec};
use super::{hf, presets};
use crate::error::{Error, Result};

impl ArchSpec {
    /// Parses the text of a YAML architecture file that came from `path` (not yet checked:
    /// `validate` does that).
    pub fn parse_yaml(path: &Path, text: &str) -> Result<ArchSpec> {
        crate::fsutil::parse_yaml(path, text).map_err(|e: Error| {
            e.hint(
                "an architecture file sets name, layers, hidden, heads, vocab, norm (layernorm or \
                 rmsnorm) and activation (gelu or swiglu); see the README",
            )
        })
    }
}

impl Arch {
    /// Loads `--model`: a preset name, a YAML architecture file, or a Hugging Face config.json.
    pub fn resolve(name_or_path: &str) -> Result<Arch> {
        if let Some(spec) = presets::preset(name_or_path) {
            return spec.validate(name_or_path);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let source = path.display().to_string();
            let spec = if path.extension().is_some_and(|e| e == "json") {
                hf::from_config_json(path)?
            } else {
                ArchSpec::parse_yaml(path, &crate::fsutil::read_to_string(path)?)?
            };
            return spec.validate(&source);
        }
        Err(Error::Invalid(format!(
            "unknown model '{name_or_path}': not a preset ({}) nor a file (YAML architecture or \
             Hugging Face config.json)",
            presets::names().join(", ")
        )))
    }
}
