//! `stepcast datasets import|show|compare`.

use std::path::PathBuf;

use super::named;
use anyhow::Context;
use clap::{Args, Subcommand};

use super::output::{align_numbers, table};
use stepcast::dataset::import::{import, ImportFormat, ImportOptions};
use stepcast::dataset::Dataset;

#[derive(Debug, Subcommand)]
pub enum DatasetsCommand {
    /// Convert a public measurement release into a stepcast dataset.
    Import(ImportArgs),
    /// Summarise a dataset: its stamp and rows per operator and phase.
    Show {
        /// The dataset directory (holds meta.yaml).
        dir: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compare two collections at the points both measured: the ratio new / old per operator
    /// kind, and per kind and length of call (after a driver update, a change of protocol,
    /// another GPU).
    Compare {
        /// The earlier dataset directory.
        old: PathBuf,
        /// The later dataset directory.
        new: PathBuf,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Source layout.
    #[arg(long, value_parser = named::<ImportFormat>())]
    pub format: ImportFormat,
    /// Directory of the release (read in place).
    pub source: PathBuf,
    /// New dataset directory to write.
    #[arg(long)]
    pub out: PathBuf,
    /// System inside a multi-system release (Perlmutter, Vista; a100_sxm, h100_sxm, h200_sxm).
    #[arg(long)]
    pub system: Option<String>,
    /// aiconfigurator: the NCCL version whose table to import (default: newest).
    #[arg(long)]
    pub nccl_version: Option<String>,
}

pub fn run(cmd: DatasetsCommand) -> anyhow::Result<()> {
    match cmd {
        DatasetsCommand::Import(a) => {
            let options = ImportOptions {
                system: a.system.clone(),
                nccl_version: a.nccl_version.clone(),
            };
            let report = import(a.format, &a.source, &a.out, &options).with_context(|| {
                format!(
                    "importing {} from {}",
                    format_name(a.format),
                    a.source.display()
                )
            })?;
            let meta = report.meta.as_ref().expect("set on success");
            println!(
                "wrote dataset '{}' ({}) to {}",
                meta.name,
                meta.gpu.name,
                a.out.display()
            );
            let mut t = table(&["operator", "rows"]);
            for (op, n) in &report.rows_per_op {
                t.add_row(vec![op.clone(), n.to_string()]);
            }
            align_numbers(&mut t, 1);
            println!("{t}");
            for (what, n, why) in &report.left_out {
                println!("left out {what} ({n} rows): {why}");
            }
            Ok(())
        }
        DatasetsCommand::Compare { old, new, json } => compare(&old, &new, json),
        DatasetsCommand::Show { dir, json } => {
            let _reading = stepcast::fsutil::DirLock::shared(&dir)?;
            let ds = Dataset::load(&dir)?;
            let summary = summarise(&ds);
            if json {
                let input = stepcast::provenance::Input::new(
                    "dataset",
                    dir.display().to_string(),
                    Some(ds.fingerprint.clone()),
                );
                return super::stamp::print(&summary, vec![input]);
            }
            let m = &ds.meta;
            println!("{} — {} — collected {}", m.name, m.gpu.name, m.collected_at);
            println!("source: {}", m.source.description);
            println!("fingerprint: {}", ds.fingerprint);
            let mut t = table(&["operator", "phase", "dtype", "rows", "skipped"]);
            for g in &summary.groups {
                t.add_row(vec![
                    g.operator.into(),
                    g.phase.into(),
                    g.dtype.into(),
                    g.rows.to_string(),
                    g.skipped.to_string(),
                ]);
            }
            align_numbers(&mut t, 3);
            println!("{t}");
            Ok(())
        }
    }
}

fn compare(old_dir: &std::path::Path, new_dir: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let _old_lock = stepcast::fsutil::DirLock::shared(old_dir)?;
    let _new_lock = stepcast::fsutil::DirLock::shared(new_dir)?;
    let old = Dataset::load(old_dir)?;
    let new = Dataset::load(new_dir)?;
    let Some(c) = stepcast::dataset::compare::compare(&old.rows, &new.rows) else {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{} and {} share no measured point: compare two collections of the same plan (or \
             plans that overlap)",
            old_dir.display(),
            new_dir.display()
        )));
    };
    if json {
        let inputs = vec![
            stepcast::provenance::Input::new(
                "old dataset",
                old_dir.display().to_string(),
                Some(old.fingerprint.clone()),
            ),
            stepcast::provenance::Input::new(
                "new dataset",
                new_dir.display().to_string(),
                Some(new.fingerprint.clone()),
            ),
        ];
        return super::stamp::print(&c, inputs);
    }
    for (what, d) in [("old", &old), ("new", &new)] {
        let timer = d.meta.protocol.as_ref().map_or("–", |p| p.timer.as_str());
        println!(
            "{what}: {} — {} — timer: {timer}",
            d.meta.name, d.meta.gpu.name
        );
    }
    println!(
        "{} points in both ({} only in the old, {} only in the new); new / old time:",
        c.common, c.only_old, c.only_new
    );
    for (title, groups) in [
        ("operator", &c.by_kind),
        ("operator, old time", &c.by_old_time),
    ] {
        let mut t = table(&[title, "points", "median", "p10", "p90"]);
        for g in groups {
            t.add_row(vec![
                g.label.clone(),
                g.points.to_string(),
                format!("{:.3}", g.median),
                format!("{:.3}", g.p10),
                format!("{:.3}", g.p90),
            ]);
        }
        align_numbers(&mut t, 1);
        println!("{t}");
    }
    Ok(())
}

/// What `datasets show` prints: the dataset's stamp and its rows per operator, phase and type.
#[derive(serde::Serialize)]
struct Summary<'a> {
    meta: &'a stepcast::dataset::DatasetMeta,
    fingerprint: &'a str,
    rows: usize,
    skipped: usize,
    groups: Vec<Group>,
}

/// Rows measured (and skipped: the point could not run) of one operator, phase and type.
#[derive(serde::Serialize)]
struct Group {
    operator: &'static str,
    phase: &'static str,
    dtype: &'static str,
    rows: usize,
    skipped: usize,
}

fn summarise(ds: &Dataset) -> Summary<'_> {
    let mut counts = std::collections::BTreeMap::new();
    for r in &ds.rows {
        let key = (
            r.query.op.name(),
            r.query.phase.name(),
            r.query.dtype.name(),
        );
        let e = counts.entry(key).or_insert((0usize, 0usize));
        if r.is_ok() {
            e.0 += 1
        } else {
            e.1 += 1
        }
    }
    let groups: Vec<Group> = counts
        .into_iter()
        .map(|((operator, phase, dtype), (rows, skipped))| Group {
            operator,
            phase,
            dtype,
            rows,
            skipped,
        })
        .collect();
    Summary {
        meta: &ds.meta,
        fingerprint: &ds.fingerprint,
        rows: groups.iter().map(|g| g.rows).sum(),
        skipped: groups.iter().map(|g| g.skipped).sum(),
        groups,
    }
}

fn format_name(f: ImportFormat) -> &'static str {
    match f {
        ImportFormat::EstimateTrainTime => "estimate-train-time",
        ImportFormat::Aiconfigurator => "aiconfigurator",
    }
}
