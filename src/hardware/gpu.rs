//! GPU specifications: the peak numbers the roofline baseline and the physical features need.
//!
//! The catalogue holds datasheet values (dense, i.e. without 2:4 sparsity) for the GPUs whose
//! public measurements stepcast imports; a dataset collected on a GPU not listed here carries the
//! properties the harness read from the device instead.

use serde::{Deserialize, Serialize};

use crate::ops::Dtype;

/// Peak dense throughput per data type, in TFLOP/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakTflops {
    /// Non-tensor-core FP32.
    pub fp32: f64,
    pub tf32: f64,
    pub fp16: f64,
    pub bf16: f64,
    /// `None` where the GPU has no FP8 tensor cores (A100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<f64>,
}

/// One GPU model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Marketing name as the driver reports it, e.g. "NVIDIA A100-SXM4-80GB".
    pub name: String,
    pub memory_gib: f64,
    /// Streaming multiprocessors (compute units on AMD): the wave size of a kernel launch.
    pub sm_count: u32,
    pub hbm_bandwidth_gb_per_s: f64,
    pub l2_cache_mib: f64,
    pub peak_dense_tflops: PeakTflops,
}

impl GpuSpec {
    /// Peak FLOP/s for a data type; FP8 on a GPU without FP8 falls back to its FP16 rate, which
    /// is what a framework running FP8 recipes there would get.
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        let p = &self.peak_dense_tflops;
        let tflops = match dtype {
            Dtype::Fp32 => p.fp32,
            Dtype::Tf32 => p.tf32,
            Dtype::Fp16 => p.fp16,
            Dtype::Bf16 => p.bf16,
            Dtype::Fp8 => p.fp8.unwrap_or(p.fp16),
        };
        tflops * 1e12
    }

    pub fn hbm_bytes_per_s(&self) -> f64 {
        self.hbm_bandwidth_gb_per_s * 1e9
    }

    /// Whether the GPU has tensor cores for `dtype` (fp8 needs them: Hopper and later).
    pub fn supports(&self, dtype: Dtype) -> bool {
        dtype != Dtype::Fp8 || self.peak_dense_tflops.fp8.is_some()
    }

    /// Checks every number against its physical range; `what` names the file for the message.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        use crate::limits::check_range;
        let p = &self.peak_dense_tflops;
        check_range(
            what,
            "gpu.memory_gib",
            self.memory_gib,
            0.5..=100_000.0,
            "GiB",
        )?;
        check_range(
            what,
            "gpu.hbm_bandwidth_gb_per_s",
            self.hbm_bandwidth_gb_per_s,
            10.0..=1e6,
            "GB/s",
        )?;
        check_range(
            what,
            "gpu.l2_cache_mib",
            self.l2_cache_mib,
            0.0..=100_000.0,
            "MiB",
        )?;
        check_range(
            what,
            "gpu.sm_count",
            self.sm_count as f64,
            1.0..=100_000.0,
            "SMs",
        )?;
        for (field, value) in [
            ("fp32", Some(p.fp32)),
            ("tf32", Some(p.tf32)),
            ("fp16", Some(p.fp16)),
            ("bf16", Some(p.bf16)),
            ("fp8", p.fp8),
        ] {
            if let Some(v) = value {
                let field = format!("gpu.peak_dense_tflops.{field}");
                check_range(what, &field, v, 0.01..=1e6, "TFLOP/s")?;
            }
        }
        Ok(())
    }

    /// Looks a GPU up in the catalogue by any spelling of its name ("NVIDIAA100-SXM4-80GB",
    /// "NVIDIA A100-SXM4-80GB" and "a100-sxm4-80gb" are the same GPU).
    pub fn builtin(name: &str) -> Option<GpuSpec> {
        let key = normalize(name);
        catalogue()
            .into_iter()
            .find(|(aliases, _)| aliases.iter().any(|a| normalize(a) == key))
            .map(|(_, spec)| spec)
    }
}

fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect::<String>()
        .trim_start_matches("nvidia")
        .trim_start_matches("amd")
        .to_string()
}

fn spec(
    name: &str,
    memory_gib: f64,
    sm_count: u32,
    hbm: f64,
    l2: f64,
    peak: [f64; 4],
    fp8: Option<f64>,
) -> GpuSpec {
    GpuSpec {
        name: name.to_string(),
        memory_gib,
        sm_count,
        hbm_bandwidth_gb_per_s: hbm,
        l2_cache_mib: l2,
        peak_dense_tflops: PeakTflops {
            fp32: peak[0],
            tf32: peak[1],
            fp16: peak[2],
            bf16: peak[3],
            fp8,
        },
    }
}

