//! `stepcast train <dataset> --out models/<cluster>`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::output::{align_numbers, bytes, pct, table};
use stepcast::dataset::Dataset;
use stepcast::ops::OpKind;
use stepcast::regress::train::{task_count, train, TrainOptions};
use stepcast::regress::{Manifest, ModelSet};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Dataset directory (meta.yaml + <op>.csv).
    pub dataset: PathBuf,
    /// Models directory to write, e.g. models/perlmutter.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the 80/20 split, the bootstraps and the subsamples.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Also write every grid candidate's validation error to this CSV file.
    #[arg(long)]
    pub grid_report: Option<PathBuf>,
    /// Train only these operator kinds of the dataset (comma-separated, e.g.
    /// `gemm,flash_attention`); the manifest records the selection beside the dataset's
    /// fingerprint. All of them when not given.
    #[arg(long, value_delimiter = ',')]
    pub operators: Vec<String>,
}

/// Keeps the rows of the operator kinds asked for; each must be a kind the dataset measured.
/// Returns the kinds kept, by name, for the manifest (empty: all).
fn select_operators(dataset: &mut Dataset, names: &[String]) -> anyhow::Result<Vec<String>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut kinds: Vec<OpKind> = Vec::new();
    let present: std::collections::BTreeSet<&str> =
        dataset.rows.iter().map(|r| r.query.op.name()).collect();
    for name in names {
        let kind: OpKind = name.trim().parse().map_err(|_| {
            stepcast::Error::Invalid(format!(
                "--operators {name}: not an operator kind; give some of {}",
                present.iter().copied().collect::<Vec<_>>().join(", ")
            ))
        })?;
        if !present.contains(kind.name()) {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "--operators {name}: {} has no {name} rows; it measured {}",
                dataset.dir.display(),
                present.iter().copied().collect::<Vec<_>>().join(", ")
            )));
        }
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    dataset.rows.retain(|r| kinds.contains(&r.query.op));
    Ok(kinds.iter().map(|k| k.name().to_string()).collect())
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let _reading = stepcast::fsutil::DirLock::shared(&args.dataset)?;
    let mut dataset = Dataset::load(&args.dataset)
        .with_context(|| format!("loading dataset {}", args.dataset.display()))?;
    let operators = select_operators(&mut dataset, &args.operators)?;
    if dataset.meta.source.description.starts_with("MOCK") {
        eprintln!(
            "warning: {} holds the mock device's synthetic timings (a test double): models \
             trained from it predict nothing real",
            args.dataset.display()
        );
    }
    let options = TrainOptions {
        seed: args.seed,
        ..TrainOptions::default()
    };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(task_count(&dataset, &options) as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} fits, {elapsed} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message("training");
    let outcome = train(&dataset, &options, &|| bar.inc(1));
    bar.finish_and_clear();
    if outcome.models.is_empty() {
        anyhow::bail!(stepcast::Error::Empty(format!(
            "{}: no operator group had enough rows to train",
            args.dataset.display()
        )));
    }
    if let Some(path) = &args.grid_report {
        write_grid_report(path, &outcome.grid)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let manifest = Manifest {
        operators,
        ..Manifest::of_training(
            &dataset,
            &outcome,
            args.seed,
            started.elapsed().as_secs_f64(),
        )
    };
    let manifest = ModelSet::save(&args.out, manifest, outcome.models)
        .with_context(|| format!("writing models to {}", args.out.display()))?;

    let mut t = table(&["model", "recipe", "rows", "val MAPE %", "val p90 %", "size"]);
    let mut total = 0;
    for e in &manifest.models {
        total += e.bytes;
        let mut name = e.key.to_string();
        if !e.serves_roles.is_empty() {
            let roles: Vec<&str> = e.serves_roles.iter().map(|r| r.name()).collect();
            name.push_str(&format!(" (+{})", roles.join(",")));
        }
        t.add_row(vec![
            name,
            e.recipe.clone(),
            e.training_rows.to_string(),
            pct(e.validation.mape_percent),
            pct(e.validation.p90_ape_percent),
            bytes(e.bytes),
        ]);
    }
    align_numbers(&mut t, 2);
    println!("{t}");
    for (key, why) in &manifest.skipped {
        println!("not trained: {key}: {why}");
    }
    println!(
        "{} models, {} in {}, trained in {:.1} s",
        manifest.models.len(),
        bytes(total),
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write_grid_report(
    path: &std::path::Path,
    grid: &[(
        stepcast::regress::ModelKey,
        stepcast::regress::Recipe,
        f64,
        usize,
        bool,
    )],
) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(["model", "recipe", "val_mape_percent", "nodes", "chosen"])?;
    for (key, recipe, mape, nodes, chosen) in grid {
        w.write_record([
            key.to_string(),
            recipe.to_string(),
            format!("{mape:.4}"),
            nodes.to_string(),
            (*chosen as u8).to_string(),
        ])?;
    }
    w.flush()?;
    Ok(())
}
