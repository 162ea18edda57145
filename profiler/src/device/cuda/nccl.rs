//! NCCL collectives over a group of the node's GPUs (one communicator per GPU, all driven from
//! this process with grouped calls), or across nodes when the harness runs as one process per
//! node under Slurm or MPI (communicators created with ncclCommInitRank, the unique id passed
//! through a file on a shared file system).
//!
//! A collective is timed by events on every participating GPU's stream; the time is the
//! slowest GPU's. `bytes` follows nccl-tests (and stepcast's `CollectiveShape`): the buffer of
//! an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter, each
//! rank's send buffer of an all-to-all (built from grouped send/recv pairs, as NCCL's own is),
//! the message of a send/recv.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nccl, sys};

use crate::device::{DeviceError, Launch, Runnable};
use stepcast::ops::{CollectiveShape, OpKind};

fn nerr(e: nccl::NcclError) -> DeviceError {
    DeviceError::Skip(format!("NCCL: {:?}", e.0))
}

/// Communicators of one layout, one per local GPU taking part.
pub struct Group {
    comms: Vec<sys::ncclComm_t>,
    /// Indices (into the device's GPU list) of the local GPUs in the group.
    local: Vec<usize>,
    /// Global rank of the first local GPU; ranks = nodes × GPUs per node.
    first_rank: usize,
    ranks: usize,
}

impl Drop for Group {
    fn drop(&mut self) {
        for &c in &self.comms {
            unsafe {
                let _ = nccl::comm_destroy(c);
            }
        }
    }
}

impl Group {
    /// All GPUs of a layout on this node: `ncclCommInitAll` for one node, `ncclCommInitRank` per
    /// local GPU with a shared unique id across nodes. `None` when this process takes no part.
    pub fn create(
        layout: (u64, u64),
        launch: Option<&Launch>,
    ) -> Result<Option<Group>, DeviceError> {
        let (nodes, gpn) = layout;
        let local: Vec<usize> = (0..gpn as usize).collect();
        match launch {
            None => {
                if nodes > 1 {
                    return Err(DeviceError::Skip(
                        "a multi-node layout needs a multi-node launch".into(),
                    ));
                }
                let mut comms = vec![std::ptr::null_mut(); gpn as usize];
                let devs: Vec<i32> = (0..gpn as i32).collect();
                unsafe { nccl::comm_init_all(comms.as_mut_ptr(), gpn as i32, devs.as_ptr()) }
                    .map_err(nerr)?;
                Ok(Some(Group {
                    comms,
                    local,
                    first_rank: 0,
                    ranks: gpn as usize,
                }))
            }
            Some(l) => {
                if l.node >= nodes {
                    return Ok(None);
                }
                let id = unique_id(l, layout)?;
                let ranks = (nodes * gpn) as usize;
                let first_rank = (l.node * gpn) as usize;
                let mut comms = vec![std::ptr::null_mut(); gpn as usize];
                nccl::group_start().map_err(nerr)?;
                for (i, c) in comms.iter_mut().enumerate() {
                    unsafe { nccl::comm_init_rank(c, ranks as i32, id, (first_rank + i) as i32) }
                        .map_err(nerr)?;
                }
                nccl::group_end().map_err(nerr)?;
                Ok(Some(Group {
                    comms,
                    local,
                    first_rank,
                    ranks,
                }))
            }
        }
    }
}