/// (aliases, spec). Sources: NVIDIA A100 datasheet (2021) and A100 whitepaper (108 SMs, 40 MB
/// L2); NVIDIA H100 datasheet (SXM5: 989 TFLOP/s dense BF16, 1,979 FP8, 3.35 TB/s, 132 SMs,
/// 50 MB L2); NVIDIA H200 datasheet (141 GB, 4.8 TB/s, H100 compute); NVIDIA GH200 datasheet
/// (96 GB HBM3 at 4 TB/s, H100 compute; TACC Vista's nodes report "NVIDIA GH200 120GB");
/// AMD Instinct MI300X datasheet (304 CUs, 1,307 TFLOP/s dense FP16, 5.3 TB/s, 192 GB).
fn catalogue() -> Vec<(Vec<&'static str>, GpuSpec)> {
    let hopper = [67.0, 494.7, 989.4, 989.4];
    vec![
        (
            vec![
                "NVIDIA A100-SXM4-80GB",
                "a100-sxm4-80gb",
                "a100_sxm",
                "a100",
            ],
            spec(
                "NVIDIA A100-SXM4-80GB",
                80.0,
                108,
                2039.0,
                40.0,
                [19.5, 156.0, 312.0, 312.0],
                None,
            ),
        ),
        (
            vec!["NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"],
            spec(
                "NVIDIA A100-SXM4-40GB",
                40.0,
                108,
                1555.0,
                40.0,
                [19.5, 156.0, 312.0, 312.0],
                None,
            ),
        ),
        (
            vec!["NVIDIA H100 80GB HBM3", "h100-sxm", "h100_sxm", "h100"],
            spec(
                "NVIDIA H100 80GB HBM3",
                80.0,
                132,
                3350.0,
                50.0,
                hopper,
                Some(1978.9),
            ),
        ),
        (
            vec!["NVIDIA H200", "h200-sxm", "h200_sxm", "h200"],
            spec(
                "NVIDIA H200",
                141.0 * 1e9 / (1u64 << 30) as f64,
                132,
                4800.0,
                50.0,
                hopper,
                Some(1978.9),
            ),
        ),
        (
            vec!["NVIDIA GH200 120GB", "NVIDIAGH200120GB", "gh200"],
            spec(
                "NVIDIA GH200 120GB",
                96.0,
                132,
                4000.0,
                50.0,
                hopper,
                Some(1978.9),
            ),
        ),
        (
            vec!["AMD Instinct MI300X", "mi300x"],
            spec(
                "AMD Instinct MI300X",
                192.0,
                304,
                5300.0,
                256.0,
                [163.4, 653.7, 1307.4, 1307.4],
                Some(2614.9),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_gpus_by_any_spelling() {
        for name in ["NVIDIAA100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "a100_sxm"] {
            assert_eq!(GpuSpec::builtin(name).unwrap().sm_count, 108, "{name}");
        }
        assert_eq!(GpuSpec::builtin("NVIDIAGH200120GB").unwrap().sm_count, 132);
        assert_eq!(
            GpuSpec::builtin("NVIDIA H100 80GB HBM3").unwrap().sm_count,
            132
        );
        assert!(GpuSpec::builtin("Voodoo2").is_none());
    }

    #[test]
    fn catalogue_entries_are_valid() {
        for (_, spec) in catalogue() {
            spec.validate("catalogue").unwrap();
        }
    }

    #[test]
    fn each_dtype_reads_its_own_peak() {
        let h100 = GpuSpec::builtin("h100").unwrap();
        let peaks = [
            Dtype::Fp32,
            Dtype::Tf32,
            Dtype::Fp16,
            Dtype::Bf16,
            Dtype::Fp8,
        ]
        .map(|d| h100.peak_flops(d) / 1e12);
        assert_eq!(peaks, [67.0, 494.7, 989.4, 989.4, 1978.9]);
        let mi300x = GpuSpec::builtin("AMD Instinct MI300X").unwrap();
        assert_eq!(mi300x.peak_flops(Dtype::Tf32), 653.7e12);
        assert_eq!(h100.hbm_bytes_per_s(), 3.35e12);
        let a100 = GpuSpec::builtin("a100-sxm4-40gb").unwrap();
        assert_eq!(a100.hbm_bytes_per_s(), 1.555e12);
        assert!(a100.supports(Dtype::Bf16) && !a100.supports(Dtype::Fp8));
        assert!(h100.supports(Dtype::Fp8));
    }

    /// Each number is checked against its own range and the message names its field.
    #[test]
    fn validate_names_the_field_out_of_range() {
        let good = GpuSpec::builtin("h100").unwrap();
        let spoilt = |spoil: fn(&mut GpuSpec)| {
            let mut g = good.clone();
            spoil(&mut g);
            g.validate("c.yaml").unwrap_err()
        };
        for (e, field) in [
            (spoilt(|g| g.memory_gib = 0.25), "gpu.memory_gib"),
            (
                spoilt(|g| g.hbm_bandwidth_gb_per_s = 5.0),
                "gpu.hbm_bandwidth_gb_per_s",
            ),
            (spoilt(|g| g.l2_cache_mib = -1.0), "gpu.l2_cache_mib"),
            (spoilt(|g| g.sm_count = 0), "gpu.sm_count"),
            (
                spoilt(|g| g.peak_dense_tflops.tf32 = 0.0),
                "gpu.peak_dense_tflops.tf32",
            ),
            (
                spoilt(|g| g.peak_dense_tflops.bf16 = 2e6),
                "gpu.peak_dense_tflops.bf16",
            ),
            (
                spoilt(|g| g.peak_dense_tflops.fp8 = Some(f64::NAN)),
                "gpu.peak_dense_tflops.fp8",
            ),
        ] {
            assert!(e.contains("c.yaml") && e.contains(field), "{field}: {e}");
        }
        // no fp8 units: nothing to check
        let mut a100 = good;
        a100.peak_dense_tflops.fp8 = None;
        a100.validate("c.yaml").unwrap();
    }

    #[test]
    fn fp8_falls_back_to_fp16_without_fp8_units() {
        let a100 = GpuSpec::builtin("a100").unwrap();
        assert_eq!(a100.peak_flops(Dtype::Fp8), a100.peak_flops(Dtype::Fp16));
        let h100 = GpuSpec::builtin("h100").unwrap();
        assert!(h100.peak_flops(Dtype::Fp8) > 1.9e15);
    }
}
