#!/usr/bin/env python3
"""stepcast-bench's PyTorch backend: times the operators a PyTorch/Megatron training step runs
through PyTorch's own kernels (FlashAttention / cuDNN / memory-efficient SDPA, the unfused
attention path, LayerNorm, RMSNorm, GELU, SwiGLU, residual add, RoPE, embedding, cross-entropy,
the fused AdamW step, and GEMMs when asked), on the node's own PyTorch.

stepcast-bench writes a JSON request on stdin:
  {"protocol": {"warmup": 10, "timed": 10, "keep": 5}, "device": 0, "saturate_ms": 300,
   "attention_backend": "auto", "points": [{"id": 0, "op": "flash_attention", "phase": "fwd",
   "dtype": "bf16", "shape": {"batch": 4, ...}}, ...]}
and reads JSON lines from stdout: first {"versions": {...}}, then one line per point as it is
measured, {"id": 0, "samples_us": [...], "backend": "flash", "telemetry": "..."} or
{"id": 0, "skip": "reason"}. Raw samples only: stepcast computes the sorted-median summary.
Each forward and backward is bracketed by CUDA events, the timed runs of a point queued back to
back behind one GPU spin so the host's dispatch is not timed and the GPU does not idle between
them; inputs rotate where one set would sit in L2. `--self-test` checks the request handling without a GPU or PyTorch.
"""
import json
import math
import sys
import time

L2_BYTES = 64 << 20  # rotate inputs smaller than twice the largest L2 (H100: 50 MB)


def shape_elems(shape):
    n = 1
    for v in shape.values():
        n *= max(int(v), 1)
    return n