/// Process 0 writes the layout's unique id to the rendezvous directory; the others wait for it.
fn unique_id(l: &Launch, (nodes, gpn): (u64, u64)) -> Result<sys::ncclUniqueId, DeviceError> {
    let path = l.rendezvous.join(format!("nccl-id-{nodes}x{gpn}"));
    let size = std::mem::size_of::<sys::ncclUniqueId>();
    if l.node == 0 {
        let id = nccl::get_uniqueid().map_err(nerr)?;
        let bytes = unsafe { std::slice::from_raw_parts(&id as *const _ as *const u8, size) };
        stepcast::fsutil::write_atomic(&path, bytes)
            .map_err(|e| DeviceError::Fatal(e.to_string()))?;
        return Ok(id);
    }
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        if let Ok(bytes) = std::fs::read(&path) {
            if bytes.len() == size {
                let mut id = std::mem::MaybeUninit::<sys::ncclUniqueId>::uninit();
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), id.as_mut_ptr() as *mut u8, size);
                    return Ok(id.assume_init());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(DeviceError::Fatal(format!(
                "no NCCL id at {} after an hour",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct CollectiveRun<'a> {
    op: OpKind,
    group: &'a Group,
    streams: Vec<Arc<CudaStream>>,
    send: Vec<CudaSlice<u8>>,
    recv: Vec<CudaSlice<u8>>,
    /// Elements (bf16) of the per-rank count the call takes.
    count: usize,
    starts: Vec<CudaEvent>,
    ends: Vec<CudaEvent>,
}

pub fn prepare<'a>(
    op: OpKind,
    shape: &CollectiveShape,
    group: &'a Group,
    ctxs: &[Arc<CudaContext>],
    streams: &[Arc<CudaStream>],
) -> Result<CollectiveRun<'a>, DeviceError> {
    let ranks = group.ranks as u64;
    let elems = (shape.bytes / 2).max(ranks);
    // (send, recv) elements per rank, and the count argument of the call
    let (send, recv, count) = match op {
        OpKind::AllReduce => (elems, elems, elems),
        OpKind::AllGather => (elems / ranks, elems / ranks * ranks, elems / ranks),
        OpKind::ReduceScatter => (elems / ranks * ranks, elems / ranks, elems / ranks),
        OpKind::AllToAll => (elems / ranks * ranks, elems / ranks * ranks, elems / ranks),
        OpKind::SendRecv => (elems, elems, elems),
        other => return Err(DeviceError::Skip(format!("{other} is not a collective"))),
    };
    let mut run = CollectiveRun {
        op,
        group,
        streams: Vec::new(),
        send: Vec::new(),
        recv: Vec::new(),
        count: count as usize,
        starts: Vec::new(),
        ends: Vec::new(),
    };
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    for &i in &group.local {
        let stream = streams[i].clone();
        let oom = |_| DeviceError::Skip("out of memory".into());
        run.send
            .push(stream.alloc_zeros::<u8>(send as usize * 2).map_err(oom)?);
        run.recv
            .push(stream.alloc_zeros::<u8>(recv as usize * 2).map_err(oom)?);
        let ev = || {
            ctxs[i]
                .new_event(timing)
                .map_err(|e| DeviceError::Fatal(format!("{e:?}")))
        };
        run.starts.push(ev()?);
        run.ends.push(ev()?);
        run.streams.push(stream);
    }
    Ok(run)
}

impl CollectiveRun<'_> {
    fn launch(&mut self) -> Result<(), DeviceError> {
        let dt = sys::ncclDataType_t::ncclBfloat16;
        let n = self.count;
        nccl::group_start().map_err(nerr)?;
        for (j, comm) in self.group.comms.iter().enumerate() {
            let stream = &self.streams[j];
            let cu = stream.cu_stream() as sys::cudaStream_t;
            let (s, _a) = self.send[j].device_ptr(stream);
            let (r, _b) = self.recv[j].device_ptr_mut(stream);
            let (s, r) = (s as *const c_void, r as *mut c_void);
            let rank = self.group.first_rank + j;
            unsafe {
                match self.op {
                    OpKind::AllReduce => {
                        nccl::all_reduce(s, r, n, dt, sys::ncclRedOp_t::ncclSum, *comm, cu)
                    }
                    OpKind::AllGather => nccl::all_gather(s, r, n, dt, *comm, cu),
                    OpKind::ReduceScatter => {
                        nccl::reduce_scatter(s, r, n, dt, sys::ncclRedOp_t::ncclSum, *comm, cu)
                    }
                    OpKind::AllToAll => {
                        for peer in 0..self.group.ranks {
                            let off = peer * n * 2;
                            nccl::send(
                                (s as *const u8).add(off) as *const c_void,
                                n,
                                dt,
                                peer as i32,
                                *comm,
                                cu,
                            )
                            .map_err(nerr)?;
                            nccl::recv(
                                (r as *mut u8).add(off) as *mut c_void,
                                n,
                                dt,
                                peer as i32,
                                *comm,
                                cu,
                            )
                            .map_err(nerr)?;
                        }
                        Ok(nccl::NcclStatus::Success)
                    }
                    _ => {
                        if rank == 0 {
                            nccl::send(s, n, dt, 1, *comm, cu)
                        } else {
                            nccl::recv(r, n, dt, 0, *comm, cu)
                        }
                    }
                }
            }
            .map_err(nerr)?;
        }
        nccl::group_end().map_err(nerr)?;
        Ok(())
    }
}

impl Runnable for CollectiveRun<'_> {
    fn run(&mut self) -> Result<(), DeviceError> {
        self.launch()?;
        for s in &self.streams {
            s.synchronize()
                .map_err(|e| DeviceError::Fatal(format!("{e:?}")))?;
        }
        Ok(())
    }

    fn run_timed(&mut self) -> Result<f64, DeviceError> {
        let fatal = |e: cudarc::driver::DriverError| DeviceError::Fatal(format!("{e:?}"));
        for (e, s) in self.starts.iter().zip(&self.streams) {
            e.record(s).map_err(fatal)?;
        }
        self.launch()?;
        for (e, s) in self.ends.iter().zip(&self.streams) {
            e.record(s).map_err(fatal)?;
        }
        let mut slowest = 0.0f64;
        for (a, b) in self.starts.iter().zip(&self.ends) {
            slowest = slowest.max(a.elapsed_ms(b).map_err(fatal)? as f64);
        }
        Ok(slowest * 1000.0)
    }
}
