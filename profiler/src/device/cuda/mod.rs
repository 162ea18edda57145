//! The CUDA device: cuBLASLt GEMMs and NCCL collectives timed in-process with CUDA events, NVML
//! telemetry. Everything is loaded at run time (cudarc `dynamic-loading`), so this builds on a
//! machine without CUDA and fails with a message, not a panic, where a library is missing.

mod gemm;
mod nccl;
mod nvml;
mod spin;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream};

use super::{Device, DeviceError, DeviceInfo, Launch, Runnable, Telemetry};
use stepcast::dataset::SoftwareStamp;
use stepcast::hardware::{GpuSpec, PeakTflops};
use stepcast::ops::{Dtype, GemmShape, OpKind, OpQuery, Phase, Shape};

pub struct CudaDevice {
    ctxs: Vec<Arc<CudaContext>>,
    streams: Vec<Arc<CudaStream>>,
    lt: gemm::Lt,
    products: HashMap<(GemmShape, Phase, Dtype), Vec<gemm::ProductRef>>,
    groups: HashMap<(u64, u64), Option<nccl::Group>>,
    launch: Option<Launch>,
    nccl: bool,
    fp8: bool,
    l2_bytes: usize,
    nvml: Option<nvml::Nvml>,
    info: DeviceInfo,
}

/// The timer a collection on this device states in its dataset's meta.yaml.
pub const TIMER_COVERED: &str =
    "CUDA events between the timed runs of a point, queued back to back \
     behind one GPU spin: the host's launch is not timed and the GPU does not idle between runs";

fn fatal(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow::anyhow!("CUDA: {e:?}")
}

/// Makes libnccl.so.2 findable: cudarc looks for `libnccl.so` (and `.so.<CUDA major>`), which
/// pip's nvidia-nccl and most systems ship only as `libnccl.so.2`. A directory with a
/// `libnccl.so` link to the real file goes on LD_LIBRARY_PATH and the process starts again.
pub fn ensure_nccl_loadable() {
    if unsafe { cudarc::nccl::sys::is_culib_present() }
        || std::env::var_os("STEPCAST_NCCL_SHIM").is_some()
    {
        return;
    }
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/cuda/lib64",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    if let Ok(out) = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))",
        ])
        .output()
    {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    let Some(real) = dirs
        .iter()
        .map(|d| d.join("libnccl.so.2"))
        .find(|p| p.is_file())
    else {
        return;
    };
    // a private directory, created exclusively with an unpredictable name (never one that
    // already exists): it goes first on the library path of the restarted process, which
    // removes it when it ends (`remove_nccl_shim`)
    let Ok(dir) = tempfile::Builder::new().prefix("stepcast-nccl-").tempdir() else {
        return;
    };
    if std::os::unix::fs::symlink(&real, dir.path().join("libnccl.so")).is_err() {
        return;
    }
    let shim = dir.keep();
    let path = format!(
        "{}:{}",
        shim.display(),
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    );
    let exe = std::env::current_exe().expect("own path");
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env("STEPCAST_NCCL_SHIM", &shim)
        .exec();
    let _ = std::fs::remove_file(shim.join("libnccl.so"));
    let _ = std::fs::remove_dir(&shim);
    eprintln!(
        "warning: could not restart with {} on LD_LIBRARY_PATH: {err}",
        shim.display()
    );
}

