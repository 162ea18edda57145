//! GEMMs through cuBLASLt, with the matmul descriptor, layouts and algorithm built once per
//! shape (the safe `Matmul` API re-runs the heuristic on every call, which would land in the
//! timing of small GEMMs).
//!
//! A training linear layer is timed as PyTorch lays it out: weight W[n,k] row-major,
//! forward Y[m,n] = X[m,k]·Wᵀ (cuBLASLt "TN"), backward the data gradient dX[m,k] = dY[m,n]·W
//! ("NN") plus the weight gradient dW[n,k] = dYᵀ·X ("NT") bracketed by one pair of events. FP8
//! (E4M3 in, bf16 out, fp32 accumulate, fast accumulation) must be "TN": its backward GEMMs are
//! timed in that layout, the transposes a framework makes before them not included.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::spin::{Cover, Spin};
use crate::device::{DeviceError, Runnable};
use stepcast::ops::{Dtype, GemmShape, Phase};

/// cuBLASLt handle with its workspace.
pub struct Lt {
    pub handle: sys::cublasLtHandle_t,
    pub workspace: CudaSlice<u8>,
    /// A device block of random values per input type, made once: every GEMM input is tiled
    /// with it (see [`fill_random`]).
    pub patterns: RefCell<Vec<(Dtype, CudaSlice<u8>)>>,
    /// The spin queued ahead of a point's timed runs, with its current length; `None` where the
    /// driver would not load it (the host's enqueue is then in the time of a small GEMM).
    pub cover: Option<(Spin, Cell<Cover>)>,
}

