//! Self-contained HTML pages (`predict --html`, `search --html`): the summary, the breakdown
//! chart, the simulated timeline, the memory bars and, for a search, the best configurations —
//! inline SVG and CSS only, no scripts or external files.

use std::fmt::Write;

use stepcast::memory::MemoryReport;
use stepcast::predict::Prediction;
use stepcast::schedule::record::Recorder;
use stepcast::schedule::{simulate_with, Pass, PipelineWork, Timeline};
use stepcast::search::{SearchReport, Status};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1300px}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;\
text-align:right}th{background:#f0f0f0}td.l,th.l{text-align:left}.kv td{text-align:left}\
.note{color:#666;font-size:12px}svg{display:block;margin:8px 0}";

/// Nice step for `n` ticks over `span`.
fn tick_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// The simulated step as a Gantt chart: one row per pipeline rank (passes coloured forward,
/// backward, weight gradient; the optimizer step) over a thin row of data-parallel buckets.
pub fn timeline_svg(work: &PipelineWork, t: &Timeline) -> String {
    // the prediction kept no events: simulate again, recording them
    let mut record = Recorder::default();
    if simulate_with(work, &mut record, false).is_err() {
        return String::new();
    }
    let (left, width, row, gap) = (80.0, 1100.0, 26.0, 14.0);
    let n = t.ranks.len() as f64;
    let height = 40.0 + n * (row + gap) + 40.0;
    let x = |us: f64| left + width * us / t.step_us.max(f64::MIN_POSITIVE);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="11">"#,
        w = left + width + 20.0
    );
    for (r, rank) in record.ranks.iter().enumerate() {
        let y = 30.0 + r as f64 * (row + gap);
        let _ = write!(s, r#"<text x="4" y="{}">rank {r}</text>"#, y + row * 0.65);
        let _ = write!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{width}\" height=\"{row}\" fill=\"#f4f4f4\"/>"
        );
        for run in &rank.passes {
            let color = match run.task.pass {
                Pass::Forward => "#4f81bd",
                Pass::Backward => "#9bbb59",
                Pass::WeightGrad => "#f79646",
            };
            let chunk = run.task.stage as usize / work.pp();
            let _ = write!(
                s,
                r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="{row}" fill="{color}" stroke="white" stroke-width="0.3"><title>{} (chunk {chunk}) {:.2}–{:.2} ms</title></rect>"#,
                x(run.start_us),
                (x(run.end_us) - x(run.start_us)).max(0.2),
                esc(&stepcast::schedule::trace::pass_name(
                    run.task.pass,
                    run.task.micro_batch,
                    None
                )),
                run.start_us / 1e3,
                run.end_us / 1e3
            );
        }
        if let Some((start, end)) = rank.optimizer {
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{y}\" width=\"{:.2}\" height=\"{row}\" fill=\"#c0504d\"><title>optimizer step</title></rect>",
                x(start),
                (x(end) - x(start)).max(0.5)
            );
        }
        for d in &rank.data_parallel {
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{}\" width=\"{:.2}\" height=\"5\" fill=\"#8064a2\"><title>{}</title></rect>",
                x(d.start_us),
                y + row + 2.0,
                (x(d.end_us) - x(d.start_us)).max(0.3),
                esc(&d.name)
            );
        }
    }
    let axis_y = 30.0 + n * (row + gap) + 6.0;
    let step = tick_step(t.step_us / 1e3, 10.0);
    let mut ms = 0.0;
    while ms <= t.step_us / 1e3 + 1e-9 {
        let xx = x(ms * 1e3);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"28\" x2=\"{xx:.1}\" y2=\"{axis_y}\" stroke=\"#ddd\"/><text x=\"{xx:.1}\" y=\"{}\" text-anchor=\"middle\">{ms}</text>",
            axis_y + 14.0
        );
        ms += step;
    }
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">milliseconds — forward blue, backward green, weight gradient orange, optimizer red, data-parallel buckets purple</text>",
        left + width / 2.0,
        axis_y + 30.0
    );
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"16\" font-size=\"13\">{} schedule, step {:.1} ms, bubble {:.1} % of busy time</text></svg>",
        t.schedule.name(),
        t.step_us / 1e3,
        100.0 * t.bubble_ratio()
    );
    s
}

