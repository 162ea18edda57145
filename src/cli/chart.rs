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
pub const TIME_CLASSES: [(&str, &str); 9] = [
    ("compute", "#4f81bd"),
    ("TP comm", "#2e9e8f"),
    ("CP comm", "#9bbb59"),
    ("EP comm", "#4bacc6"),
    ("PP comm", "#8064a2"),
    ("DP comm", "#f79646"),
    ("optimizer", "#c0504d"),
    ("host-bound", "#ffc000"),
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
    [1.0, 2.0, 5.0]
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
        b.host,
        b.bubble,
    ]
}

/// How each pipeline rank spends the step (ms), or the step's breakdown for the closed form.
pub fn breakdown(p: &Prediction, title: &str) -> String {
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
        rows: breakdown_rows(p),
        markers: Vec::new(),
    }
    .svg()
}

/// One bar per pipeline rank (ms per time class, stacking to the step) or one for the step.
fn breakdown_rows(p: &Prediction) -> Vec<(String, Vec<f64>, String)> {
    match &p.timeline {
        None => vec![(
            "step".to_string(),
            classes(&p.breakdown_s.scaled(1e3)),
            format!("{:.1} ms", p.metrics.step_time_s * 1e3),
        )],
        Some((work, t)) => (0..t.ranks.len())
            .map(|r| {
                let b = t.rank_breakdown(work, r);
                let note = if r == t.critical_rank {
                    "critical rank".to_string()
                } else {
                    String::new()
                };
                (format!("rank {r}"), classes(&b.scaled(1e-3)), note)
            })
            .collect(),
    }
}

