//! The software a measurement or a prediction's kernels ran under: the stamp a dataset, a
//! models directory and a cluster file carry, so drift after a driver update can be detected.

use serde::{Deserialize, Serialize};

/// Versions of everything that changes kernel timings. Unknown fields stay empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftwareStamp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cublas: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// Training or inference framework whose kernels were timed, e.g. "GPT-NeoX + DeepSpeed".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// Attention kernels that ran, e.g. "flash-attn 2", "cuDNN SDPA".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<u32>,
}

impl SoftwareStamp {
    /// The fields that differ between two stamps, as (field, ours, theirs); fields unknown on
    /// either side are not compared. Clocks and the GPU's UUID are not software and are skipped.
    pub fn differences(&self, other: &SoftwareStamp) -> Vec<(&'static str, String, String)> {
        let pairs = [
            ("driver", &self.driver, &other.driver),
            ("cuda", &self.cuda, &other.cuda),
            ("cublas", &self.cublas, &other.cublas),
            ("cudnn", &self.cudnn, &other.cudnn),
            ("nccl", &self.nccl, &other.nccl),
            ("torch", &self.torch, &other.torch),
            (
                "attention_backend",
                &self.attention_backend,
                &other.attention_backend,
            ),
        ];
        pairs
            .into_iter()
            .filter_map(|(name, a, b)| match (a, b) {
                (Some(a), Some(b)) if a != b => Some((name, a.clone(), b.clone())),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(driver: &str, nccl: Option<&str>) -> SoftwareStamp {
        SoftwareStamp {
            gpu_uuid: Some(format!("GPU-{driver}")),
            driver: Some(driver.into()),
            cuda: Some("13.0".into()),
            nccl: nccl.map(str::to_string),
            sm_clock_mhz: Some(1980),
            ..SoftwareStamp::default()
        }
    }

    #[test]
    fn a_driver_update_is_the_difference_and_what_one_side_does_not_know_is_not() {
        let before = stamp("580.65", Some("2.27.3"));
        let after = SoftwareStamp {
            sm_clock_mhz: Some(1755),
            ..stamp("590.10", None)
        };
        // the GPU's UUID and clocks differ too, but they are not software
        assert_eq!(
            before.differences(&after),
            vec![("driver", "580.65".to_string(), "590.10".to_string())]
        );
        assert!(before.differences(&before.clone()).is_empty());
        let nccl = stamp("580.65", Some("2.28.1"));
        assert_eq!(
            before.differences(&nccl),
            vec![("nccl", "2.27.3".to_string(), "2.28.1".to_string())]
        );
    }
}