impl Drop for Lt {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Bytes of the random block GEMM inputs are tiled with.
const PATTERN_BYTES: usize = 32 << 20;

/// `bytes` of random `dtype` values: bf16 / fp16 uniform in [-1, 1), fp8 E4M3 of either sign
/// with magnitudes 2⁻³…2³ (never NaN).
fn random_values(bytes: usize, dtype: Dtype, seed: u64) -> Vec<u8> {
    let mut rng = stepcast::rng::Rng::new(seed);
    match dtype {
        Dtype::Fp8 => (0..bytes)
            .map(|_| {
                let sign = rng.below(2) as u8;
                let exponent = 4 + rng.below(6) as u8;
                let mantissa = rng.below(8) as u8;
                sign << 7 | exponent << 3 | mantissa
            })
            .collect(),
        _ => (0..bytes / 2)
            .flat_map(|_| {
                let x = (2.0 * rng.unit() - 1.0) as f32;
                let bits = if dtype == Dtype::Fp16 {
                    half::f16::from_f32(x).to_bits()
                } else {
                    half::bf16::from_f32(x).to_bits()
                };
                bits.to_le_bytes()
            })
            .collect(),
    }
}

/// Fills a GEMM input with random values. Tensor cores draw less power on zeros, so the clocks
/// stay higher and a GEMM of zero inputs runs faster than one of real data (on an H100 a
/// median 17 % faster: `datasets/h100-sxm/2026-11-27-zero-inputs/`).
fn fill_random(
    lt_: &Lt,
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u8>,
    dtype: Dtype,
) -> Result<(), DeviceError> {
    let fatal = |e: cudarc::driver::DriverError| DeviceError::Fatal(format!("{e:?}"));
    let mut patterns = lt_.patterns.borrow_mut();
    if !patterns.iter().any(|(d, _)| *d == dtype) {
        let block = stream
            .clone_htod(&random_values(PATTERN_BYTES, dtype, 0x5eed))
            .map_err(fatal)?;
        patterns.push((dtype, block));
    }
    let (_, block) = patterns
        .iter()
        .find(|(d, _)| *d == dtype)
        .expect("made above");
    let len = buf.len();
    let mut at = 0;
    while at < len {
        let n = PATTERN_BYTES.min(len - at);
        stream
            .memcpy_dtod(&block.slice(0..n), &mut buf.slice_mut(at..at + n))
            .map_err(fatal)?;
        at += n;
    }
    Ok(())
}

/// One row-major product D[M,N] = P[M,K]·Q[K,N] with its cuBLASLt objects.
struct Product {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// Elements of the two inputs and the output, every batch together.
    elems: (usize, usize, usize),
}

impl Drop for Product {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn skip(e: impl std::fmt::Debug) -> DeviceError {
    DeviceError::Skip(format!("cuBLASLt: {e:?}"))
}

/// `p_transposed`: P is stored as [K,M]; `q_transposed`: Q is stored as [N,K].
#[allow(clippy::too_many_arguments)]
fn product(
    lt_: &Lt,
    m: u64,
    n: u64,
    k: u64,
    batch: u64,
    dtype: Dtype,
    p_transposed: bool,
    q_transposed: bool,
) -> Result<Product, DeviceError> {
    use sys::cudaDataType_t::*;
    let (in_type, out_type) = match dtype {
        Dtype::Bf16 => (CUDA_R_16BF, CUDA_R_16BF),
        Dtype::Fp16 => (CUDA_R_16F, CUDA_R_16F),
        Dtype::Fp8 => (CUDA_R_8F_E4M3, CUDA_R_16BF),
        other => return Err(DeviceError::Skip(format!("{other} GEMMs are not timed"))),
    };
    let elems = elements(m, n, k, batch)
        .ok_or_else(|| DeviceError::Skip("the GEMM's buffers overflow the address space".into()))?;
    // column-major view: Dᵀ[N×M] = op(A)·op(B) with A the storage of Q and B that of P
    let (a_rows, a_cols) = if q_transposed { (k, n) } else { (n, k) };
    let (b_rows, b_cols) = if p_transposed { (m, k) } else { (k, m) };
    unsafe {
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)
            .map_err(skip)?;
        let set = |attr, value: i32| {
            lt::set_matmul_desc_attribute(desc, attr, &value as *const i32 as *const c_void, 4)
                .map_err(skip)
        };
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            q_transposed as i32,
        )?;
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            p_transposed as i32,
        )?;
        if dtype == Dtype::Fp8 {
            // an int8_t attribute: cuBLASLt refuses any other size (CUBLAS_STATUS_INVALID_VALUE)
            let fast: i8 = 1;
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &fast as *const i8 as *const c_void,
                1,
            )
            .map_err(skip)?;
        }
        let layout = |ty,
                      rows: u64,
                      cols: u64|
         -> Result<sys::cublasLtMatrixLayout_t, DeviceError> {
            let l = lt::create_matrix_layout(ty, rows, cols, rows as i64).map_err(skip)?;
            if batch > 1 {
                let count = batch as i32;
                let stride = (rows * cols) as i64;
                lt::set_matrix_layout_attribute(
                    l,
                    sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    4,
                )
                .map_err(skip)?;
                lt::set_matrix_layout_attribute(l, sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride as *const i64 as *const c_void, 8).map_err(skip)?;
            }
            Ok(l)
        };
        let a = layout(in_type, a_rows, a_cols)?;
        let b = layout(in_type, b_rows, b_cols)?;
        let d = layout(out_type, n, m)?;
        let pref = lt::create_matmul_pref().map_err(skip)?;
        let ws = WORKSPACE_BYTES;
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const usize as *const c_void,
            std::mem::size_of::<usize>(),
        )
        .map_err(skip)?;
        let heuristic = lt::get_matmul_algo_heuristic(lt_.handle, desc, a, b, d, d, pref);
        let _ = lt::destroy_matmul_pref(pref);
        let heuristic = heuristic.map_err(|e| {
            DeviceError::Skip(format!("cuBLASLt has no algorithm for this GEMM: {e:?}"))
        })?;
        Ok(Product {
            desc,
            a,
            b,
            d,
            algo: heuristic.algo,
            elems,
        })
    }
}

/// Elements of P, Q and D over all `batch` strided batches: cuBLASLt reads and writes
/// `batch` × the stride of each, so a buffer of one batch would be overrun.
fn elements(m: u64, n: u64, k: u64, batch: u64) -> Option<(usize, usize, usize)> {
    let all = |rows: u64, cols: u64| {
        rows.checked_mul(cols)?
            .checked_mul(batch.max(1))
            .and_then(|e| usize::try_from(e).ok())
    };
    Some((all(m, k)?, all(k, n)?, all(m, n)?))
}