/// Memory per rank as stacked bars against the GPU's capacity and the AT-RISK line.
pub fn memory_svg(m: &MemoryReport) -> String {
    let (left, width, row, gap) = (80.0, 900.0, 22.0, 10.0);
    let n = m.ranks.len() as f64;
    let max = m
        .ranks
        .iter()
        .map(|r| r.total_gib)
        .fold(m.capacity_gib, f64::max)
        * 1.05;
    let x = |gib: f64| left + width * gib / max;
    let height = 30.0 + n * (row + gap) + 50.0;
    let parts = [
        ("weights", "#4f81bd"),
        ("gradients", "#9bbb59"),
        ("optimizer", "#8064a2"),
        ("activations", "#f79646"),
        ("transient", "#4bacc6"),
        ("overhead", "#a5a5a5"),
    ];
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    for (i, r) in m.ranks.iter().enumerate() {
        let y = 20.0 + i as f64 * (row + gap);
        let _ = write!(
            s,
            r#"<text x="4" y="{}">rank {}</text>"#,
            y + row * 0.7,
            r.rank
        );
        let values = [
            r.weights_gib,
            r.gradients_gib,
            r.optimizer_gib,
            r.activations_gib,
            r.transient_gib,
            r.overhead_gib,
        ];
        let mut at = 0.0;
        for ((name, color), v) in parts.iter().zip(values) {
            let _ = write!(
                s,
                r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="{row}" fill="{color}"><title>{name} {v:.2} GiB</title></rect>"#,
                x(at),
                x(at + v) - x(at)
            );
            at += v;
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}">{:.1} GiB {}</text>"#,
            x(at) + 4.0,
            y + row * 0.7,
            r.total_gib,
            r.verdict.name()
        );
    }
    let bottom = 20.0 + n * (row + gap);
    for (gib, label, color) in [
        (m.capacity_gib, "capacity", "#c00000"),
        (0.9 * m.capacity_gib, "AT-RISK", "#e0a000"),
    ] {
        let _ = write!(
            s,
            "<line x1=\"{0:.1}\" y1=\"14\" x2=\"{0:.1}\" y2=\"{bottom}\" stroke=\"{color}\" stroke-dasharray=\"4 3\"/><text x=\"{0:.1}\" y=\"{1}\" text-anchor=\"middle\" fill=\"{color}\">{label} {gib:.0} GiB</text>",
            x(gib),
            bottom + 14.0
        );
    }
    let mut lx = left;
    for (name, color) in parts {
        let _ = write!(
            s,
            "<rect x=\"{lx}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            bottom + 24.0,
            lx + 14.0,
            bottom + 33.0
        );
        lx += 110.0;
    }
    s.push_str("</svg>");
    s
}

fn summary_table(p: &Prediction) -> String {
    let b = &p.breakdown_s;
    let rows = [
        ("model", format!("{} on {} ({})", p.model, p.cluster, p.gpu)),
        (
            "layout",
            format!(
                "tp {} · pp {} · dp {} = {} GPUs, micro-batch {} × {}, {} schedule{}",
                p.layout.tp,
                p.layout.pp,
                p.layout.dp,
                p.layout.world,
                p.layout.micro_batch,
                p.layout.micro_batches,
                p.schedule,
                if p.layout.vpp > 1 { format!(", vpp {}", p.layout.vpp) } else { String::new() }
            ),
        ),
        (
            "step time",
            format!(
                "{:.3} s (80 % interval {:.3} – {:.3} s)",
                p.metrics.step_time_s, p.interval_s[0], p.interval_s[1]
            ),
        ),
        (
            "throughput",
            format!(
                "{:.0} tokens/s, {:.0} per GPU; {:.1} TFLOP/s per GPU, MFU {:.1} %",
                p.metrics.tokens_per_s, p.metrics.tokens_per_s_per_gpu, p.metrics.model_tflops_per_gpu, p.metrics.mfu_percent
            ),
        ),
        (
            "breakdown",
            format!(
                "compute {:.3} s, TP {:.3}, PP {:.3}, DP {:.3}, optimizer {:.3}, bubble {:.3} s ({:.1} % of busy time)",
                b.compute, b.tp_comm, b.pp_comm, b.dp_comm, b.optimizer, b.bubble, 100.0 * p.metrics.bubble_ratio
            ),
        ),
        (
            "memory",
            format!(
                "{:.1} GiB of {:.0} GiB on rank {}: {}",
                p.memory.peak().total_gib,
                p.memory.capacity_gib,
                p.memory.peak_rank,
                p.memory.verdict.name()
            ),
        ),
    ];
    let mut s = String::from("<table class=\"kv\">");
    for (k, v) in rows {
        let _ = write!(
            s,
            "<tr><th class=\"l\">{}</th><td>{}</td></tr>",
            esc(k),
            esc(&v)
        );
    }
    s.push_str("</table>");
    s
}

