//! `predict --plot`: an SVG of how each pipeline rank spends the step, one stacked bar per rank
//! (compute, TP / PP / DP communication, optimizer, bubble and waiting), or one bar of the
//! step's breakdown for the closed form.

use plotters::prelude::*;

use stepcast::predict::Prediction;
use stepcast::timing::Breakdown;

/// Colours per class, in stacking order.
const CLASSES: [(&str, RGBColor); 6] = [
    ("compute", RGBColor(79, 129, 189)),
    ("TP comm", RGBColor(155, 187, 89)),
    ("PP comm", RGBColor(128, 100, 162)),
    ("DP comm", RGBColor(247, 150, 70)),
    ("optimizer", RGBColor(192, 80, 77)),
    ("bubble / waiting", RGBColor(210, 210, 210)),
];

fn values(b: &Breakdown) -> [f64; 6] {
    [
        b.compute,
        b.tp_comm,
        b.pp_comm,
        b.dp_comm,
        b.optimizer,
        b.bubble,
    ]
}

/// Per bar, the label and the microseconds of each class.
fn bars(p: &Prediction) -> Vec<(String, [f64; 6])> {
    let Some((_, t)) = &p.timeline else {
        return vec![("step".to_string(), values(&p.breakdown_s).map(|v| v * 1e6))];
    };
    t.ranks
        .iter()
        .enumerate()
        .map(|(r, rank)| {
            let mut b = rank.spent;
            // waiting for the slowest rank, then this rank's optimizer and all-gather, then
            // waiting for the step's end
            b.bubble += t.barrier_us - rank.sync_end_us;
            let [start, mut end] = rank.optimizer_us;
            b.optimizer += end - start;
            if let Some([start, stop]) = rank.param_gather_us {
                b.dp_comm += stop - start;
                end = end.max(stop);
            }
            b.bubble += t.step_us - end;
            (format!("rank {r}"), values(&b))
        })
        .collect()
}

pub fn breakdown_svg(p: &Prediction, title: &str) -> anyhow::Result<String> {
    let bars = bars(p);
    let n = bars.len();
    let step_ms = p.metrics.step_time_s * 1e3;
    let mut svg = String::new();
    {
        let height = 150 + 36 * n as u32;
        let root = SVGBackend::with_string(&mut svg, (960, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let caption = format!(
            "{title} — {} schedule, step {:.3} s, bubble {:.1} %",
            p.schedule,
            p.metrics.step_time_s,
            100.0 * p.metrics.bubble_ratio
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..step_ms * 1.25, -0.5f64..n as f64 - 0.5)
            .map_err(plot_error)?;
        let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[labels.len() - 1 - i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_desc("milliseconds")
            .draw()
            .map_err(plot_error)?;
        for (k, (name, color)) in CLASSES.iter().enumerate() {
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .enumerate()
                .map(|(i, (_, v))| {
                    let x0: f64 = v[..k].iter().sum::<f64>() / 1e3;
                    let x1 = x0 + v[k] / 1e3;
                    // rank 0 on top
                    let y = (n - 1 - i) as f64;
                    Rectangle::new([(x0, y - 0.35), (x1, y + 0.35)], color.filled())
                })
                .collect();
            let color = *color;
            chart
                .draw_series(rects)
                .map_err(plot_error)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}