/// The products a call runs: the forward, or the backward's data and weight gradients.
pub fn products(
    lt_: &Lt,
    g: &GemmShape,
    phase: Phase,
    dtype: Dtype,
) -> Result<Vec<ProductRef>, DeviceError> {
    let (m, n, k, b) = (g.m, g.n, g.k, g.batch);
    let fp8 = dtype == Dtype::Fp8;
    let list = match phase {
        Phase::Bwd => vec![
            // dX[m,k] = dY[m,n]·W[n,k]
            product(lt_, m, k, n, b, dtype, false, fp8)?,
            // dW[n,k] = dYᵀ[n,m]·X[m,k]
            product(lt_, n, k, m, b, dtype, !fp8, fp8)?,
        ],
        _ => vec![product(lt_, m, n, k, b, dtype, false, true)?],
    };
    Ok(list.into_iter().map(|p| ProductRef(Rc::new(p))).collect())
}

#[derive(Clone)]
pub struct ProductRef(Rc<Product>);

/// Inputs of one product, in `sets` copies rotated between runs.
struct Buffers {
    p: Vec<CudaSlice<u8>>,
    q: Vec<CudaSlice<u8>>,
    d: CudaSlice<u8>,
}

pub struct GemmRun<'a> {
    lt: &'a Lt,
    stream: Arc<CudaStream>,
    products: Vec<ProductRef>,
    buffers: Vec<Buffers>,
    next: usize,
    ctx: Arc<CudaContext>,
    /// Events between the timed runs, made as needed and kept.
    marks: Vec<CudaEvent>,
}

pub fn prepare<'a>(
    lt_: &'a Lt,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    products: Vec<ProductRef>,
    dtype: Dtype,
    l2_bytes: usize,
) -> Result<GemmRun<'a>, DeviceError> {
    let in_bytes = if dtype == Dtype::Fp8 { 1 } else { 2 };
    let out_bytes = 2;
    let per_set: usize = products
        .iter()
        .map(|p| (p.0.elems.0 + p.0.elems.1) * in_bytes)
        .sum();
    let (free, _) =
        cudarc::driver::result::mem_get_info().map_err(|e| DeviceError::Fatal(format!("{e:?}")))?;
    let outputs: usize = products.iter().map(|p| p.0.elems.2 * out_bytes).sum();
    if per_set + outputs + (64 << 20) > free {
        return Err(DeviceError::Skip("out of memory".into()));
    }
    // enough input sets that each is evicted from L2 before it is used again
    let sets = (2 * l2_bytes)
        .div_ceil(per_set.max(1))
        .clamp(1, 8)
        .min(((free / 2).saturating_sub(outputs)) / per_set.max(1))
        .max(1);
    let alloc = |bytes: usize| {
        stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|_| DeviceError::Skip("out of memory".into()))
    };
    let mut buffers = Vec::new();
    for p in &products {
        let (pe, qe, de) = p.0.elems;
        let mut b = Buffers {
            p: Vec::new(),
            q: Vec::new(),
            d: alloc(de * out_bytes)?,
        };
        for _ in 0..sets {
            let (mut p_buf, mut q_buf) = (alloc(pe * in_bytes)?, alloc(qe * in_bytes)?);
            fill_random(lt_, stream, &mut p_buf, dtype)?;
            fill_random(lt_, stream, &mut q_buf, dtype)?;
            b.p.push(p_buf);
            b.q.push(q_buf);
        }
        buffers.push(b);
    }
    Ok(GemmRun {
        lt: lt_,
        stream: stream.clone(),
        products,
        buffers,
        next: 0,
        ctx: ctx.clone(),
        marks: Vec::new(),
    })
}

impl GemmRun<'_> {
    fn launch(&mut self) -> Result<(), DeviceError> {
        let set = self.next;
        self.next = (self.next + 1) % self.buffers[0].p.len();
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        let (ws_ptr, _w) = self.lt.workspace.device_ptr(&self.stream);
        for (prod, buf) in self.products.iter().zip(self.buffers.iter_mut()) {
            let p = &prod.0;
            let (pp, _a) = buf.p[set].device_ptr(&self.stream);
            let (qp, _b) = buf.q[set].device_ptr(&self.stream);
            let (dp, _d) = buf.d.device_ptr_mut(&self.stream);
            unsafe {
                lt::matmul(
                    self.lt.handle,
                    p.desc,
                    &alpha as *const f32 as *const c_void,
                    &beta as *const f32 as *const c_void,
                    qp as *const c_void,
                    p.a,
                    pp as *const c_void,
                    p.b,
                    dp as *const c_void,
                    p.d,
                    dp as *mut c_void,
                    p.d,
                    &p.algo,
                    ws_ptr as *mut c_void,
                    WORKSPACE_BYTES,
                    self.stream.cu_stream() as sys::cudaStream_t,
                )
                .map_err(|e| DeviceError::Skip(format!("cuBLASLt matmul: {e:?}")))?;
            }
        }
        Ok(())
    }
}

