//! `stepcast eval <models-dir> <dataset-dir> [--split …] [--json]`.

use std::path::PathBuf;

use super::named;
use anyhow::Context;
use clap::Args;

use super::output::{align_numbers, opt_pct, pct, table};
use stepcast::dataset::Dataset;
use stepcast::regress::eval::{evaluate_watched, EvalOptions};
use stepcast::regress::split::SplitKind;
use stepcast::regress::ModelSet;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Models directory, e.g. models/perlmutter.
    pub models: PathBuf,
    /// Dataset directory to evaluate on.
    pub dataset: PathBuf,
    /// How rows are held out; `none` judges the saved models as they are.
    #[arg(long, value_parser = named::<SplitKind>(), default_value = "random")]
    pub split: SplitKind,
    /// Seed of the random split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let set = ModelSet::load(&args.models)
        .with_context(|| format!("loading models {}", args.models.display()))?;
    let _reading = stepcast::fsutil::DirLock::shared(&args.dataset)?;
    let dataset = Dataset::load(&args.dataset)
        .with_context(|| format!("loading dataset {}", args.dataset.display()))?;
    let bar = super::output::Bar::new();
    let report = evaluate_watched(
        &set,
        &dataset,
        &EvalOptions {
            split: args.split,
            seed: args.seed,
            fraction: 0.2,
        },
        &bar,
    );
    bar.finish();
    let report = report?;
    if args.json {
        let inputs = vec![
            super::stamp::models(&set),
            stepcast::provenance::Input::new(
                "dataset",
                args.dataset.display().to_string(),
                Some(dataset.fingerprint.clone()),
            ),
        ];
        return super::stamp::print(&report, inputs);
    }
    println!(
        "{} on {} — split: {}",
        args.models.display(),
        args.dataset.display(),
        report.split
    );
    let mut t = table(&[
        "operator",
        "phase",
        "role / layout",
        "rows",
        "MAPE %",
        "p90 %",
        "roofline MAPE %",
        "roofline p90 %",
        "published %",
        "ours / published",
        "out of coverage %",
    ]);
    for r in &report.rows {
        let what = match (r.role, r.layout, r.bytes_range) {
            (Some(role), _, _) => role.to_string(),
            (None, Some([n, g]), range) => {
                let mut s = format!("{n}×{g}");
                if let Some([lo, hi]) = range {
                    s.push_str(&format!(" {}–{} MB", lo / 1_000_000, hi / 1_000_000));
                }
                s
            }
            (None, None, Some([lo, hi])) => format!("all {}–{} MB", lo / 1_000_000, hi / 1_000_000),
            _ => String::new(),
        };
        let published = r
            .reference
            .as_ref()
            .map(|p| format!("{} ({})", pct(p.mape_percent), p.regressor))
            .unwrap_or_else(|| "–".to_string());
        t.add_row(vec![
            format!("{} {}", r.op, r.dtype),
            r.phase.to_string(),
            what,
            r.rows.to_string(),
            pct(r.mape_percent),
            pct(r.p90_ape_percent),
            opt_pct(r.roofline_mape_percent),
            opt_pct(r.roofline_p90_ape_percent),
            published,
            r.reference
                .as_ref()
                .filter(|p| p.mape_percent > 0.0)
                .map(|p| format!("{:.2}×", r.mape_percent / p.mape_percent))
                .unwrap_or_else(|| "–".to_string()),
            format!("{:.0}", r.out_of_coverage_percent),
        ]);
    }
    align_numbers(&mut t, 3);
    println!("{t}");
    for note in &report.not_evaluated {
        println!("not evaluated: {note}");
    }
    Ok(())
}