/// Memory per rank as stacked bars against the GPU's capacity and the AT-RISK line.
pub fn memory(m: &MemoryReport) -> String {
    let capacity = format!("capacity {:.0} GiB", m.capacity_gib);
    let at_risk = format!("AT-RISK above {:.0} GiB", 0.9 * m.capacity_gib);
    Bars {
        title: "What each GPU holds at its peak",
        unit: "GiB",
        parts: &MEMORY_PARTS,
        rows: memory_rows(m),
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

/// One bar per pipeline rank: GiB per part of `MEMORY_PARTS`, stacking to the rank's total.
fn memory_rows(m: &MemoryReport) -> Vec<(String, Vec<f64>, String)> {
    m.ranks
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
        .collect()
}

/// The simulated step as a Gantt chart: one row per pipeline rank — forward, backward and
/// weight-gradient passes in the shades of compute's blue, the optimizer step red, the training
/// loop's host work closing the step gold — over a thin row of data-parallel buckets (orange)
/// and pipeline sends (purple).
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
        // the step's closing phases: this rank's optimizer, then the loop's host work
        let closing = [
            (rank.optimizer, TIME_CLASSES[6].1, "optimizer step"),
            (
                record.step_overhead,
                TIME_CLASSES[7].1,
                "the training loop's host work",
            ),
        ];
        for (span, colour, what) in closing {
            if let Some((start, end)) = span {
                let _ = write!(
                    s,
                    "<rect x=\"{:.2}\" y=\"{y}\" width=\"{:.2}\" height=\"{row}\" fill=\"{colour}\"><title>{what}</title></rect>",
                    x(start),
                    (x(end) - x(start)).max(0.5),
                );
            }
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
        ("host work", TIME_CLASSES[7].1),
        ("data-parallel buckets", TIME_CLASSES[5].1),
        ("pipeline sends", TIME_CLASSES[4].1),
    ];
    for (k, (name, colour)) in legend.iter().enumerate() {
        let lx = left + k as f64 * 150.0;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::test_support::spec;
    use std::collections::HashMap;
    use stepcast::workload::{ParallelSpec, Schedule};

    /// Every `<tag …>` element of `svg` as its attributes.
    fn elements(svg: &str, tag: &str) -> Vec<HashMap<String, String>> {
        svg.split(&format!("<{tag} "))
            .skip(1)
            .map(|rest| {
                let head = &rest[..rest.find('>').expect("a closed tag")];
                head.split("\" ")
                    .filter_map(|pair| pair.split_once("=\""))
                    .map(|(k, v)| (k.trim().to_string(), v.trim_end_matches(['"', '/']).into()))
                    .collect()
            })
            .collect()
    }

    fn num(e: &HashMap<String, String>, attribute: &str) -> f64 {
        e[attribute].parse().expect("a number")
    }

    /// A prediction of `model` on the DGX H100 file without trained models (roofline and
    /// analytic estimates: the charts draw whatever the composition gives).
    fn predicted(model: &str, tp: u64, pp: u64, dp: u64, schedule: Schedule) -> Prediction {
        predicted_with(model, spec(tp, pp, dp, schedule))
    }

    fn predicted_with(model: &str, spec: ParallelSpec) -> Prediction {
        crate::cli::test_support::predicted(model, spec).2
    }

    #[test]
    fn ticks_step_by_one_two_or_five_times_a_power_of_ten() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
        assert!(close(tick_step(4.0, 8.0), 0.5));
        assert!(close(tick_step(10.0, 8.0), 2.0));
        assert!(close(tick_step(45.0, 10.0), 5.0));
        assert!(close(tick_step(100.0, 10.0), 10.0));
        assert!(close(tick_step(95.0, 10.0), 10.0));
        assert!(close(tick_step(0.7, 10.0), 0.1));
        assert!(close(tick_step(3.0e4, 8.0), 5.0e3));
        // an empty chart still steps forward
        assert!(tick_step(0.0, 8.0) > 0.0);
    }

    #[test]
    fn text_is_escaped_for_svg() {
        assert_eq!(esc(r#"a<b & "c">"#), "a&lt;b &amp; &quot;c&quot;&gt;");
        assert_eq!(esc("&lt;"), "&amp;lt;");
    }

    /// Two rows of parts 1 + 2 and 3 against markers at 4 and 3.6: the longest is the first
    /// marker, so a unit is 760 / 4 = 190 pixels from the labels' 90.
    #[test]
    fn bars_are_drawn_to_scale_with_markers_ticks_and_legend() {
        let parts = [
            ("a", "#111111"),
            ("b", "#222222"),
            ("c", "#333333"),
            ("d", "#444444"),
            ("e", "#555555"),
        ];
        let svg = Bars {
            title: "GPU <1>",
            unit: "GiB",
            parts: &parts,
            rows: vec![
                ("r0".into(), vec![1.0, 2.0, 0.0, 0.0, 0.0], "3 GiB".into()),
                ("r1".into(), vec![0.0, 0.0, 3.0, 0.0, 0.0], "x".into()),
            ],
            markers: vec![
                Marker {
                    at: 4.0,
                    label: "cap",
                    colour: "#c00000",
                },
                Marker {
                    at: 3.6,
                    label: "risk",
                    colour: "#b07d00",
                },
            ],
        }
        .svg();
        let root = &elements(&svg, "svg")[0];
        // rows end at 58 + 2 × 32; the legend's two rows below
        assert_eq!((num(root, "width"), num(root, "height")), (1040.0, 200.0));
        assert!(svg.contains(">GPU &lt;1&gt;</text>"));
        let bars: Vec<(f64, f64, f64, String)> = elements(&svg, "rect")
            .iter()
            .filter(|r| r.get("height").map(String::as_str) == Some("22"))
            .map(|r| (num(r, "x"), num(r, "y"), num(r, "width"), r["fill"].clone()))
            .collect();
        assert_eq!(
            bars,
            vec![
                (90.0, 58.0, 190.0, "#111111".into()),
                (280.0, 58.0, 380.0, "#222222".into()),
                (90.0, 90.0, 570.0, "#333333".into()),
            ]
        );
        assert!(svg.contains(r#"<title>b 2.000 GiB</title>"#));
        // the text after a bar starts 4 pixels past its end
        assert!(svg.contains(r#"<text x="664.0" y="73.4">3 GiB</text>"#));
        assert!(svg.contains(r#"<text x="664.0" y="105.4">x</text>"#));
        let lines = elements(&svg, "line");
        let grid: Vec<f64> = lines
            .iter()
            .filter(|l| l["stroke"] == "#eee")
            .map(|l| num(l, "x1"))
            .collect();
        assert_eq!(
            grid,
            (0..9).map(|k| 90.0 + 95.0 * k as f64).collect::<Vec<_>>()
        );
        assert!(svg.contains(">0.5</text>") && svg.contains(">4</text>"));
        let markers: Vec<(f64, &str)> = lines
            .iter()
            .filter(|l| l.contains_key("stroke-dasharray"))
            .map(|l| (num(l, "x1"), l["stroke"].as_str()))
            .collect();
        assert_eq!(markers, vec![(850.0, "#c00000"), (774.0, "#b07d00")]);
        // close markers' labels alternate above and below the bars
        assert!(svg.contains(r##"y="38" text-anchor="middle" fill="#c00000">cap</text>"##));
        assert!(svg.contains(r##"y="160" text-anchor="middle" fill="#b07d00">risk</text>"##));
        // four entries a legend row, below the lower marker label
        let legend: Vec<(f64, f64)> = elements(&svg, "rect")
            .iter()
            .filter(|r| r.get("width").map(String::as_str) == Some("10"))
            .map(|r| (num(r, "x"), num(r, "y")))
            .collect();
        assert_eq!(
            legend,
            vec![
                (90.0, 167.0),
                (270.0, 167.0),
                (450.0, 167.0),
                (630.0, 167.0),
                (90.0, 185.0)
            ]
        );
    }

    /// Without markers the longest bar sets the scale; one marker's label goes above the bars
    /// and the legend sits closer than under two.
    #[test]
    fn the_longest_bar_or_marker_sets_the_scale() {
        let parts = [("a", "#111111")];
        let bars = |markers: Vec<Marker<'static>>| {
            Bars {
                title: "",
                unit: "ms",
                parts: &parts,
                rows: vec![("r".into(), vec![2.0], String::new())],
                markers,
            }
            .svg()
        };
        let width = |svg: &str| {
            elements(svg, "rect")
                .iter()
                .find(|r| r.get("height").map(String::as_str) == Some("22"))
                .map(|r| num(r, "width"))
        };
        let legend_y = |svg: &str| {
            elements(svg, "rect")
                .iter()
                .find(|r| r.get("width").map(String::as_str) == Some("10"))
                .map(|r| num(r, "y"))
        };
        let plain = bars(Vec::new());
        assert_eq!(width(&plain), Some(760.0));
        // rows end at 58 + 32; the legend 48 below, its square 9 above its text
        assert_eq!(legend_y(&plain), Some(90.0 + 48.0 - 9.0));
        let marked = bars(vec![Marker {
            at: 8.0,
            label: "cap",
            colour: "#c00000",
        }]);
        assert_eq!(width(&marked), Some(190.0));
        assert_eq!(legend_y(&marked), legend_y(&plain));
        assert!(marked.contains(r##"y="38" text-anchor="middle" fill="#c00000">cap</text>"##));
    }

    /// Whatever the schedule, a rank's bar is its share of the step and they all end at the
    /// step: busy time, waiting, its optimizer and the step's tail add up to the step time.
    #[test]
    fn every_rank_s_bar_stacks_to_the_step_time() {
        for (schedule, pp) in [
            (Schedule::OneFOneB, 4),
            (Schedule::ZbH1, 4),
            (Schedule::Gpipe, 2),
            (Schedule::ClosedForm, 4),
        ] {
            let p = predicted("llama2-13b", 2, pp, 1, schedule);
            let rows = breakdown_rows(&p);
            let step_ms = p.metrics.step_time_s * 1e3;
            let ranks = if schedule == Schedule::ClosedForm {
                1
            } else {
                pp
            };
            assert_eq!(rows.len(), ranks as usize, "{schedule}");
            for (label, values, _) in &rows {
                assert_eq!(values.len(), TIME_CLASSES.len());
                assert!(
                    values.iter().all(|v| *v >= 0.0),
                    "{schedule} {label}: {values:?}"
                );
                let sum: f64 = values.iter().sum();
                assert!(
                    (sum - step_ms).abs() <= 1e-9 * step_ms,
                    "{schedule} {label}: {sum} ms against a step of {step_ms} ms"
                );
            }
            if schedule != Schedule::ClosedForm {
                let critical: Vec<&str> = rows
                    .iter()
                    .filter(|r| r.2 == "critical rank")
                    .map(|r| r.0.as_str())
                    .collect();
                assert_eq!(critical.len(), 1, "{schedule}");
                assert!(rows
                    .iter()
                    .all(|r| r.2.is_empty() || r.2 == "critical rank"));
                assert_eq!(rows[0].0, "rank 0");
            }
            let svg = breakdown(&p, "llama");
            assert!(svg.contains(&format!(
                "llama — {} schedule, step {:.3} s",
                schedule.name(),
                p.metrics.step_time_s
            )));
        }
    }

    /// A tiny model's optimizer kernels run faster than the host issues them: the excess is
    /// host-bound, not optimizer time; an all-gather of the parameters not overlapped counts
    /// as data-parallel communication.
    #[test]
    fn a_host_bound_optimizer_and_an_exposed_gather_are_drawn_as_such() {
        let mut s = spec(2, 2, 2, Schedule::OneFOneB);
        s.zero = Some(1);
        s.overlap_param_gather = Some(false);
        let p = crate::cli::test_support::predicted_arch(crate::cli::test_support::tiny(), s).2;
        let (work, t) = p.timeline.as_ref().unwrap();
        let rows = breakdown_rows(&p);
        let at = |name: &str| TIME_CLASSES.iter().position(|c| c.0 == name).unwrap();
        let step_ms = t.step_us / 1e3;
        for (r, (label, values, _)) in rows.iter().enumerate() {
            let rank = &t.ranks[r];
            let [start, end] = rank.optimizer_us;
            let kernels = work.ranks[r].optimizer_us;
            assert!(
                end - start > kernels * 1.5,
                "{label}: the host holds the optimizer up"
            );
            let [from, to] = rank.param_gather_us.expect("an exposed all-gather");
            assert!(to > from);
            let busy = rank.spent;
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * step_ms;
            assert!(close(
                values[at("optimizer")],
                (busy.optimizer + kernels) / 1e3
            ));
            assert!(close(
                values[at("host-bound")],
                (busy.host + end - start - kernels + work.host.step_overhead_us) / 1e3
            ));
            assert!(close(
                values[at("DP comm")],
                (busy.dp_comm + to - from) / 1e3
            ));
            assert!(close(values.iter().sum::<f64>(), step_ms), "{label}");
        }
    }

    /// The step's fp32 gradient copies show only where they outgrow the activations they
    /// replace (a 16-bit gradient buffer and short sequences): each bar stacks to the rank's
    /// total, with and without them.
    #[test]
    fn every_rank_s_memory_bar_stacks_to_its_total() {
        let mut short = spec(8, 1, 1, Schedule::OneFOneB);
        short.zero = Some(1);
        short.seq_len = Some(128);
        short.grad_reduce_dtype = Some(stepcast::ops::Dtype::Bf16);
        let mut beyond = [false, false];
        for (model, spec) in [
            ("llama2-13b", spec(2, 4, 1, Schedule::OneFOneB)),
            ("llama2-13b", short),
        ] {
            let p = predicted_with(model, spec);
            let rows = memory_rows(&p.memory);
            assert_eq!(rows.len(), p.memory.ranks.len());
            for ((label, values, after), rank) in rows.iter().zip(&p.memory.ranks) {
                assert_eq!(label, &format!("rank {}", rank.rank));
                assert_eq!(values.len(), MEMORY_PARTS.len());
                let sum: f64 = values.iter().sum();
                assert!(
                    (sum - rank.total_gib).abs() <= 1e-9 * rank.total_gib,
                    "{model} {label}: {sum} GiB against {}",
                    rank.total_gib
                );
                assert_eq!(
                    after,
                    &format!("{:.1} GiB {}", rank.total_gib, rank.verdict.name())
                );
                beyond[usize::from(values[5] > 0.0)] = true;
            }
            let svg = memory(&p.memory);
            let capacity = p.memory.capacity_gib;
            assert!(svg.contains(&format!(">capacity {capacity:.0} GiB</text>")));
            assert!(svg.contains(&format!(">AT-RISK above {:.0} GiB</text>", 0.9 * capacity)));
        }
        assert_eq!(
            beyond,
            [true, true],
            "both sides of the step's copies drawn"
        );
    }

    /// The Gantt chart draws every pass of every rank once, inside the step, one after another
    /// on a rank's compute stream, then its optimizer step.
    #[test]
    fn the_timeline_draws_every_pass_in_order_within_the_step() {
        for (schedule, passes) in [(Schedule::OneFOneB, 2), (Schedule::ZbH1, 3)] {
            let (pp, micro_batches) = (4, 8);
            let p = predicted("llama2-13b", 2, pp, 2, schedule);
            let (work, t) = p.timeline.as_ref().expect("a simulated step");
            let svg = timeline(work, t);
            let rects = elements(&svg, "rect");
            let pass_colours = [FORWARD, BACKWARD, WEIGHT_GRAD];
            let (left, right) = (80.0, 80.0 + 1100.0);
            for r in 0..pp {
                let y = format!("{}", 30.0 + r as f64 * 42.0);
                let mut on_rank: Vec<(f64, f64)> = rects
                    .iter()
                    .filter(|e| {
                        e.get("y") == Some(&y) && pass_colours.contains(&e["fill"].as_str())
                    })
                    .map(|e| (num(e, "x"), num(e, "x") + num(e, "width")))
                    .collect();
                assert_eq!(on_rank.len(), passes * micro_batches, "{schedule} rank {r}");
                on_rank.sort_by(|a, b| a.0.total_cmp(&b.0));
                assert!(on_rank[0].0 >= left);
                for pair in on_rank.windows(2) {
                    // a pass narrower than 0.2 pixels is drawn 0.2 wide
                    assert!(
                        pair[0].1 <= pair[1].0 + 0.21,
                        "{schedule} rank {r}: {pair:?}"
                    );
                }
                let optimizer: Vec<f64> = rects
                    .iter()
                    .filter(|e| e.get("y") == Some(&y) && e["fill"] == TIME_CLASSES[6].1)
                    .map(|e| num(e, "x"))
                    .collect();
                assert_eq!(optimizer.len(), 1, "{schedule} rank {r}");
                assert!(optimizer[0] >= on_rank.last().unwrap().1 - 0.21);
                assert!(optimizer[0] <= right);
                // the loop's host work closes the step on every rank
                let host: Vec<(f64, f64)> = rects
                    .iter()
                    .filter(|e| e.get("y") == Some(&y) && e["fill"] == TIME_CLASSES[7].1)
                    .map(|e| (num(e, "x"), num(e, "x") + num(e, "width")))
                    .collect();
                assert_eq!(host.len(), 1, "{schedule} rank {r}");
                assert!(host[0].0 > optimizer[0], "{schedule} rank {r}");
                assert!(
                    (host[0].1 - right).abs() < 0.01,
                    "{schedule} rank {r}: {host:?}"
                );
                let strip = |colour: &str, below: f64| {
                    rects
                        .iter()
                        .filter(|e| e["fill"] == colour && e["height"] == "4")
                        .filter(|e| num(e, "y") == 30.0 + r as f64 * 42.0 + below)
                        .count()
                };
                assert!(
                    strip(TIME_CLASSES[5].1, 28.0) >= 1,
                    "dp 2 reduces gradients"
                );
                // every rank sends but the last, which has no next stage to send to on the
                // way forward, and receives the first's gradients: all send something
                assert!(
                    strip(TIME_CLASSES[4].1, 33.0) >= 1,
                    "{schedule} rank {r} sends"
                );
                let label_y = 30.0 + r as f64 * 42.0 + 26.0 * 0.65;
                assert!(svg.contains(&format!(r#"<text x="4" y="{label_y}">rank {r}</text>"#)));
            }
            assert!(svg.contains(&format!(
                ">{} schedule, step {:.1} ms",
                schedule.name(),
                t.step_us / 1e3
            )));
            // four rows of 26 + 16 under a 30-pixel title, then the axis and the legend
            let root = &elements(&svg, "svg")[0];
            assert_eq!((num(root, "width"), num(root, "height")), (1200.0, 264.0));
            let step_ms = t.step_us / 1e3;
            let tick = tick_step(step_ms, 10.0);
            let grid: Vec<(f64, f64)> = elements(&svg, "line")
                .iter()
                .filter(|l| l["stroke"] == "#ddd")
                .map(|l| (num(l, "x1"), num(l, "y2")))
                .collect();
            assert_eq!(grid.len(), (step_ms / tick).floor() as usize + 1);
            for (k, (x, y2)) in grid.iter().enumerate() {
                let at = left + 1100.0 * k as f64 * tick / step_ms;
                assert!((x - at).abs() <= 0.051 && *y2 == 202.0, "{k}: {x} {y2}");
            }
            // passes are titled by micro-batch and chunk (one chunk a rank here)
            assert!(svg.contains("<title>F mb 7 (chunk 0) "), "{svg}");
            assert_eq!(
                svg.matches(" (chunk 0) ").count(),
                pp as usize * passes * micro_batches
            );
            // the legend's row under the axis, 150 pixels an entry
            let legend: Vec<(f64, f64)> = rects
                .iter()
                .filter(|e| e.get("width").map(String::as_str) == Some("10"))
                .map(|e| (num(e, "x"), num(e, "y")))
                .collect();
            let expected: Vec<(f64, f64)> =
                (0..7).map(|k| (80.0 + 150.0 * k as f64, 227.0)).collect();
            assert_eq!(legend, expected);
            assert!(svg.contains(r#"<text x="94" y="236">forward</text>"#));
            let label = stepcast::limits::readable(tick);
            assert!(
                svg.contains(&format!(r#"y="216" text-anchor="middle">{label}</text>"#)),
                "no tick {label}"
            );
            for e in &rects {
                if let (Some(x), Some(w)) = (e.get("x"), e.get("width")) {
                    if let (Ok(x), Ok(w)) = (x.parse::<f64>(), w.parse::<f64>()) {
                        assert!(x + w <= right + 0.6 || w >= 1100.0, "{e:?} beyond the step");
                    }
                }
            }
        }
    }
}