impl Runnable for GemmRun<'_> {
    fn run(&mut self) -> Result<(), DeviceError> {
        self.launch()?;
        self.stream
            .synchronize()
            .map_err(|e| DeviceError::Fatal(format!("{e:?}")))
    }

    fn run_timed(&mut self) -> Result<f64, DeviceError> {
        Ok(self.run_timed_back_to_back(1)?[0])
    }

    /// The timed runs queued behind one GPU spin, an event between each two: the spin covers
    /// the host's enqueue of all of them (it lengthens itself when it did not), and the GPU
    /// then runs them without a gap, at the clocks of a busy GPU rather than of one that
    /// idled before each run.
    fn run_timed_back_to_back(&mut self, n: u32) -> Result<Vec<f64>, DeviceError> {
        let fatal = |e: cudarc::driver::DriverError| DeviceError::Fatal(format!("{e:?}"));
        let n = n as usize;
        while self.marks.len() < n + 1 {
            let e = self
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(fatal)?;
            self.marks.push(e);
        }
        let lt = self.lt;
        let Some((spin, cover)) = &lt.cover else {
            // no spin: each run alone, its time including the host's launch
            let mut times = Vec::with_capacity(n);
            for _ in 0..n {
                self.marks[0].record(&self.stream).map_err(fatal)?;
                self.launch()?;
                self.marks[1].record(&self.stream).map_err(fatal)?;
                let ms = self.marks[0].elapsed_ms(&self.marks[1]).map_err(fatal)?;
                times.push(ms as f64 * 1000.0);
            }
            return Ok(times);
        };
        for _ in 0..Cover::TRIES {
            let mut c = cover.get();
            let queued = std::time::Instant::now();
            spin.queue(&self.stream, c.ns).map_err(fatal)?;
            self.marks[0].record(&self.stream).map_err(fatal)?;
            for i in 1..=n {
                self.launch()?;
                self.marks[i].record(&self.stream).map_err(fatal)?;
            }
            let host_ns = queued.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            let mut times = Vec::with_capacity(n);
            for i in 0..n {
                let ms = self.marks[i]
                    .elapsed_ms(&self.marks[i + 1])
                    .map_err(fatal)?;
                times.push(ms as f64 * 1000.0);
            }
            let covered = c.covered(host_ns);
            cover.set(c);
            if covered {
                return Ok(times);
            }
        }
        Err(DeviceError::Skip(format!(
            "the host took longer than a {} ms spin to queue {n} runs of this GEMM {} times",
            Cover::MAX_NS / 1_000_000,
            Cover::TRIES
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{elements, random_values};

    #[test]
    fn inputs_are_random_finite_values_of_their_type() {
        use stepcast::ops::Dtype;
        let fp8 = random_values(4096, Dtype::Fp8, 1);
        assert!(fp8.iter().all(|b| b & 0x7f != 0x7f), "an E4M3 NaN");
        assert!(fp8.iter().any(|b| b & 0x80 != 0) && fp8.iter().any(|b| b & 0x80 == 0));
        let bf16 = random_values(4096, Dtype::Bf16, 1);
        let values: Vec<f32> = bf16
            .chunks(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect();
        assert_eq!(values.len(), 2048);
        assert!(values.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        assert!(mean.abs() < 0.1, "{mean}");
        assert!(values.iter().filter(|v| **v == 0.0).count() < 10);
    }

    #[test]
    fn buffers_hold_every_batch_of_a_strided_batched_gemm() {
        // the unfused attention's scores: 64 batches of 2560 × 2560 over 192
        assert_eq!(
            elements(2560, 2560, 192, 64),
            Some((2560 * 192 * 64, 192 * 2560 * 64, 2560 * 2560 * 64))
        );
        assert_eq!(elements(8, 4, 2, 1), Some((16, 8, 32)));
        assert_eq!(elements(u64::MAX, 2, 2, 2), None);
    }
}