/// Removes the library-path shim this process was restarted with: only the link this tool
/// made, in a directory whose name says this tool made it, and the directory if then empty.
pub fn remove_nccl_shim() {
    let Some(dir) = std::env::var_os("STEPCAST_NCCL_SHIM").map(PathBuf::from) else {
        return;
    };
    let ours = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("stepcast-nccl-"));
    let link = dir.join("libnccl.so");
    if ours
        && link
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
    {
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Opens the node's GPUs (all, or those listed).
pub fn open(gpus: Option<Vec<usize>>, launch: Option<Launch>) -> anyhow::Result<Box<dyn Device>> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        anyhow::bail!(stepcast::Error::Invalid(
            "libcuda.so not found: run stepcast-bench on a GPU node with the NVIDIA driver".into()
        ));
    }
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        anyhow::bail!(stepcast::Error::Invalid(
            "libcublasLt.so.13 not found: put the CUDA 13 libraries (the toolkit's lib64, or pip's \
             nvidia-cublas) on LD_LIBRARY_PATH"
                .into()
        ));
    }
    let count = CudaContext::device_count().map_err(fatal)? as usize;
    if count == 0 {
        anyhow::bail!("the driver reports no GPU");
    }
    let list = gpus.unwrap_or_else(|| (0..count).collect());
    if let Some(bad) = list.iter().find(|&&g| g >= count) {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "--gpus lists GPU {bad} but the node has {count} (0 to {}): give GPUs it has",
            count - 1
        )));
    }
    let mut ctxs = Vec::new();
    let mut streams = Vec::new();
    for &g in &list {
        let ctx = CudaContext::new(g).map_err(fatal)?;
        streams.push(ctx.new_stream().map_err(fatal)?);
        ctxs.push(ctx);
    }
    ctxs[0].bind_to_thread().map_err(fatal)?;
    let handle = cudarc::cublaslt::result::create_handle().map_err(fatal)?;
    let workspace = streams[0]
        .alloc_zeros::<u8>(gemm::WORKSPACE_BYTES)
        .map_err(fatal)?;
    let cover = match spin::Spin::load() {
        Ok(s) => Some((s, std::cell::Cell::new(spin::Cover::new()))),
        Err(e) => {
            eprintln!(
                "warning: the driver would not load the timing spin ({e:?}): GEMMs are timed \
                 without it, and a small GEMM's time includes the host's launch"
            );
            None
        }
    };
    let timer = if cover.is_some() {
        TIMER_COVERED
    } else {
        "CUDA events (no spin ahead: a small call's time includes the host's launch)"
    };
    let lt = gemm::Lt {
        handle,
        workspace,
        patterns: Default::default(),
        cover,
    };
    let (major, minor) = ctxs[0].compute_capability().map_err(fatal)?;
    let sms = ctxs[0]
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(fatal)? as u32;
    let l2_bytes = ctxs[0]
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(fatal)? as usize;
    let name = ctxs[0].name().map_err(fatal)?;
    let nvml = nvml::Nvml::open();
    let gpu = GpuSpec::builtin(&name).unwrap_or_else(|| {
        estimated_spec(
            &name,
            &ctxs[0],
            sms,
            l2_bytes,
            (major, minor),
            nvml.as_ref(),
        )
    });
    let nccl = unsafe { cudarc::nccl::sys::is_culib_present() };
    let version = |v: i64, base: i64| {
        format!(
            "{}.{}.{}",
            v / base,
            v / (base / 100) % 100,
            v % (base / 100)
        )
    };
    let mut driver_cuda = 0;
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_cuda) };
    let software = SoftwareStamp {
        gpu_uuid: nvml.as_ref().and_then(|n| n.uuid(list[0] as u32)),
        driver: nvml.as_ref().and_then(|n| n.driver_version()),
        cuda: Some(format!(
            "{}.{}",
            driver_cuda / 1000,
            driver_cuda % 1000 / 10
        )),
        cublas: Some(version(
            unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() } as i64,
            10000,
        )),
        nccl: nccl
            .then(|| {
                cudarc::nccl::result::get_nccl_version()
                    .ok()
                    .map(|v| version(v as i64, 10000))
            })
            .flatten(),
        sm_clock_mhz: nvml
            .as_ref()
            .and_then(|n| n.max_sm_clock_mhz(list[0] as u32)),
        power_limit_w: nvml.as_ref().and_then(|n| n.power_limit_w(list[0] as u32)),
        ..Default::default()
    };
    Ok(Box::new(CudaDevice {
        info: DeviceInfo {
            gpu,
            software,
            gpus: list.len() as u32,
            real: true,
            timer: timer.to_string(),
        },
        ctxs,
        streams,
        lt,
        products: HashMap::new(),
        groups: HashMap::new(),
        launch,
        nccl,
        fp8: (major, minor) >= (8, 9),
        l2_bytes,
        nvml,
    }))
}