fn prediction_sections(p: &Prediction, title: &str) -> anyhow::Result<String> {
    let mut s = String::new();
    s.push_str(&summary_table(p));
    s.push_str("<h2>How each pipeline rank spends the step</h2>");
    s.push_str(&super::plot::breakdown_svg(p, title)?);
    if let Some((work, timeline)) = &p.timeline {
        s.push_str("<h2>Timeline</h2>");
        s.push_str(&timeline_svg(work, timeline));
        s.push_str("<p class=\"note\">Hover a pass for its name and times; <code>--trace</code> writes the same step for Perfetto.</p>");
    }
    s.push_str("<h2>Memory per GPU</h2>");
    s.push_str(&memory_svg(&p.memory));
    Ok(s)
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head>\
         <body><h1>{t}</h1>{body}<p class=\"note\">Generated by stepcast {v}.</p></body></html>\n",
        t = esc(title),
        v = env!("CARGO_PKG_VERSION")
    )
}

pub fn prediction_page(p: &Prediction, title: &str) -> anyhow::Result<String> {
    Ok(page(title, &prediction_sections(p, title)?))
}

/// What a search page shows besides the report: its title, how many rows, and the command
/// that predicts the best layout.
pub struct SearchPage<'a> {
    pub title: String,
    pub top: usize,
    pub best_command: Option<&'a str>,
}

pub fn search_page(
    page_info: &SearchPage,
    report: &SearchReport,
    best: &Prediction,
) -> anyhow::Result<String> {
    let title = page_info.title.clone();
    let mut s = String::new();
    let _ = write!(
        s,
        "<p>{} layouts enumerated, {} pruned by the rules, {} by memory, {} predicted in {:.2} s.</p>",
        report.enumerated,
        report.pruned.values().sum::<usize>(),
        report.pruned_memory,
        report.predicted,
        report.seconds
    );
    s.push_str("<h2>Best configurations</h2><table><tr>");
    for h in [
        "#",
        "tp",
        "pp",
        "dp",
        "mb",
        "vpp",
        "schedule",
        "recompute",
        "SP",
        "ZeRO",
        "step s",
        "80 % interval",
        "tok/s/GPU",
        "MFU %",
        "memory GiB",
        "free GiB",
    ] {
        let _ = write!(s, "<th>{h}</th>");
    }
    s.push_str("</tr>");
    for (i, r) in report
        .rows
        .iter()
        .filter(|r| r.status == Status::Predicted)
        .take(page_info.top.max(1))
        .enumerate()
    {
        let interval = r
            .interval_s
            .map(|[a, b]| format!("{a:.3} – {b:.3}"))
            .unwrap_or_default();
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{:?}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{interval}</td><td>{:.0}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            i + 1,
            r.layout.tp,
            r.layout.pp,
            r.layout.dp,
            r.layout.micro_batch,
            r.layout.vpp,
            r.layout.schedule.name(),
            r.layout.recompute,
            if r.layout.sequence_parallel { "yes" } else { "no" },
            r.layout.zero,
            r.step_s().unwrap_or(f64::NAN),
            r.metrics.map(|m| m.tokens_per_s_per_gpu).unwrap_or(f64::NAN),
            r.metrics.map(|m| m.mfu_percent).unwrap_or(f64::NAN),
            r.memory_peak_gib,
            r.memory_headroom_gib
        );
    }
    s.push_str("</table>");
    if let Some(command) = page_info.best_command {
        let _ = write!(
            s,
            "<p class=\"note\">Best: <code>{}</code></p>",
            esc(command)
        );
    }
    s.push_str("<h2>Pruned</h2><table>");
    for (rule, n) in &report.pruned {
        let _ = write!(s, "<tr><td class=\"l\">{}</td><td>{n}</td></tr>", esc(rule));
    }
    let _ = write!(
        s,
        "<tr><td class=\"l\">memory (OOM or AT-RISK)</td><td>{}</td></tr></table>",
        report.pruned_memory
    );
    s.push_str("<h2>The best layout</h2>");
    s.push_str(&prediction_sections(best, &title)?);
    Ok(page(&title, &s))
}