def copies_for(bytes_per_set):
    """How many input sets to rotate so that a set is out of L2 when it is reused."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(16, math.ceil(2 * L2_BYTES / bytes_per_set)))


class Bench:
    def __init__(self, torch, device, dtype_name, cover):
        self.torch = torch
        self.device = device
        self.cover = cover
        self.fp8 = dtype_name == "fp8"
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                      "fp8": torch.bfloat16}[dtype_name]

    def rand(self, *shape, grad=False):
        t = self.torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.1
        return t.requires_grad_(grad)

    def timed(self, fn, protocol):
        """The timed runs queued back to back behind one GPU spin, an event between each two:
        the spin covers Python's dispatch of all of them, and the GPU runs them without a gap,
        at the clocks of a busy GPU (a spin before each run lets the clock recover in between:
        on an H100, GEMMs of over 1 ms timed 1.3 % faster that way)."""
        torch = self.torch
        for _ in range(protocol["warmup"]):
            fn()
        n = protocol["timed"]
        spin = getattr(torch.cuda, "_sleep", None)
        if spin is None:  # no spin: each run alone, Python's dispatch in its time
            samples = []
            for _ in range(n):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000.0)
            return samples
        for _ in range(Cover.TRIES):
            ahead = torch.cuda.Event(enable_timing=True)
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            queued = time.perf_counter()
            ahead.record()
            spin(self.cover.cycles)
            marks[0].record()
            for mark in marks[1:]:
                fn()
                mark.record()
            host_us = (time.perf_counter() - queued) * 1e6
            marks[-1].synchronize()
            if self.cover.covered(host_us, ahead.elapsed_time(marks[0]) * 1000.0):
                return [a.elapsed_time(b) * 1000.0 for a, b in zip(marks, marks[1:])]
        raise RuntimeError(f"the host took longer than a {self.cover.cycles}-cycle GPU spin to "
                           f"queue {n} runs of this call {Cover.TRIES} times")


class Cover:
    """How long the spin ahead of the timed runs lasts. Runs whose dispatch took longer than 80 %
    of the spin (measured on the GPU, between an event before it and the first run's start
    event) may include host time: they are run again with a longer spin, which later points
    keep."""
    START_CYCLES = 1_000_000  # 0.5 ms at 2 GHz
    MAX_CYCLES = 100_000_000  # 50 ms at 2 GHz: a host slower than that is broken, not slow
    TRIES = 4

    def __init__(self):
        self.cycles = self.START_CYCLES

    def covered(self, host_us, spin_us):
        if host_us * 5 < spin_us * 4:
            return True
        grow = 2.0 * host_us / spin_us if spin_us > 0 else 2.0
        self.cycles = min(int(self.cycles * max(2.0, grow)), self.MAX_CYCLES)
        return False


def build(bench, op, phase, shape, attention_backend):
    """Returns (callable timed once per run, backend label)."""
    torch = bench.torch
    F = torch.nn.functional
    s = shape
    label = "torch"

    def rotating(make_inputs, per_set_bytes, forward):
        sets = [make_inputs() for _ in range(copies_for(per_set_bytes))]
        if phase == "fwd":
            state = {"i": 0}

            def run():
                state["i"] = (state["i"] + 1) % len(sets)
                with torch.no_grad():
                    forward(*sets[state["i"]])
            return run
        outs = []
        for inputs in sets:
            out = forward(*inputs)
            outs.append((out, torch.randn_like(out), [t for t in inputs if t.requires_grad]))
        state = {"i": 0}

        def run():
            state["i"] = (state["i"] + 1) % len(outs)
            out, grad, leaves = outs[state["i"]]
            torch.autograd.grad(out, leaves, grad, retain_graph=True)
        return run

    esize = torch.tensor([], dtype=bench.dtype).element_size()
    if op == "flash_attention":
        b, sq, skv, h, kv, hd = s["batch"], s["seq_q"], s["seq_kv"], s["heads"], s["kv_heads"], s["head_dim"]
        causal = bool(s["causal"])
        from torch.nn.attention import SDPBackend, sdpa_kernel
        order = {"flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION],
                 "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                 "auto": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]}[attention_backend]
        last_error = None
        for backend in order:
            def make():
                return (bench.rand(b, h, sq, hd, grad=True), bench.rand(b, kv, skv, hd, grad=True),
                        bench.rand(b, kv, skv, hd, grad=True))

            def forward(q, k, v, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv != h)
            try:
                run = rotating(make, (2 * b * h * sq + 2 * b * kv * skv) * hd * esize, forward)
                run()
                torch.cuda.synchronize()
                return run, backend.name.lower()
            except RuntimeError as e:  # this backend does not support the shape or type
                last_error = e
        raise RuntimeError(f"no attention backend ran: {last_error}")
    if op in ("softmax", "scale_mask_softmax", "fill_mask"):
        b, sq, skv, h = s["batch"], s["seq_q"], s["seq_kv"], s["heads"]
        mask = torch.ones(sq, skv, device=bench.device, dtype=torch.bool).triu(1)
        scale = 1.0 / math.sqrt(128)

        def forward(x):
            if op == "softmax":
                return torch.softmax(x, dim=-1)
            if op == "fill_mask":
                return x.masked_fill(mask, -10000.0)
            return torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1)
        return rotating(lambda: (bench.rand(b, h, sq, skv, grad=True),), b * h * sq * skv * esize, forward), label
    if op in ("layernorm", "rmsnorm", "gelu", "swiglu", "residual_add", "elementwise", "rope", "cross_entropy"):
        t, w = s["batch"] * s["seq"], s["width"]
        if op == "layernorm":
            weight, bias = bench.rand(w, grad=True), bench.rand(w, grad=True)
            fwd = lambda x: F.layer_norm(x, (w,), weight, bias)  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True),)  # noqa: E731
        elif op == "rmsnorm":
            weight = bench.rand(w, grad=True)
            if hasattr(F, "rms_norm"):
                fwd = lambda x: F.rms_norm(x, (w,), weight)  # noqa: E731
            else:
                fwd = lambda x: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * weight  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True),)  # noqa: E731
        elif op == "gelu":
            fwd = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True),)  # noqa: E731
        elif op == "swiglu":
            def fwd(x):
                a, g = x.chunk(2, dim=-1)
                return F.silu(a) * g
            make = lambda: (bench.rand(t, 2 * w, grad=True),)  # noqa: E731
        elif op == "residual_add":
            fwd = lambda x, y: x + y  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True), bench.rand(t, w, grad=True))  # noqa: E731
        elif op == "elementwise":
            # one read and one write of the tensor: a scale, as copies and casts stream
            fwd = lambda x: x * 0.5  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True),)  # noqa: E731
        elif op == "rope":
            half = max(w // 2, 1)
            cos, sin = bench.rand(t, half), bench.rand(t, half)

            def fwd(x):
                x1, x2 = x[..., :half], x[..., half:2 * half]
                return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
            make = lambda: (bench.rand(t, 2 * half, grad=True),)  # noqa: E731
        else:  # cross_entropy over a vocabulary shard
            targets = torch.randint(0, w, (t,), device=bench.device)
            fwd = lambda x: F.cross_entropy(x, targets)  # noqa: E731
            make = lambda: (bench.rand(t, w, grad=True),)  # noqa: E731
        per_set = t * w * esize * (2 if op in ("swiglu", "residual_add") else 1)
        return rotating(make, per_set, fwd), label
    if op == "embedding":
        t, hidden, vocab = s["batch"] * s["seq"], s["hidden"], s["vocab"]
        table = bench.rand(vocab, hidden, grad=True)
        fwd = lambda ids: F.embedding(ids, table)  # noqa: E731
        make = lambda: (torch.randint(0, vocab, (t,), device=bench.device),)  # noqa: E731
        if phase == "fwd":
            return rotating(make, t * hidden * esize, fwd), label
        out = fwd(make()[0])
        grad = torch.randn_like(out)
        return (lambda: torch.autograd.grad(out, [table], grad, retain_graph=True)), label
    if op == "gemm":
        if bench.fp8:
            raise RuntimeError("fp8 GEMMs need the cuBLASLt backend (stepcast-bench built with cuda)")
        m, n, k, batch = s["m"], s["n"], s["k"], s["batch"]

        def make():
            return (bench.rand(batch, m, k, grad=True), bench.rand(batch, k, n, grad=True))
        return rotating(make, batch * (m * k + k * n) * esize, torch.bmm), "torch.bmm"
    if op == "optimizer_step":
        params, tensors = s["params"], max(s["tensors"], 1)
        sizes = [params // tensors + (1 if i < params % tensors else 0) for i in range(tensors)]
        ps = [torch.zeros(max(n, 1), device=bench.device, dtype=torch.float32, requires_grad=True) for n in sizes]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(ps, lr=1e-4, fused=True)
        return opt.step, "AdamW(fused)"
    raise RuntimeError(f"operator {op} is not timed by the PyTorch backend")


def telemetry(torch):
    try:
        return f"sm {torch.cuda.clock_rate()} MHz, {torch.cuda.temperature()} °C, {torch.cuda.power_draw() / 1000:.0f} W"
    except Exception:  # pynvml missing or no NVML
        return ""


def saturate(torch, device, ms):
    if ms <= 0:
        return
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    end = time.time() + ms / 1000.0
    while time.time() < end:
        a @ a
    torch.cuda.synchronize()


def serve(request, out):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"PyTorch is not importable: {e}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device", file=sys.stderr)
        return 3
    device = torch.device("cuda", request.get("device", 0))
    torch.cuda.set_device(device)
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": str(torch.backends.cudnn.version()), "gpu": torch.cuda.get_device_name(device)}
    out.write(json.dumps({"versions": versions}) + "\n")
    out.flush()
    protocol = request["protocol"]
    if getattr(torch.cuda, "_sleep", None) is None:
        print("warning: this PyTorch has no torch.cuda._sleep: runs are timed without a spin ahead, "
              "and a small call's time includes Python's dispatch", file=sys.stderr)
    cover = Cover()
    last_op = None
    for point in request["points"]:
        if point["op"] != last_op:
            saturate(torch, device, request.get("saturate_ms", 0))
            last_op = point["op"]
        line = {"id": point["id"]}
        try:
            bench = Bench(torch, device, point["dtype"], cover)
            run, backend = build(bench, point["op"], point["phase"], point["shape"],
                                 request.get("attention_backend", "auto"))
            before = telemetry(torch)
            line["samples_us"] = bench.timed(run, protocol)
            line["backend"] = backend
            line["telemetry"] = f"{before} → {telemetry(torch)}" if before else ""
        except torch.cuda.OutOfMemoryError:
            line["skip"] = "out of memory"
        except Exception as e:  # noqa: BLE001 — every failure is recorded, collection goes on
            line["skip"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        finally:
            torch.cuda.empty_cache()
        out.write(json.dumps(line) + "\n")
        out.flush()
    return 0


def self_test():
    assert copies_for(1 << 20) == 16
    assert copies_for(1 << 30) == 1
    assert shape_elems({"batch": 2, "seq": 3, "width": 4}) == 24
    cover = Cover()
    assert cover.covered(host_us=100.0, spin_us=500.0)
    assert cover.cycles == Cover.START_CYCLES
    assert not cover.covered(host_us=450.0, spin_us=500.0)  # too close to the spin's end
    assert cover.cycles == 2 * Cover.START_CYCLES
    assert not cover.covered(host_us=5000.0, spin_us=1000.0)
    assert cover.cycles == 20 * Cover.START_CYCLES
    for _ in range(3):
        assert not cover.covered(host_us=1e9, spin_us=0.0)
    assert cover.cycles == Cover.MAX_CYCLES
    # the timed runs back to back behind the spin, on a fake GPU whose clock the calls advance
    class Clock:
        ms = 0.0

    class Event:
        def __init__(self, enable_timing=True):
            self.at = None

        def record(self):
            self.at = Clock.ms

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    class Cuda:
        @staticmethod
        def _sleep(cycles):
            Clock.ms += cycles / 2e6  # 2 GHz

    class Torch:
        cuda = Cuda

    Cuda.Event = Event

    calls = []

    def call():
        calls.append(1)
        Clock.ms += 0.25

    bench = Bench.__new__(Bench)
    bench.torch, bench.cover = Torch, Cover()
    samples = bench.timed(call, {"warmup": 3, "timed": 4, "keep": 2})
    assert len(calls) == 7 and len(samples) == 4, (calls, samples)
    assert all(abs(t - 250.0) < 1e-6 for t in samples), samples
    request = {"protocol": {"warmup": 1, "timed": 2, "keep": 1}, "points": []}
    json.dumps(request)
    print("bench_torch.py self-test passed")
    return 0


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        sys.exit(self_test())
    sys.exit(serve(json.load(sys.stdin), sys.stdout))