/// Peaks of a GPU missing from the catalogue, from its SM count and boost clock: dense
/// tensor-core FLOPs per SM and clock are 1,024 (fp16/bf16) on Volta/Turing, 2,048 on Ampere
/// and Ada, 4,096 on Hopper (fp8 twice that); marked "(estimated)" in the name.
fn estimated_spec(
    name: &str,
    ctx: &Arc<CudaContext>,
    sms: u32,
    l2: usize,
    cc: (i32, i32),
    nvml: Option<&nvml::Nvml>,
) -> GpuSpec {
    let clock_ghz = nvml.and_then(|n| n.max_sm_clock_mhz(0)).unwrap_or(1500) as f64 / 1000.0;
    let per_sm = match cc.0 {
        9.. => 4096.0,
        8 => 2048.0,
        _ => 1024.0,
    };
    let half = sms as f64 * clock_ghz * per_sm / 1000.0;
    GpuSpec {
        name: format!("{name} (estimated)"),
        memory_gib: ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64,
        sm_count: sms,
        hbm_bandwidth_gb_per_s: nvml
            .and_then(|n| n.memory_bandwidth_gb_per_s(0))
            .unwrap_or(1000.0),
        l2_cache_mib: l2 as f64 / (1 << 20) as f64,
        peak_dense_tflops: PeakTflops {
            fp32: half / 16.0,
            tf32: half / 2.0,
            fp16: half,
            bf16: half,
            fp8: (cc >= (8, 9)).then_some(2.0 * half),
        },
    }
}

impl Device for CudaDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn handles(&self, q: &OpQuery) -> bool {
        q.op == OpKind::Gemm || q.op.is_collective()
    }

    fn prepare(&mut self, q: &OpQuery) -> Result<Box<dyn Runnable + '_>, DeviceError> {
        match (q.op, q.shape) {
            (OpKind::Gemm, Shape::Gemm(g)) => {
                if q.dtype == Dtype::Fp8 && !self.fp8 {
                    return Err(DeviceError::Skip("this GPU has no FP8 tensor cores".into()));
                }
                self.ctxs[0]
                    .bind_to_thread()
                    .map_err(|e| DeviceError::Fatal(format!("{e:?}")))?;
                let key = (g, q.phase, q.dtype);
                if !self.products.contains_key(&key) {
                    let p = gemm::products(&self.lt, &g, q.phase, q.dtype)?;
                    self.products.insert(key, p);
                }
                let products = self.products[&key].clone();
                let run = gemm::prepare(
                    &self.lt,
                    &self.ctxs[0],
                    &self.streams[0],
                    products,
                    q.dtype,
                    self.l2_bytes,
                )?;
                Ok(Box::new(run))
            }
            (op, Shape::Collective(c)) => {
                if !self.nccl {
                    return Err(DeviceError::Skip(
                        "libnccl.so not found: install NCCL or pip's nvidia-nccl".into(),
                    ));
                }
                let layout = (c.nodes, c.gpus_per_node);
                if c.gpus_per_node as usize > self.ctxs.len() {
                    return Err(DeviceError::Skip(format!(
                        "needs {} GPUs on a node",
                        c.gpus_per_node
                    )));
                }
                if !self.groups.contains_key(&layout) {
                    let g = nccl::Group::create(layout, self.launch.as_ref())?;
                    self.groups.insert(layout, g);
                }
                match &self.groups[&layout] {
                    Some(group) => Ok(Box::new(nccl::prepare(
                        op,
                        &c,
                        group,
                        &self.ctxs,
                        &self.streams,
                    )?)),
                    None => Err(DeviceError::Skip(
                        "this node takes no part in this layout".into(),
                    )),
                }
            }
            _ => Err(DeviceError::Skip(format!(
                "{} is timed by the PyTorch backend",
                q.op
            ))),
        }
    }

    fn saturate(&mut self, ms: u64) -> Result<(), DeviceError> {
        if ms == 0 {
            return Ok(());
        }
        let q = OpQuery {
            op: OpKind::Gemm,
            phase: Phase::Fwd,
            dtype: Dtype::Bf16,
            role: None,
            shape: Shape::Gemm(GemmShape {
                m: 8192,
                n: 8192,
                k: 8192,
                batch: 1,
            }),
        };
        let deadline = Instant::now() + Duration::from_millis(ms);
        let mut run = self.prepare(&q)?;
        while Instant::now() < deadline {
            run.run()?;
        }
        Ok(())
    }

    fn telemetry(&mut self) -> Option<Telemetry> {
        self.nvml.as_ref()?.telemetry(0)
    }
}
