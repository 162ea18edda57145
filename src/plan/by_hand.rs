//! What tests that write a plan out by hand share: the plan of a layout on the models-free
//! DGX H100, and its calls as lines of text, "label: op phase dtype (role) shape [xcount]
//! [flags]", shapes compactly (a GEMM m×n×k, attention batch, queries × keys, heads and head
//! size, tokens batch×seq×width, a collective its bytes over nodes × GPUs a node).

use super::{Call, Plan};
use crate::ops::{OpQuery, Shape};
use crate::workload::{Arch, Layout, ParallelSpec};

/// `arch` under `spec` on a DGX H100 (8 GPUs a node); the layout must be valid.
pub(crate) fn plan(arch: &Arch, spec: ParallelSpec) -> Plan {
    let c = crate::hardware::dgx_h100_without_models();
    Plan::new(arch, &Layout::new(&spec, arch, &c).unwrap(), &c)
}

/// One call of `q` as a line, its flags: run beside a kernel, overlapped, a host wait.
pub(crate) fn line(q: &OpQuery, c: &Call) -> String {
    let shape = match q.shape {
        Shape::Gemm(g) if g.batch == 1 => format!("{}x{}x{}", g.m, g.n, g.k),
        Shape::Gemm(g) => format!("{}x{}x{} batch {}", g.m, g.n, g.k, g.batch),
        Shape::Attention(a) => format!(
            "b{} {}x{} h{}/{} d{}{}",
            a.batch,
            a.seq_q,
            a.seq_kv,
            a.heads,
            a.kv_heads,
            a.head_dim,
            if a.causal { " causal" } else { "" }
        ),
        Shape::Tokens(t) => format!("{}x{}x{}", t.batch, t.seq, t.width),
        Shape::Lookup(l) => format!("{}x{} d{} v{}", l.batch, l.seq, l.hidden, l.vocab),
        Shape::Collective(c) => format!("{} B {}x{}", c.bytes, c.nodes, c.gpus_per_node),
        Shape::Optimizer(o) => format!("{} params {} tensors", o.params, o.tensors),
    };
    let role = q.role.map(|r| format!(" ({r})")).unwrap_or_default();
    let mut s = format!(
        "{}: {} {} {}{role} {shape}",
        c.label,
        q.op.name(),
        q.phase,
        q.dtype
    );
    if c.count != 1.0 {
        s += &format!(" x{}", c.count);
    }
    for (flag, on) in [
        ("beside", c.beside_kernel),
        ("overlapped", c.overlapped),
        ("waits", c.host_waits),
    ] {
        if on {
            s += &format!(" {flag}");
        }
    }
    s
}

/// Each of `calls` of plan `p` as a line.
pub(crate) fn lines(p: &Plan, calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| line(&p.queries[c.query as usize], c))
        .collect()
}
