#!/usr/bin/env python3
"""Predicted step time of Mixtral 8x7B against router imbalance: docs/moe-imbalance.svg.

Runs `stepcast predict --json` for the busiest expert's tokens over the mean from 1.0
(balanced) to 4.0 (every token to the same 2 of 8 experts), for two layouts on 64 H100s,
and draws step time with its 80 % interval and the share of it spent in the expert
all-to-all. The model is Mixtral-8x7B-v0.1's published config.json fields.

Usage: moe-imbalance-figure.py STEPCAST OUT.svg
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = {"_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "model_type": "mixtral",
          "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
          "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
          "max_position_embeddings": 32768, "sliding_window": None, "num_local_experts": 8,
          "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False}
LAYOUTS = [("tp 2 · pp 4 · ep 8 · dp 8", ["--tp", "2", "--pp", "4", "--ep", "8", "--dp", "8",
                                          "--sequence-parallel"]),
           ("tp 1 · pp 8 · ep 8 · dp 8", ["--tp", "1", "--pp", "8", "--ep", "8", "--dp", "8"])]
IMBALANCE = [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0]
COLOURS = ["#4f81bd", "#c0504d"]


def predict(binary, config, flags, f):
    out = subprocess.run([binary, "predict", "--model", str(config), "--cluster", "dgx-h100",
                          "--nodes", "8", "--micro-batch", "1", "--global-batch", "256",
                          "--moe-imbalance", str(f), "--json", *flags],
                         capture_output=True, text=True, check=True)
    p = json.loads(out.stdout)
    return p["step_time_s"], p["interval_s"], p["breakdown_s"]["ep_comm"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, out = sys.argv[1], Path(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="stepcast-moe-") as d:
        config = Path(d) / "config.json"
        config.write_text(json.dumps(CONFIG))
        series = [(name, [predict(binary, config, flags, f) for f in IMBALANCE])
                  for name, flags in LAYOUTS]
    w, h, left, right, top, bottom = 720, 420, 70, 200, 40, 60
    ymax = max(hi for _, pts in series for _, (_, hi), _ in pts) * 1.05
    x = lambda f: left + (f - 1.0) / 3.0 * (w - left - right)  # noqa: E731
    y = lambda t: h - bottom - t / ymax * (h - top - bottom)  # noqa: E731
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
         f'font-family="sans-serif" font-size="12">',
         f'<text x="{left}" y="22" font-size="14">Mixtral 8×7B on 64 H100s, global batch 256 × '
         f'4,096: predicted step vs router imbalance</text>']
    for i in range(6):
        t = ymax * i / 5
        s.append(f'<line x1="{left}" x2="{w - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                 f'stroke="#ddd"/><text x="{left - 8}" y="{y(t) + 4:.1f}" '
                 f'text-anchor="end">{t:.1f}</text>')
    for f in [1, 1.5, 2, 2.5, 3, 3.5, 4]:
        s.append(f'<text x="{x(f):.1f}" y="{h - bottom + 18}" text-anchor="middle">{f:g}</text>')
    s.append(f'<text x="{(left + w - right) / 2}" y="{h - 18}" text-anchor="middle">busiest '
             f'expert\'s tokens / mean (1 = balanced, 4 = every token to the same 2 of 8)</text>')
    s.append(f'<text transform="rotate(-90)" x="{-(h / 2)}" y="18" text-anchor="middle">'
             f'step time, s</text>')
    for k, (name, pts) in enumerate(series):
        c = COLOURS[k]
        band = [(x(f), y(hi)) for f, (_, (_, hi), _) in zip(IMBALANCE, pts)] + \
               [(x(f), y(lo)) for f, (_, (lo, _), _) in reversed(list(zip(IMBALANCE, pts)))]
        s.append(f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in band)}" '
                 f'fill="{c}" opacity="0.15"/>')
        line = " ".join(f"{x(f):.1f},{y(t):.1f}" for f, (t, _, _) in zip(IMBALANCE, pts))
        s.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        comm = " ".join(f"{x(f):.1f},{y(e):.1f}" for f, (_, _, e) in zip(IMBALANCE, pts))
        s.append(f'<polyline points="{comm}" fill="none" stroke="{c}" stroke-dasharray="4 3"/>')
        ly = top + 20 + 40 * k
        s.append(f'<line x1="{w - right + 12}" x2="{w - right + 36}" y1="{ly}" y2="{ly}" '
                 f'stroke="{c}" stroke-width="2"/><text x="{w - right + 40}" y="{ly + 4}">'
                 f'{name}</text>')
        s.append(f'<text x="{w - right + 40}" y="{ly + 18}" fill="#555">'
                 f'{pts[0][0]:.2f} → {pts[-1][0]:.2f} s</text>')
    s.append(f'<text x="{w - right + 12}" y="{top + 110}" fill="#555">solid: step (band: 80 %'
             f'</text><text x="{w - right + 12}" y="{top + 125}" fill="#555">interval); '
             f'dashed: its</text><text x="{w - right + 12}" y="{top + 140}" fill="#555">'
             f'expert all-to-all</text>')
    s.append("</svg>")
    out.write_text("\n".join(s) + "\n")
    for name, pts in series:
        print(name + ": " + ", ".join(f"{f:g}→{t:.3f} s" for f, (t, _, _) in zip(IMBALANCE, pts)))


if __name__ == "__main__":
    main()
