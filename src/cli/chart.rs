//! The one drawing path: plain SVG written by hand for the `--plot` file and the HTML pages —
//! horizontal stacked bars with an axis, markers and a legend, and the simulated timeline. One
//! palette, one meaning per colour in every chart: time classes (compute shades of blue, TP
//! teal, PP purple, DP orange, optimizer red, waiting grey) and memory (greens and browns,
//! never a colour of time).

use std::fmt::Write;

use stepcast::memory::MemoryReport;
use stepcast::predict::Prediction;
use stepcast::schedule::record::Recorder;
use stepcast::schedule::{simulate_with, Pass, PipelineWork, Timeline};
use stepcast::timing::Breakdown;

/// What a step spends time on, in stacking order, with the colour every chart uses.
pub const TIME_CLASSES: [(&str, &str); 8] = [
    ("compute", "#4f81bd"),
    ("TP comm", "#2e9e8f"),
    ("CP comm", "#9bbb59"),
    ("EP comm", "#4bacc6"),
    ("PP comm", "#8064a2"),
    ("DP comm", "#f79646"),
    ("optimizer", "#c0504d"),
    ("bubble / waiting", "#d9d9d9"),
];
/// Passes of the timeline: compute, in shades of its blue.
const FORWARD: &str = "#9dc3e6";
const BACKWARD: &str = "#4f81bd";
const WEIGHT_GRAD: &str = "#1f4e79";
/// What a GPU holds, in stacking order.
const MEMORY_PARTS: [(&str, &str); 7] = [
    ("weights", "#385723"),
    ("gradients", "#70ad47"),
    ("optimizer states", "#a9d18e"),
    ("activations", "#7f6000"),
    ("transient", "#c9b27c"),
    ("optimizer step's fp32 gradients beyond those", "#8faadc"),
    ("framework and NCCL", "#d9a6a6"),
];

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A nice tick step for about `n` ticks over `span`.
fn tick_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// A vertical line across the bars with a label (capacity, AT-RISK).
pub struct Marker<'a> {
    pub at: f64,
    pub label: &'a str,
    pub colour: &'a str,
}

/// Horizontal stacked bars, one per row: `rows` of (label, value per part, text after the bar).
pub struct Bars<'a> {
    pub title: &'a str,
    pub unit: &'a str,
    pub parts: &'a [(&'a str, &'a str)],
    pub rows: Vec<(String, Vec<f64>, String)>,
    pub markers: Vec<Marker<'a>>,
}

impl Bars<'_> {
    pub fn svg(&self) -> String {
        // room for labels left, the value after the longest bar right, markers above and below
        let (left, width, right, row, gap) = (90.0, 760.0, 190.0, 22.0, 10.0);
        let top = 58.0;
        let n = self.rows.len() as f64;
        let longest = self
            .rows
            .iter()
            .map(|r| r.1.iter().sum::<f64>())
            .chain(self.markers.iter().map(|m| m.at))
            .fold(f64::MIN_POSITIVE, f64::max);
        let x = |v: f64| left + width * v / longest;
        let bottom = top + n * (row + gap);
        let legend_rows = self.parts.len().div_ceil(4) as f64;
        let height = bottom + 42.0 + 18.0 * legend_rows;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>"#,
            left + width + right
        );
        let _ = write!(
            s,
            r#"<text x="4" y="16" font-size="13">{}</text>"#,
            esc(self.title)
        );
        let step = tick_step(longest, 8.0);
        let mut v = 0.0;
        while v <= longest * 1.0001 {
            let xx = x(v);
            let _ = write!(
                s,
                "<line x1=\"{xx:.1}\" y1=\"{}\" x2=\"{xx:.1}\" y2=\"{bottom}\" stroke=\"#eee\"/><text x=\"{xx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
                top - 6.0,
                bottom + 12.0,
                stepcast::limits::readable((v * 1e6).round() / 1e6)
            );
            v += step;
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            left + width / 2.0,
            bottom + 25.0,
            esc(self.unit)
        );
        for (i, (label, values, after)) in self.rows.iter().enumerate() {
            let y = top + i as f64 * (row + gap);
            let _ = write!(
                s,
                r#"<text x="4" y="{:.1}">{}</text>"#,
                y + row * 0.7,
                esc(label)
            );
            let mut at = 0.0;
            for ((name, colour), v) in self.parts.iter().zip(values) {
                if *v > 0.0 {
                    let _ = write!(
                        s,
                        r#"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{row}" fill="{colour}"><title>{} {:.3} {}</title></rect>"#,
                        x(at),
                        (x(at + v) - x(at)).max(0.3),
                        esc(name),
                        v,
                        esc(self.unit)
                    );
                }
                at += v;
            }
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x(at).min(left + width) + 4.0,
                y + row * 0.7,
                esc(after)
            );
        }
        // markers: labels alternate above and below so that close ones do not overlap
        for (k, m) in self.markers.iter().enumerate() {
            let xx = x(m.at);
            let label_y = if k % 2 == 0 {
                top - 20.0
            } else {
                bottom + 38.0
            };
            let _ = write!(
                s,
                "<line x1=\"{xx:.1}\" y1=\"{}\" x2=\"{xx:.1}\" y2=\"{bottom}\" stroke=\"{}\" stroke-dasharray=\"4 3\"/><text x=\"{xx:.1}\" y=\"{label_y}\" text-anchor=\"middle\" fill=\"{}\">{}</text>",
                top - 14.0,
                m.colour,
                m.colour,
                esc(m.label)
            );
        }
        let legend_y = bottom + 48.0 + if self.markers.len() > 1 { 6.0 } else { 0.0 };
        for (k, (name, colour)) in self.parts.iter().enumerate() {
            let (lx, ly) = (
                left + (k % 4) as f64 * 180.0,
                legend_y + (k / 4) as f64 * 18.0,
            );
            let _ = write!(
                s,
                "<rect x=\"{lx}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"{ly}\">{}</text>",
                ly - 9.0,
                lx + 14.0,
                esc(name)
            );
        }
        s.push_str("</svg>");
        s
    }
}

