//! A GPU spin queued ahead of a point's timed runs, so that the events bracket the GPU's work
//! and not the host's enqueue. With an idle stream, the start event fires as soon as it is
//! recorded and the GPU then waits for the host to launch the call: on the H100 every
//! cuBLASLt GEMM measured at least ~30 µs that way, whatever its work
//! (datasets/h100-sxm/2026-11-27). With the spin in front, the start event fires when the spin ends, by which time the runs are
//! queued behind it. This is the "blocking kernel" of NVIDIA's nvbench, on a timer instead of
//! a host flag; the PyTorch backend does the same with `torch.cuda._sleep`. One spin ahead of
//! all the timed runs, not one per run: a spin before each run lets the power-capped clock
//! recover in between (GEMMs of over 1 ms timed 1.3 % faster that way on an H100:
//! datasets/h100-sxm/2026-11-27-spin against datasets/h100-sxm/2026-11-27-back-to-back).

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys, CudaStream, DriverError};

/// One thread spinning until the GPU's global nanosecond timer passes its argument. PTX, so
/// that the driver compiles it for whatever GPU it runs on (no NVRTC, no toolkit needed).
const SPIN_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64

.visible .entry stepcast_spin(.param .u64 stepcast_spin_ns)
{
	.reg .pred %p<2>;
	.reg .b64 %rd<5>;

	ld.param.u64 %rd1, [stepcast_spin_ns];
	mov.u64 %rd2, %globaltimer;
	add.s64 %rd3, %rd2, %rd1;
$L_spin:
	mov.u64 %rd4, %globaltimer;
	setp.lt.u64 %p1, %rd4, %rd3;
	@%p1 bra $L_spin;
	ret;
}
"#;

/// The spin kernel, loaded into the current context.
pub struct Spin {
    module: sys::CUmodule,
    function: sys::CUfunction,
}

impl Spin {
    /// Loads the kernel into the context bound to this thread.
    pub fn load() -> Result<Spin, DriverError> {
        let source = CString::new(SPIN_PTX).expect("PTX has no NUL");
        let module = unsafe { result::module::load_data(source.as_ptr() as *const c_void) }?;
        let name = CString::new("stepcast_spin").expect("name has no NUL");
        match unsafe { result::module::get_function(module, name) } {
            Ok(function) => Ok(Spin { module, function }),
            Err(e) => {
                let _ = unsafe { result::module::unload(module) };
                Err(e)
            }
        }
    }

    /// Queues a spin of `ns` nanoseconds on `stream`.
    pub fn queue(&self, stream: &CudaStream, ns: u64) -> Result<(), DriverError> {
        let mut ns = ns;
        let mut params = [&mut ns as *mut u64 as *mut c_void];
        unsafe {
            result::launch_kernel(
                self.function,
                (1, 1, 1),
                (1, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// How long the spin lasts: long enough that the host has queued the runs (and their events)
/// before the spin ends. Runs whose enqueue took longer than 80 % of the spin may include host
/// time: they are thrown away and the spin lengthened, so the cover adapts to a slow host
/// instead of trusting a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cover {
    pub ns: u64,
}

impl Cover {
    /// 500 µs: ten cuBLASLt launches at the ~25 µs of host time the first H100 collection's
    /// smallest GEMMs carried, twice over.
    pub const START_NS: u64 = 500_000;
    /// 20 ms: a host slower than that to queue one GEMM is broken, not slow.
    pub const MAX_NS: u64 = 20_000_000;
    /// Retries of one sample before its time is kept anyway (and the cover is at its longest).
    pub const TRIES: u32 = 4;

    pub fn new() -> Self {
        Cover { ns: Self::START_NS }
    }

    /// Whether a sample whose enqueue took `host_ns` after the spin was queued was covered;
    /// if not, lengthens the spin for the next try.
    pub fn covered(&mut self, host_ns: u64) -> bool {
        if host_ns.saturating_mul(5) < self.ns.saturating_mul(4) {
            return true;
        }
        self.ns = self
            .ns
            .saturating_mul(2)
            .max(host_ns.saturating_mul(2))
            .min(Self::MAX_NS);
        false
    }
}

impl Default for Cover {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Cover;

    #[test]
    fn a_slow_enqueue_lengthens_the_spin_up_to_its_bound() {
        let mut c = Cover::new();
        assert!(
            c.covered(250_000),
            "ten 25 µs launches are covered by 500 µs"
        );
        assert_eq!(c.ns, Cover::START_NS);
        assert!(!c.covered(425_000), "85 % of the spin is too close");
        assert_eq!(c.ns, 1_000_000);
        assert!(c.covered(425_000));
        assert!(!c.covered(3_000_000));
        assert_eq!(c.ns, 6_000_000);
        assert!(!c.covered(u64::MAX));
        assert_eq!(c.ns, Cover::MAX_NS);
    }

    #[test]
    fn the_kernel_is_one_entry_named_as_loaded() {
        assert_eq!(super::SPIN_PTX.matches(".entry").count(), 1);
        assert!(super::SPIN_PTX.contains(".entry stepcast_spin("));
    }
}
