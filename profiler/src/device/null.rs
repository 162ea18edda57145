//! The device of a torch-only collection (`--device torch`): every kernel, GEMMs included, goes
//! to the PyTorch backend; collectives, which need the CUDA build's NCCL, are recorded as
//! skipped. The GPU is described by what PyTorch reports.

use std::process::Command;

use stepcast::dataset::SoftwareStamp;
use stepcast::hardware::{GpuSpec, PeakTflops};
use stepcast::ops::OpQuery;

use super::{Device, DeviceError, DeviceInfo, Runnable, Telemetry};

pub struct NullDevice {
    info: DeviceInfo,
}

impl NullDevice {
    /// Asks the node's PyTorch which GPU it sees.
    pub fn probe(python: &str, device: usize) -> anyhow::Result<NullDevice> {
        let code = format!(
            "import torch, json; p = torch.cuda.get_device_properties({device}); \
             print(json.dumps([p.name, p.total_memory, p.multi_processor_count, getattr(p, 'L2_cache_size', 0), torch.cuda.device_count()]))"
        );
        let out = Command::new(python).args(["-c", &code]).output()?;
        if !out.status.success() {
            anyhow::bail!(
                "{python} could not describe the GPU through PyTorch: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        let (name, memory, sms, l2, count): (String, u64, u32, u64, u32) =
            serde_json::from_slice(&out.stdout)?;
        let gpu = GpuSpec::builtin(&name).unwrap_or(GpuSpec {
            name: format!("{name} (peaks unknown)"),
            memory_gib: memory as f64 / (1u64 << 30) as f64,
            sm_count: sms,
            hbm_bandwidth_gb_per_s: 1000.0,
            l2_cache_mib: l2 as f64 / (1u64 << 20) as f64,
            peak_dense_tflops: PeakTflops {
                fp32: 20.0,
                tf32: 150.0,
                fp16: 300.0,
                bf16: 300.0,
                fp8: None,
            },
        });
        Ok(NullDevice {
            info: DeviceInfo {
                gpu,
                software: SoftwareStamp::default(),
                gpus: count,
                real: true,
                timer: crate::torch::TIMER.to_string(),
            },
        })
    }
}

impl Device for NullDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn handles(&self, q: &OpQuery) -> bool {
        q.op.is_collective()
    }

    fn prepare(&mut self, _q: &OpQuery) -> Result<Box<dyn Runnable + '_>, DeviceError> {
        Err(DeviceError::Skip(
            "collectives need stepcast-bench built with --features cuda (NCCL)".into(),
        ))
    }

    fn saturate(&mut self, _ms: u64) -> Result<(), DeviceError> {
        Ok(())
    }

    fn telemetry(&mut self) -> Option<Telemetry> {
        None
    }
}
