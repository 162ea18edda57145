//! Shared output helpers: tables and number formatting.

use std::sync::atomic::{AtomicBool, Ordering};

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ContentArrangement, Table};

/// `--wide`: tables as wide as their content instead of wrapped to the terminal.
static WIDE: AtomicBool = AtomicBool::new(false);

pub fn set_wide(wide: bool) {
    WIDE.store(wide, Ordering::Relaxed);
}

/// A table that wraps its cells to fit the terminal (unless `--wide`).
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    let arrangement = if WIDE.load(Ordering::Relaxed) {
        ContentArrangement::Disabled
    } else {
        ContentArrangement::Dynamic
    };
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(arrangement)
        .set_header(header.to_vec());
    t
}

/// Hides the columns `droppable` lists, in order, until the table fits the terminal (unless
/// `--wide`, or not printing to a terminal); returns a note saying what was hidden.
pub fn fit(t: &mut Table, droppable: &[usize]) -> Option<String> {
    use comfy_table::ColumnConstraint;
    if WIDE.load(Ordering::Relaxed) {
        return None;
    }
    let terminal = t.width()? as usize;
    let widths: Vec<usize> = t
        .column_max_content_widths()
        .iter()
        .map(|&w| w as usize + 3)
        .collect();
    let mut total: usize = widths.iter().sum::<usize>() + 1;
    let mut hidden = 0;
    for &i in droppable {
        if total <= terminal {
            break;
        }
        if let (Some(c), Some(w)) = (t.column_mut(i), widths.get(i)) {
            c.set_constraint(ColumnConstraint::Hidden);
            total -= w;
            hidden += 1;
        }
    }
    (hidden > 0).then(|| {
        format!(
            "({} hidden to fit the terminal; --wide shows all)",
            count(hidden as u64, "column", "columns")
        )
    })
}

/// "1 GPU", "8 GPUs".
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n: u64 = n.into();
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Right-aligns every column from `from` on (the numeric ones).
pub fn align_numbers(t: &mut Table, from: usize) {
    let n = t.column_count();
    for i in from..n {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

pub fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".to_string()
    }
}

/// A share of a whole, one decimal: "12.3 %", and "< 0.1 %" for a part too small to show,
/// which "0.0 %" would say is absent.
pub fn share(percent: f64) -> String {
    if percent > 0.0 && percent < 0.05 {
        "< 0.1 %".to_string()
    } else {
        format!("{percent:.1} %")
    }
}

pub fn opt_pct(v: Option<f64>) -> String {
    v.map(pct).unwrap_or_else(|| "–".to_string())
}

pub fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", n as f64 / 1024.0)
    }
}

/// A progress bar on standard error for a long computation, drawn only when standard error is
/// a terminal (so pipes, files and CI logs stay clean).
pub struct Bar {
    bar: indicatif::ProgressBar,
    /// Whether standard error is a terminal: the bar appears at the first `start`.
    shown: bool,
}