fn classes(b: &Breakdown) -> Vec<f64> {
    vec![
        b.compute,
        b.tp_comm,
        b.cp_comm,
        b.ep_comm,
        b.pp_comm,
        b.dp_comm,
        b.optimizer,
        b.bubble,
    ]
}

/// How each pipeline rank spends the step (ms), or the step's breakdown for the closed form.
pub fn breakdown(p: &Prediction, title: &str) -> String {
    let rows: Vec<(String, Vec<f64>, String)> = match &p.timeline {
        None => vec![(
            "step".to_string(),
            classes(&p.breakdown_s.scaled(1e3)),
            format!("{:.1} ms", p.metrics.step_time_s * 1e3),
        )],
        Some((_, t)) => t
            .ranks
            .iter()
            .enumerate()
            .map(|(r, rank)| {
                let mut b = rank.spent;
                // waiting for the slowest rank, then this rank's optimizer and all-gather, then
                // waiting for the step's end
                b.bubble += t.barrier_us - rank.sync_end_us;
                let [start, mut end] = rank.optimizer_us;
                b.optimizer += end - start;
                if let Some([from, to]) = rank.param_gather_us {
                    b.dp_comm += to - from;
                    end = end.max(to);
                }
                b.bubble += t.step_us - end;
                let note = if r == t.critical_rank {
                    "critical rank".to_string()
                } else {
                    String::new()
                };
                (format!("rank {r}"), classes(&b.scaled(1e-3)), note)
            })
            .collect(),
    };
    let heading = format!(
        "{title} — {} schedule, step {:.3} s, bubble {:.1} % of busy time",
        p.schedule,
        p.metrics.step_time_s,
        100.0 * p.metrics.bubble_ratio
    );
    Bars {
        title: &heading,
        unit: "milliseconds",
        parts: &TIME_CLASSES,
        rows,
        markers: Vec::new(),
    }
    .svg()
}

/// Memory per rank as stacked bars against the GPU's capacity and the AT-RISK line.
pub fn memory(m: &MemoryReport) -> String {
    let capacity = format!("capacity {:.0} GiB", m.capacity_gib);
    let at_risk = format!("AT-RISK above {:.0} GiB", 0.9 * m.capacity_gib);
    Bars {
        title: "What each GPU holds at its peak",
        unit: "GiB",
        parts: &MEMORY_PARTS,
        rows: m
            .ranks
            .iter()
            .map(|r| {
                (
                    format!("rank {}", r.rank),
                    vec![
                        r.weights_gib,
                        r.gradients_gib,
                        r.optimizer_gib,
                        r.activations_gib,
                        r.transient_gib,
                        // the step's copies replace the freed activations: the bar shows what
                        // they need beyond them, so that it stacks to the total
                        (r.step_gradients_gib - r.activations_gib - r.transient_gib).max(0.0),
                        r.overhead_gib,
                    ],
                    format!("{:.1} GiB {}", r.total_gib, r.verdict.name()),
                )
            })
            .collect(),
        markers: vec![
            Marker {
                at: m.capacity_gib,
                label: &capacity,
                colour: "#c00000",
            },
            Marker {
                at: 0.9 * m.capacity_gib,
                label: &at_risk,
                colour: "#b07d00",
            },
        ],
    }
    .svg()
}

