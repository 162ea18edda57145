//! A TEST DOUBLE, not a source of data: a device whose "timings" are the roofline of an
//! imaginary GPU times a deterministic wobble. It lets the protocol, plan, writer, resume and
//! skip logic run in CI without a GPU. Datasets it writes are stamped "MOCK" and `real: false`.

use stepcast::analytic::roofline;
use stepcast::dataset::SoftwareStamp;
use stepcast::hardware::{GpuSpec, PeakTflops};
use stepcast::ops::{OpKind, OpQuery};

use super::{Device, DeviceError, DeviceInfo, Runnable, Telemetry};

pub const MOCK_GPU_NAME: &str = "MOCK test double (not a measurement)";

#[derive(Debug, Clone)]
pub struct MockDevice {
    gpu: GpuSpec,
    /// Calls whose shape has this many elements or more fail as "out of memory".
    pub oom_above_elements: u64,
    /// Kinds it pretends not to support.
    pub unsupported: Vec<OpKind>,
    /// Fail fatally after this many prepared calls (to test interrupted collections).
    pub crash_after: Option<usize>,
    /// Kinds made slower by a factor (to test drift detection).
    pub slowdown: Vec<(OpKind, f64)>,
    /// Wall time each point takes (to interrupt collections in kill tests).
    pub point_delay: std::time::Duration,
    /// Report the power cap as an active throttle reason (to test the flag and its count).
    pub power_capped: bool,
    /// Saturating warm-ups asked for so far.
    pub saturations: usize,
    prepared: usize,
    gpus: u32,
}

impl MockDevice {
    pub fn new(gpus: u32) -> Self {
        MockDevice {
            gpu: GpuSpec {
                name: MOCK_GPU_NAME.to_string(),
                memory_gib: 80.0,
                sm_count: 132,
                hbm_bandwidth_gb_per_s: 3000.0,
                l2_cache_mib: 50.0,
                peak_dense_tflops: PeakTflops {
                    fp32: 60.0,
                    tf32: 400.0,
                    fp16: 800.0,
                    bf16: 800.0,
                    fp8: Some(1600.0),
                },
            },
            oom_above_elements: u64::MAX,
            unsupported: Vec::new(),
            crash_after: None,
            slowdown: Vec::new(),
            point_delay: std::time::Duration::ZERO,
            power_capped: false,
            saturations: 0,
            prepared: 0,
            gpus,
        }
    }

    /// The same double under another GPU's name and peaks (to open models trained on it).
    pub fn with_gpu(mut self, gpu: GpuSpec) -> Self {
        self.gpu = gpu;
        self
    }
}

struct MockRun {
    base_us: f64,
    calls: u64,
}

impl Runnable for MockRun {
    fn run(&mut self) -> Result<(), DeviceError> {
        self.calls += 1;
        Ok(())
    }

    fn run_timed(&mut self) -> Result<f64, DeviceError> {
        self.calls += 1;
        // deterministic ±2 % wobble so the sorted median has something to do
        let wobble = ((self.calls * 2_654_435_761) % 1000) as f64 / 1000.0 - 0.5;
        Ok(self.base_us * (1.0 + 0.04 * wobble))
    }
}

impl Device for MockDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            gpu: self.gpu.clone(),
            software: SoftwareStamp {
                gpu_uuid: Some("MOCK-0000".into()),
                driver: Some("mock".into()),
                cuda: Some("mock".into()),
                ..Default::default()
            },
            gpus: self.gpus,
            real: false,
            timer: "none: synthetic test-double timings".to_string(),
        }
    }

    fn handles(&self, _q: &OpQuery) -> bool {
        true
    }

    fn prepare(&mut self, q: &OpQuery) -> Result<Box<dyn Runnable + '_>, DeviceError> {
        self.prepared += 1;
        std::thread::sleep(self.point_delay);
        if self.crash_after.is_some_and(|n| self.prepared > n) {
            return Err(DeviceError::Fatal("mock device lost (test)".into()));
        }
        if self.unsupported.contains(&q.op) {
            return Err(DeviceError::Skip(format!(
                "{} is not supported on this device",
                q.op
            )));
        }
        let elements: u64 = q.shape.values().iter().product();
        if elements >= self.oom_above_elements {
            return Err(DeviceError::Skip("out of memory".into()));
        }
        let factor = self
            .slowdown
            .iter()
            .find(|(k, _)| *k == q.op)
            .map_or(1.0, |(_, f)| *f);
        let base_us = factor
            * (roofline::device_time_us(q, &self.gpu)
                .unwrap_or_else(|| roofline::work_scale_us(q, &self.gpu) / 50.0)
                + 5.0);
        Ok(Box::new(MockRun { base_us, calls: 0 }))
    }

    fn saturate(&mut self, _ms: u64) -> Result<(), DeviceError> {
        self.saturations += 1;
        Ok(())
    }

    fn telemetry(&mut self) -> Option<Telemetry> {
        Some(Telemetry {
            sm_clock_mhz: 1980,
            max_sm_clock_mhz: 1980,
            temperature_c: 50,
            power_w: 400.0,
            // NVML's software power cap
            throttle_reasons: if self.power_capped { 0x4 } else { 0 },
        })
    }
}
