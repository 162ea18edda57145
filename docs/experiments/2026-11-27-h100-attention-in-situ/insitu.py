"""In-situ vs isolated attention on one GPU: a stack of MPT-like blocks (LayerNorm, QKV, causal
SDPA on one backend, out-proj, GELU MLP; bf16 autocast over fp32 weights, as Composer's amp_bf16)
runs forward + backward; torch.profiler sums each kernel class's device time inside the step, and
the same attention call is then timed alone (CUDA events, sorted median). Prints JSON lines."""
import json, statistics, sys
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, ProfilerActivity

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


class Block(nn.Module):
    def __init__(s, h, heads, backend):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(h, bias=False), nn.LayerNorm(h, bias=False)
        s.qkv, s.o = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
        s.up, s.down = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)
        s.heads, s.backend = heads, backend

    def forward(s, x):
        b, t, h = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, s.heads, h // s.heads).permute(2, 0, 3, 1, 4)
        with sdpa_kernel([BACKENDS[s.backend]]):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(b, t, h))
        return x + s.down(F.gelu(s.up(s.ln2(x)), approximate="tanh"))


def events(fn, warm=3, timed=7):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(timed):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b) * 1000)
    return statistics.median(out)


def classify(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "cudnn" in n and "attn" in n or "sdpa" in n:
        return "attention_bwd" if "bwd" in n or "backward" in n or "dq" in n or "dkdv" in n or "dot_do_o" in n or "bprop" in n else "attention_fwd"
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "sm90_xmma" in n or "cublas" in n:
        return "gemm"
    return "other"


def run(h, heads, layers, mb, seq, backend):
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(h, heads, backend) for _ in range(layers)]).cuda()
    x = torch.randn(mb, seq, h, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        y.float().square().mean().backward()
    step_us = events(step)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    by = {}
    names = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            c = classify(e.name)
            by[c] = by.get(c, 0.0) + e.device_time
            if c.startswith("attention"):
                names[e.name[:80]] = names.get(e.name[:80], 0.0) + e.device_time
    hd = h // heads
    q, k, v = (torch.randn(mb, heads, seq, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel([BACKENDS[backend]]):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with torch.no_grad():
            iso_fwd = events(fwd)
        out = fwd(); g = torch.randn_like(out)
        iso_bwd = events(lambda: torch.autograd.grad(out, [q, k, v], g, retain_graph=True))
    flops_fwd = 4 * mb * heads * seq * seq * hd / 2
    print(json.dumps({"h": h, "heads": heads, "layers": layers, "mb": mb, "seq": seq, "backend": backend,
                      "step_us": step_us, "kernel_us": {k: v for k, v in by.items()},
                      "attn_kernels": names,
                      "insitu_attn_fwd_us_per_layer": by.get("attention_fwd", 0) / layers,
                      "insitu_attn_bwd_us_per_layer": by.get("attention_bwd", 0) / layers,
                      "isolated_fwd_us": iso_fwd, "isolated_bwd_us": iso_bwd,
                      "isolated_fwd_tflops": flops_fwd / iso_fwd / 1e6, "isolated_bwd_tflops": 2.5 * flops_fwd / iso_bwd / 1e6}), flush=True)
    del model, x, q, k, v


if __name__ == "__main__":
    for cfg in [(4096, 32, 4, 4, 2048), (4096, 32, 4, 1, 8192), (4096, 32, 2, 1, 32768), (2048, 16, 4, 8, 2048),
                (2048, 16, 4, 1, 16384), (1536, 12, 4, 1, 65536)]:
        for backend in ("flash", "cudnn"):
            try:
                run(*cfg, backend)
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"cfg": cfg, "backend": backend, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
            torch.cuda.empty_cache()