/// The simulated step as a Gantt chart: one row per pipeline rank — forward, backward and
/// weight-gradient passes in the shades of compute's blue, the optimizer step red — over a thin
/// row of data-parallel buckets (orange) and pipeline sends (purple).
pub fn timeline(work: &PipelineWork, t: &Timeline) -> String {
    // the prediction kept no events: simulate again, recording them
    let mut record = Recorder::default();
    if simulate_with(work, &mut record, false).is_err() {
        return String::new();
    }
    let (left, width, row, gap) = (80.0, 1100.0, 26.0, 16.0);
    let n = t.ranks.len() as f64;
    let height = 40.0 + n * (row + gap) + 56.0;
    let x = |us: f64| left + width * us / t.step_us.max(f64::MIN_POSITIVE);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>"#,
        w = left + width + 20.0
    );
    let strip = |s: &mut String,
                 y: f64,
                 spans: &[stepcast::schedule::record::StreamSpan],
                 colour: &str| {
        for d in spans {
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"4\" fill=\"{colour}\"><title>{}</title></rect>",
                x(d.start_us),
                (x(d.end_us) - x(d.start_us)).max(0.3),
                esc(&d.name)
            );
        }
    };
    for r in 0..record.ranks.len() {
        let y = 30.0 + r as f64 * (row + gap);
        let _ = write!(s, r#"<text x="4" y="{}">rank {r}</text>"#, y + row * 0.65);
        let _ = write!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{width}\" height=\"{row}\" fill=\"#f4f4f4\"/>"
        );
    }
    // the grid under the passes
    let axis_y = 30.0 + n * (row + gap) + 4.0;
    let step = tick_step(t.step_us / 1e3, 10.0);
    let mut ms = 0.0;
    while ms <= t.step_us / 1e3 + 1e-9 {
        let xx = x(ms * 1e3);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"28\" x2=\"{xx:.1}\" y2=\"{axis_y}\" stroke=\"#ddd\"/><text x=\"{xx:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            axis_y + 14.0,
            stepcast::limits::readable((ms * 1e6).round() / 1e6)
        );
        ms += step;
    }
    for (r, rank) in record.ranks.iter().enumerate() {
        let y = 30.0 + r as f64 * (row + gap);
        for run in &rank.passes {
            let colour = match run.task.pass {
                Pass::Forward => FORWARD,
                Pass::Backward => BACKWARD,
                Pass::WeightGrad => WEIGHT_GRAD,
            };
            let chunk = run.task.stage as usize / work.pp();
            let _ = write!(
                s,
                r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="{row}" fill="{colour}" stroke="white" stroke-width="0.3"><title>{} (chunk {chunk}) {:.2}–{:.2} ms</title></rect>"#,
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
                "<rect x=\"{:.2}\" y=\"{y}\" width=\"{:.2}\" height=\"{row}\" fill=\"{}\"><title>optimizer step</title></rect>",
                x(start),
                (x(end) - x(start)).max(0.5),
                TIME_CLASSES[6].1
            );
        }
        strip(
            &mut s,
            y + row + 2.0,
            &rank.data_parallel,
            TIME_CLASSES[5].1,
        );
        strip(&mut s, y + row + 7.0, &rank.sends, TIME_CLASSES[4].1);
    }
    let legend = [
        ("forward", FORWARD),
        ("backward", BACKWARD),
        ("weight gradient", WEIGHT_GRAD),
        ("optimizer", TIME_CLASSES[6].1),
        ("data-parallel buckets", TIME_CLASSES[5].1),
        ("pipeline sends", TIME_CLASSES[4].1),
    ];
    for (k, (name, colour)) in legend.iter().enumerate() {
        let lx = left + k as f64 * 170.0;
        let ly = axis_y + 34.0;
        let _ = write!(
            s,
            "<rect x=\"{lx}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"{ly}\">{name}</text>",
            ly - 9.0,
            lx + 14.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"16\" font-size=\"13\">{} schedule, step {:.1} ms, bubble {:.1} % of busy time (milliseconds)</text></svg>",
        t.schedule.name(),
        t.step_us / 1e3,
        100.0 * t.bubble_ratio()
    );
    s
}
