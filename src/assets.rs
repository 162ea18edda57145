//! What ships inside the binary, so that an installed `stepcast` works anywhere: every cluster
//! file of `hardware-profiles/` (`--cluster dgx-h100`) and the models they name
//! (`models/<set>/models.bin`), exactly the files of the checkout it was built from.

/// Built-in cluster files: (name, YAML).
pub const CLUSTERS: &[(&str, &str)] = &[
    (
        "dgx-a100",
        include_str!("../hardware-profiles/dgx-a100.yaml"),
    ),
    (
        "dgx-a100-40gb",
        include_str!("../hardware-profiles/dgx-a100-40gb.yaml"),
    ),
    (
        "dgx-h100",
        include_str!("../hardware-profiles/dgx-h100.yaml"),
    ),
    (
        "dgx-h200",
        include_str!("../hardware-profiles/dgx-h200.yaml"),
    ),
    (
        "grand-teton-h100",
        include_str!("../hardware-profiles/grand-teton-h100.yaml"),
    ),
    ("mi300x", include_str!("../hardware-profiles/mi300x.yaml")),
    (
        "perlmutter",
        include_str!("../hardware-profiles/perlmutter.yaml"),
    ),
    ("vista", include_str!("../hardware-profiles/vista.yaml")),
];

/// Built-in models: (directory name under `models/`, `models.bin`).
pub const MODELS: &[(&str, &[u8])] = &[
    (
        "a100-aiconfigurator",
        include_bytes!("../models/a100-aiconfigurator/models.bin"),
    ),
    (
        "h100-aiconfigurator",
        include_bytes!("../models/h100-aiconfigurator/models.bin"),
    ),
    ("h100-sxm", include_bytes!("../models/h100-sxm/models.bin")),
    (
        "h200-aiconfigurator",
        include_bytes!("../models/h200-aiconfigurator/models.bin"),
    ),
    ("h200-sxm", include_bytes!("../models/h200-sxm/models.bin")),
    (
        "perlmutter",
        include_bytes!("../models/perlmutter/models.bin"),
    ),
    ("vista", include_bytes!("../models/vista/models.bin")),
];

/// Built-in calibrations: (models directory name, `calibration.yaml`), where one was fitted.
pub const CALIBRATIONS: &[(&str, &str)] = &[
    (
        "h100-sxm",
        include_str!("../models/h100-sxm/calibration.yaml"),
    ),
    (
        "perlmutter",
        include_str!("../models/perlmutter/calibration.yaml"),
    ),
];

/// The `calibration.yaml` of the built-in models directory `name`, if it has one.
pub fn calibration(name: &str) -> Option<&'static str> {
    CALIBRATIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, y)| *y)
}

/// The YAML of the built-in cluster `name`.
pub fn cluster(name: &str) -> Option<&'static str> {
    CLUSTERS.iter().find(|(n, _)| *n == name).map(|(_, y)| *y)
}

/// The `models.bin` of the built-in models directory `name`.
pub fn models(name: &str) -> Option<&'static [u8]> {
    MODELS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// The names of the built-in clusters.
pub fn cluster_names() -> Vec<&'static str> {
    CLUSTERS.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cluster_file_is_built_in() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hardware-profiles");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                e.unwrap()
                    .path()
                    .file_stem()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        assert_eq!(names, cluster_names());
        for name in names {
            let on_disk =
                std::fs::read_to_string(root().join(format!("hardware-profiles/{name}.yaml")));
            assert_eq!(cluster(&name), Some(on_disk.unwrap().as_str()), "{name}");
        }
        assert_eq!(cluster("dgx-h100.yaml"), None);
    }

    fn root() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// Every models directory that holds a `models.bin` ships it, byte for byte, and its
    /// `calibration.yaml` exactly where the directory has one.
    #[test]
    fn every_models_set_and_calibration_is_built_in() {
        let mut sets: Vec<String> = std::fs::read_dir(root().join("models"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("models.bin").is_file())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        sets.sort();
        let shipped: Vec<&str> = MODELS.iter().map(|(n, _)| *n).collect();
        assert_eq!(sets, shipped);
        for set in &sets {
            let dir = root().join("models").join(set);
            let bin = std::fs::read(dir.join("models.bin")).unwrap();
            assert_eq!(models(set), Some(bin.as_slice()), "{set}");
            let yaml = std::fs::read_to_string(dir.join("calibration.yaml")).ok();
            assert_eq!(calibration(set), yaml.as_deref(), "{set}");
        }
        assert_eq!(models("nowhere"), None);
    }
}
