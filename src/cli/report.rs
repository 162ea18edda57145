//! Self-contained HTML pages (`predict --html`, `search --html`): the summary, the breakdown
//! chart, the simulated timeline, the memory bars and, for a search, the best configurations —
//! inline SVG and CSS only, no scripts or external files.

use std::fmt::Write;

use super::chart::{self, esc};
use super::output::share;
use stepcast::predict::{IntervalMethod, Prediction};
use stepcast::search::{SearchReport, Status};

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1300px}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;\
text-align:right}th{background:#f0f0f0}td.l,th.l{text-align:left}.kv td{text-align:left}\
.note{color:#666;font-size:12px}svg{display:block;margin:8px 0}";

fn summary_table(p: &Prediction) -> String {
    let b = &p.breakdown_s;
    let rows = [
        ("model", format!("{} on {} ({})", p.model, p.cluster, p.gpu)),
        (
            "layout",
            format!(
                "tp {} · cp {} · pp {} · dp {} = {}, micro-batch {} × {}, {} schedule{}",
                p.layout.tp,
                p.layout.cp,
                p.layout.pp,
                p.layout.dp,
                super::output::count(p.layout.world, "GPU", "GPUs"),
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
                "compute {:.3} s, TP {:.3}, CP {:.3}, EP {:.3}, PP {:.3}, DP {:.3}, optimizer {:.3}, host-bound {:.3}, bubble {:.3} s ({:.1} % of busy time)",
                b.compute, b.tp_comm, b.cp_comm, b.ep_comm, b.pp_comm, b.dp_comm, b.optimizer, b.host, b.bubble, 100.0 * p.metrics.bubble_ratio
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

/// What the numbers rest on: the share of time each source produced, how the interval was
/// found, and every warning and call outside its model's training range.
fn caveats(p: &Prediction) -> String {
    let mut s = String::from("<h2>Where the numbers come from</h2><table class=\"kv\">");
    for (source, part) in &p.sources_percent {
        let _ = write!(
            s,
            "<tr><th class=\"l\">{}</th><td>{} of the summed operator time</td></tr>",
            esc(source),
            share(*part)
        );
    }
    s.push_str("</table>");
    let how = match p.interval_method {
        IntervalMethod::Recomposed => {
            "each model moved by ±1.28 of its validation spread on its own, the step composed \
             again, the moves added in quadrature"
        }
        IntervalMethod::CriticalPath => {
            "each model moved by ±1.28 of its validation spread along the step's critical path \
             (first order), the moves added in quadrature"
        }
    };
    let covers = match (
        p.interval_extrapolation_band,
        p.interval_runtime_sigma_log,
        &p.calibration,
    ) {
        (Some([low, high]), _, _) => {
            let (band_low, band_high) = stepcast::predict::EXTRAPOLATION_BAND;
            format!(
                "the operator models' errors ({how}) and, added in quadrature, ×{low:.2}–×{high:.2} \
                 of the step: the step lies outside the runs its calibration was fitted on, and \
                 published steps outside their calibration's runs took {band_low:.2}–{band_high:.2} \
                 times their prediction (the band that held 80 % of each set of them left out, on \
                 average; the fit's own spread where it is wider)"
            )
        }
        (None, Some(sigma), calibrated) => format!(
            "the operator models' errors ({how}) and, added in quadrature, {} (σ {:.1} % of \
             the step, from its mean |error|)",
            if calibrated.is_some() {
                "the calibrated runtime's cross-validated error on the runs it was fitted on"
            } else {
                "the raw physics' error on the runs its cluster was calibrated on"
            },
            100.0 * sigma
        ),
        (None, None, _) => format!(
            "the operator models' errors only ({how}); what no operator model sees — \
             framework overheads, contention, clocks — is not in it"
        ),
    };
    let _ = write!(
        s,
        "<p class=\"note\">The 80 % interval covers {covers}.</p>"
    );
    if let Some(held_out) = stepcast::hardware::held_out_summary(&p.calibration_held_out) {
        let _ = write!(
            s,
            "<p class=\"note\">It does not cover other software: {}.</p>",
            esc(&held_out)
        );
    }
    if !p.warnings.is_empty() {
        s.push_str("<h2>Warnings</h2><ul>");
        for w in &p.warnings {
            let _ = write!(s, "<li>{}</li>", esc(w));
        }
        s.push_str("</ul>");
    }
    if !p.out_of_coverage.is_empty() {
        let _ = write!(
            s,
            "<h2>Outside the training data ({} calls)</h2><ul>",
            p.out_of_coverage.len()
        );
        for o in p.out_of_coverage.iter().take(20) {
            let _ = write!(s, "<li>{}</li>", esc(o));
        }
        if p.out_of_coverage.len() > 20 {
            let _ = write!(
                s,
                "<li>and {} more (<code>predict --json</code> lists them all)</li>",
                p.out_of_coverage.len() - 20
            );
        }
        s.push_str("</ul>");
    }
    s
}

fn prediction_sections(p: &Prediction, title: &str) -> anyhow::Result<String> {
    let mut s = String::new();
    s.push_str(&summary_table(p));
    s.push_str("<h2>How each pipeline rank spends the step</h2>");
    s.push_str(&chart::breakdown(p, title));
    if let Some((work, timeline)) = &p.timeline {
        s.push_str("<h2>Timeline</h2>");
        s.push_str(&chart::timeline(work, timeline));
        s.push_str("<p class=\"note\">Hover a pass for its name and times; <code>--trace</code> writes the same step for Perfetto.</p>");
    }
    s.push_str("<h2>Memory per GPU</h2>");
    s.push_str(&chart::memory(&p.memory));
    s.push_str(&caveats(p));
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
    if let Some(f) = report.framework {
        let _ = write!(
            s,
            "<p>Only layouts {f} runs as costed (what <code>stepcast export --format {f}</code> \
             takes).</p>"
        );
    }
    s.push_str("<h2>Best configurations</h2><table><tr>");
    for h in [
        "#",
        "tp",
        "cp",
        "pp",
        "dp",
        "mb",
        "m",
        "vpp",
        "schedule",
        "recompute",
        "SP",
        "ZeRO",
        "step s",
        "80 % interval",
        "tok/s/GPU",
        "MFU %",
        "bubble %",
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
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{interval}</td><td>{:.0}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            i + 1,
            r.layout.tp,
            r.layout.cp,
            r.layout.pp,
            r.layout.dp,
            r.layout.micro_batch,
            r.layout.micro_batches,
            r.layout.vpp,
            r.layout.schedule.name(),
            r.layout.recompute,
            if r.layout.sequence_parallel { "yes" } else { "no" },
            r.layout.zero,
            r.step_s().unwrap_or(f64::NAN),
            r.metrics.map(|m| m.tokens_per_s_per_gpu).unwrap_or(f64::NAN),
            r.metrics.map(|m| m.mfu_percent).unwrap_or(f64::NAN),
            r.metrics.map(|m| 100.0 * m.bubble_ratio).unwrap_or(f64::NAN),
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