impl Bar {
    pub fn new() -> Bar {
        use std::io::IsTerminal;
        let bar = indicatif::ProgressBar::hidden();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {pos}/{len}, {elapsed} (eta {eta})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Bar {
            bar,
            shown: std::io::stderr().is_terminal(),
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl stepcast::progress::Progress for Bar {
    fn start(&self, what: &str, total: u64) {
        self.bar.set_message(what.to_string());
        self.bar.set_length(total);
        self.bar.set_position(0);
        if self.shown && self.bar.is_hidden() {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
    }

    fn advance(&self) {
        self.bar.inc(1);
    }
}

/// The line under the runtime's: the calibration's error on the sets it held out, and what it
/// means to a user (none where it held none out).
pub fn held_out_line(
    held_out: &std::collections::BTreeMap<String, stepcast::stats::ErrorStats>,
) -> Option<String> {
    stepcast::hardware::held_out_summary(held_out).map(|h| {
        format!(
            "         {h}: where your software differs from the runs it was fitted on, expect \
             errors of this size (`stepcast calibrate YOUR_RUNS.csv --check`)"
        )
    })
}

/// The line saying which runtime composed a prediction: its calibration ("calibrated for … on
/// N runs …", or one borrowed) or the cluster's defaults, and the values.
pub fn runtime_line(calibration: Option<&str>, r: &stepcast::hardware::Runtime) -> String {
    let how = calibration.unwrap_or(
        "the cluster's defaults (raw physics: no calibration for this cluster, or --no-calibration)",
    );
    // FlashAttention-2's own efficiency is said only where a calibration moved it from 1
    let fa2 = if r.flash_attention_2_efficiency < 1.0 {
        format!(
            ", FlashAttention-2 at {:.2} of its costed speed",
            r.flash_attention_2_efficiency
        )
    } else {
        String::new()
    };
    format!(
        "runtime  {how}: launch {:.0} µs, collective {:.0} µs, in-situ efficiency {:.2}, \
         contention {:.2}, per-step host {:.0} ms{fa2}",
        r.launch_us, r.collective_launch_us, r.in_situ_efficiency, r.contention, r.step_overhead_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of a name and three columns of 1s, 2s and 3s: 23 + 3 × 13 + 1 = 63 characters
    /// wide, in a terminal `width` wide.
    fn four_columns(width: u16) -> Table {
        let mut t = table(&["name", "a", "b", "c"]);
        t.add_row(vec![
            "n".repeat(20),
            "1".repeat(10),
            "2".repeat(10),
            "3".repeat(10),
        ]);
        t.set_width(width);
        t
    }

    /// At 50 the first droppable column goes (50 fit) and the rest stay; at 49 two go; with
    /// room, none.
    #[test]
    fn columns_are_hidden_in_order_until_the_table_fits() {
        let shown = |width: u16, droppable: &[usize]| {
            let mut t = four_columns(width);
            let note = fit(&mut t, droppable);
            let text = t.to_string();
            let kept: Vec<char> = ['1', '2', '3']
                .into_iter()
                .filter(|c| text.contains(&c.to_string().repeat(10)))
                .collect();
            (note, kept)
        };
        let note = |n: &str| {
            Some(format!(
                "({n} hidden to fit the terminal; --wide shows all)"
            ))
        };
        assert_eq!(shown(50, &[3, 1, 2]), (note("1 column"), vec!['1', '2']));
        assert_eq!(shown(49, &[3, 1, 2]), (note("2 columns"), vec!['2']));
        assert_eq!(shown(63, &[3, 1, 2]), (None, vec!['1', '2', '3']));
        // only the droppable ones go, however narrow (the rest wrap)
        let mut t = four_columns(20);
        assert_eq!(fit(&mut t, &[2]), note("1 column"));
        let text = t.to_string();
        assert!(
            !text.contains('2') && text.contains('1') && text.contains('3'),
            "{text}"
        );
    }

    #[test]
    fn counts_and_percentages_read_as_words() {
        assert_eq!(count(1u64, "GPU", "GPUs"), "1 GPU");
        assert_eq!(count(8u64, "GPU", "GPUs"), "8 GPUs");
        assert_eq!(pct(12.345), "12.35");
        assert_eq!(pct(f64::NAN), "–");
        assert_eq!(share(79.46), "79.5 %");
        assert_eq!(share(0.0), "0.0 %");
        assert_eq!(share(0.049), "< 0.1 %");
        assert_eq!(share(0.05), "0.1 %");
        assert_eq!(opt_pct(Some(3.0)), "3.00");
        assert_eq!(opt_pct(None), "–");
    }

    /// KiB below one MiB, MiB from it.
    #[test]
    fn sizes_read_in_kib_or_mib() {
        assert_eq!(bytes(512), "0.5 KiB");
        assert_eq!(bytes((1 << 20) - 1), "1024.0 KiB");
        assert_eq!(bytes(1 << 20), "1.0 MiB");
        assert_eq!(bytes(3 << 19), "1.5 MiB");
    }

    #[test]
    fn the_runtime_line_says_how_it_was_calibrated_and_its_values() {
        let mut r = stepcast::hardware::Runtime {
            launch_us: 38.4,
            collective_launch_us: 40.0,
            in_situ_efficiency: 0.894,
            contention: 1.49,
            step_overhead_ms: 17.2,
            ..Default::default()
        };
        r.flash_attention_2_efficiency = 1.0;
        assert_eq!(
            runtime_line(Some("calibrated for x on 3 measured runs"), &r),
            "runtime  calibrated for x on 3 measured runs: launch 38 µs, collective 40 µs, \
             in-situ efficiency 0.89, contention 1.49, per-step host 17 ms"
        );
        r.flash_attention_2_efficiency = 0.8;
        let raw = runtime_line(None, &r);
        assert!(
            raw.starts_with("runtime  the cluster's defaults (raw physics")
                && raw
                    .ends_with("per-step host 17 ms, FlashAttention-2 at 0.80 of its costed speed"),
            "{raw}"
        );
    }

    #[test]
    fn the_held_out_line_appears_only_for_sets_held_out() {
        use stepcast::stats::ErrorStats;
        let mut held_out = std::collections::BTreeMap::new();
        assert_eq!(held_out_line(&held_out), None);
        held_out.insert(
            "other".to_string(),
            ErrorStats {
                runs: 2,
                mean_abs_percent: 4.0,
                max_abs_percent: 5.0,
                bias_percent: -4.0,
            },
        );
        let line = held_out_line(&held_out).unwrap();
        assert!(
            line.starts_with("         on the runs of sets it was not fitted on: other 4.0 %")
                && line.ends_with(
                    "expect errors of this size (`stepcast calibrate YOUR_RUNS.csv --check`)"
                ),
            "{line}"
        );
    }
}
