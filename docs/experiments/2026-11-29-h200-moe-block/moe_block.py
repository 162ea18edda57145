"""One expert-parallel rank's mixture-of-experts block on one GPU, forward + backward, as
Megatron-Core's all-to-all dispatcher runs it without the all-to-alls: the router GEMM, softmax
and top-k, the token counts read back to the host (Megatron's `cuda_sync_point`), the tokens
permuted by expert, sorted by local expert (the copy a rank with several experts makes), the
experts' up, activation and down on each expert's tokens, unsorted, weighted by their router
probabilities and added back per token. A rank of ep ranks receives T·k tokens at balance, so
routing T tokens top-k over E experts and keeping expert mod (E / ep) reproduces its local work.

Experts run either one cuBLAS GEMM per expert (`loop`: Megatron-Core's SequentialMLP, and what
Transformer Engine's GroupedLinear issues on Hopper) or PyTorch's grouped GEMM (`grouped`:
torch._grouped_mm, each expert's rows padded to 16). Per configuration and implementation it
prints one JSON line: the block's median time (CUDA events, 10 runs after 3 warm-ups), the host's
time to issue it, a profiled run's device time per kernel (forward alone, and forward + backward),
the GPU's busy share of the profiled span, and each expert GEMM timed alone back to back at the
mean tokens per expert. Usage: moe_block.py OUT.jsonl [cpu]"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

DEV = "cpu" if "cpu" in sys.argv[2:] else "cuda"
DT = torch.bfloat16

# a rank's share of each NeMo run in the mixtures set (tokens per micro-batch on the rank, the
# model's experts, experts on the rank, top-k, expert width)
CONFIGS = [
    dict(name="gpt-oss-120b ep8", T=4096, H=2880, E=128, EL=16, k=4, F=2880, act="gpt_oss", bias=True),
    dict(name="qwen3-30b-a3b ep16", T=4096, H=2048, E=128, EL=8, k=8, F=768, act="swiglu", bias=False),
    dict(name="qwen3-30b-a3b ep8", T=4096, H=2048, E=128, EL=16, k=8, F=768, act="swiglu", bias=False),
    dict(name="qwen3-235b-a22b ep32 tp2", T=2048, H=4096, E=128, EL=4, k=8, F=1536, act="swiglu", bias=False),
]
if DEV == "cpu":  # a smoke test of the code paths
    CONFIGS = [dict(c, T=64, H=32, F=48, E=16, EL=4) for c in CONFIGS[:2]]


def activation(h, kind):
    g, u = h.chunk(2, dim=-1)
    if kind == "gpt_oss":  # GPT-OSS: clamped gate and up, gate·sigmoid(1.702·gate)·(up + 1)
        g = g.clamp(max=7.0)
        u = u.clamp(min=-7.0, max=7.0)
        return g * torch.sigmoid(1.702 * g) * (u + 1)
    return F.silu(g) * u


def make(cfg):
    torch.manual_seed(0)
    H, F2, EL = cfg["H"], 2 * cfg["F"], cfg["EL"]
    p = dict(router=torch.randn(cfg["E"], H, device=DEV, dtype=DT) * H**-0.5,
             w1=torch.randn(EL, F2, H, device=DEV, dtype=DT) * H**-0.5,
             w2=torch.randn(EL, H, cfg["F"], device=DEV, dtype=DT) * cfg["F"]**-0.5)
    if cfg["bias"]:
        p["b1"] = torch.zeros(EL, F2, device=DEV, dtype=DT)
        p["b2"] = torch.zeros(EL, H, device=DEV, dtype=DT)
    for t in p.values():
        t.requires_grad_(True)
    x = torch.randn(cfg["T"], H, device=DEV, dtype=DT, requires_grad=True)
    return p, x


def experts_loop(xs, sizes, p, cfg):
    outs = []
    for e, chunk in enumerate(xs.split(sizes)):
        h = F.linear(chunk, p["w1"][e], p["b1"][e] if cfg["bias"] else None)
        outs.append(F.linear(activation(h, cfg["act"]), p["w2"][e], p["b2"][e] if cfg["bias"] else None))
    return torch.cat(outs)


def experts_grouped(xs, sizes, p, cfg):
    # torch._grouped_mm wants each group's rows aligned: pad every expert's rows to 16
    pad = [(s + 15) // 16 * 16 for s in sizes]
    src, dst, at, row = [], [], 0, 0
    for s, q in zip(sizes, pad):
        src.append(torch.arange(row, row + s))
        dst.append(torch.arange(at, at + s))
        row, at = row + s, at + q
    src, dst = torch.cat(src).to(DEV), torch.cat(dst).to(DEV)
    xpad = xs.new_zeros(at, xs.shape[1]).index_copy(0, dst, xs)
    offs = torch.tensor(pad, device=DEV).cumsum(0).to(torch.int32)
    h = torch._grouped_mm(xpad, p["w1"].transpose(1, 2), offs=offs)
    if cfg["bias"]:
        h = h + p["b1"].repeat_interleave(torch.tensor(pad, device=DEV), dim=0)
    y = torch._grouped_mm(activation(h, cfg["act"]), p["w2"].transpose(1, 2), offs=offs)
    if cfg["bias"]:
        y = y + p["b2"].repeat_interleave(torch.tensor(pad, device=DEV), dim=0)
    return y.index_select(0, dst)


def block(x, p, cfg, impl):
    k, EL = cfg["k"], cfg["EL"]
    logits = F.linear(x, p["router"])
    probs, idx = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    local = (idx % EL).flatten()
    counts = torch.bincount(local, minlength=EL)
    order = torch.argsort(local, stable=True)
    token = order // k
    xp = x.index_select(0, token)                        # permute by expert
    chunks = torch.arange(xp.shape[0], device=DEV)
    xs = xp.index_select(0, chunks)                       # sort by local expert (a copy)
    sizes = counts.tolist()                               # the host reads the counts back
    run = experts_loop if impl == "loop" else experts_grouped
    y = run(xs, sizes, p, cfg).index_select(0, chunks)   # unsort by local expert (a copy)
    w = y * probs.flatten().index_select(0, order).unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add(0, token, w), sizes


def clear(p, x):
    for t in list(p.values()) + [x]:
        t.grad = None


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, warm=3, runs=10):
    """Median device time (CUDA events) and median host time to issue, in µs."""
    for _ in range(warm):
        fn()
    sync()
    dev, host = [], []
    for _ in range(runs):
        if DEV == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if DEV == "cuda":
            b.record()
            b.synchronize()
            dev.append(a.elapsed_time(b) * 1000)
        host.append((t1 - t0) * 1e6)
        sync()
    return (statistics.median(dev) if dev else None), statistics.median(host)


def back_to_back(fn, reps=20):
    """One call's device time, its runs queued back to back (as stepcast-bench times them)."""
    for _ in range(3):
        fn()
    sync()
    if DEV != "cuda":
        return None
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # keep the host's issuing out of the timed span
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def kernels(fn):
    """Device time per kernel name (µs), the kernel count, the GPU's busy time and the span."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    sync()
    with profile(activities=acts) as prof:
        fn()
        sync()
    by, spans = {}, []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            by[e.name] = by.get(e.name, 0.0) + e.device_time
            start = e.time_range.start
            spans.append((start, start + e.device_time))
    busy, end, first, last = 0.0, None, None, None
    for s, t in sorted(spans):
        first = s if first is None else first
        last = t if last is None else max(last, t)
        if end is None or s >= end:
            busy += t - s
            end = t
        elif t > end:
            busy += t - end
            end = t
    return {"per_kernel_us": by, "kernels": len(spans), "busy_us": busy,
            "span_us": (last - first) if spans else 0.0}


def run(cfg, impl):
    p, x = make(cfg)
    g = torch.randn_like(x)
    sizes_seen = []

    def fwd():
        clear(p, x)
        out, sizes = block(x, p, cfg, impl)
        sizes_seen[:] = sizes
        return out

    def step():
        fwd().backward(g)

    fwd_dev, fwd_host = timed(fwd)
    step_dev, step_host = timed(step)
    k_fwd, k_step = kernels(fwd), kernels(step)
    M = cfg["T"] * cfg["k"] // cfg["EL"]
    H, Fw = cfg["H"], cfg["F"]
    a = torch.randn(M, H, device=DEV, dtype=DT)
    w1 = torch.randn(2 * Fw, H, device=DEV, dtype=DT)
    h = torch.randn(M, 2 * Fw, device=DEV, dtype=DT)
    w2 = torch.randn(H, Fw, device=DEV, dtype=DT)
    act = torch.randn(M, Fw, device=DEV, dtype=DT)
    gy = torch.randn(M, H, device=DEV, dtype=DT)
    iso = {
        "up_fwd": back_to_back(lambda: a @ w1.t()),
        "up_dgrad": back_to_back(lambda: h @ w1),
        "up_wgrad": back_to_back(lambda: h.t() @ a),
        "down_fwd": back_to_back(lambda: act @ w2.t()),
        "down_dgrad": back_to_back(lambda: gy @ w2),
        "down_wgrad": back_to_back(lambda: gy.t() @ act),
    }
    line = dict(cfg, impl=impl, device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
                torch=torch.__version__, tokens_per_expert=sizes_seen,
                imbalance=max(sizes_seen) / (sum(sizes_seen) / len(sizes_seen)),
                fwd_us=fwd_dev, fwd_issue_us=fwd_host, step_us=step_dev, step_issue_us=step_host,
                profile_fwd=k_fwd, profile_step=k_step, isolated_expert_gemm_us=iso, mean_tokens=M)
    return line


def main():
    out = open(sys.argv[1], "a")
    for cfg in CONFIGS:
        for impl in ("loop", "grouped"):
            try:
                line = run(cfg, impl)
            except Exception as e:  # noqa: BLE001 - one failure must not lose the others
                line = dict(cfg, impl=impl, error=f"{type(e).__name__}: {e}"[:400])
            out.write(json.dumps(line) + "\n")
            out.flush()
            brief = {k: line.get(k) for k in ("name", "impl", "fwd_us", "step_us", "step_issue_us", "imbalance", "error")}
            print(json.dumps(brief), flush=True)
            if DEV == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
