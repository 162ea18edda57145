//! `stepcast models show <dir>`, `stepcast models repack <dir>`.

use std::path::PathBuf;

use clap::Subcommand;

use super::output::{align_numbers, bytes, pct, table};
use stepcast::hardware::Calibrations;
use stepcast::regress::ModelSet;

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// List the models of a directory with their provenance and validation error.
    Show {
        /// Models directory, e.g. models/perlmutter.
        dir: PathBuf,
        /// Print the manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a models directory in this version's layout: the same trees, with the tables
    /// this version stores beside them so predictions start faster (models trained by an earlier
    /// version predict the same either way).
    Repack {
        /// Models directory, e.g. models/perlmutter.
        dir: PathBuf,
    },
    /// On a GPU node: compare its software and timings with a cluster's models (runs
    /// `stepcast-bench check --cluster <file>`; exit code 3 when something drifted).
    #[command(disable_help_flag = true)]
    Check {
        /// Passed to `stepcast-bench check` as they are (`stepcast models check --help` lists
        /// them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

pub fn run(cmd: ModelsCommand) -> anyhow::Result<()> {
    match cmd {
        ModelsCommand::Check { .. } => unreachable!("dispatched to stepcast-bench by cli::run"),
        ModelsCommand::Repack { dir } => {
            let before = ModelSet::open(&dir)?.fingerprint().to_string();
            let m = ModelSet::repack(&dir)?;
            let after = ModelSet::open(&dir)?.fingerprint().to_string();
            println!(
                "repacked {} models of {} (fingerprint {before} → {after})",
                m.models.len(),
                dir.display()
            );
            Ok(())
        }
        ModelsCommand::Show { dir, json } => {
            let m = ModelSet::checked_manifest(&dir)?;
            let set = ModelSet::open(&dir)?;
            if json {
                let mut doc = serde_json::to_value(&m)?;
                if let Some(fields) = doc.as_object_mut() {
                    fields.insert(
                        "calibrations".into(),
                        serde_json::to_value(&set.calibrations.clusters)?,
                    );
                }
                return super::stamp::print(&doc, vec![super::stamp::models(&set)]);
            }
            println!(
                "models: {} (fingerprint {})",
                dir.display(),
                set.fingerprint()
            );
            println!("GPU: {}", m.gpu.name);
            println!(
                "trained {} by stepcast {} from '{}' (fingerprint {}, collected {})",
                m.created_at,
                m.stepcast_version,
                m.dataset.name,
                m.dataset.fingerprint,
                m.dataset.collected_at
            );
            println!("source: {}", m.dataset.source.description);
            if let Some(repo) = &m.dataset.source.repository {
                println!(
                    "        {repo} @ {} ({})",
                    m.dataset.source.commit.as_deref().unwrap_or("?"),
                    m.dataset
                        .source
                        .license
                        .as_deref()
                        .unwrap_or("licence unknown")
                );
            }
            let sw = &m.dataset.software;
            let stamp: Vec<String> = [
                ("driver", &sw.driver),
                ("CUDA", &sw.cuda),
                ("cuBLAS", &sw.cublas),
                ("NCCL", &sw.nccl),
                ("torch", &sw.torch),
                ("framework", &sw.framework),
                ("attention", &sw.attention_backend),
            ]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
            .collect();
            println!(
                "software: {}",
                if stamp.is_empty() {
                    "unknown".to_string()
                } else {
                    stamp.join(", ")
                }
            );
            println!(
                "feature schema v{}, model format v{}",
                m.feature_schema_version, m.format_version
            );
            let mut t = table(&[
                "model",
                "recipe",
                "rows",
                "val MAPE %",
                "val p90 %",
                "80% interval",
                "nodes",
                "size",
            ]);
            let mut total = 0;
            for e in &m.models {
                total += e.bytes;
                let mut name = e.key.to_string();
                if !e.serves_roles.is_empty() {
                    let roles: Vec<&str> = e.serves_roles.iter().map(|r| r.name()).collect();
                    name.push_str(&format!(" (+{})", roles.join(",")));
                }
                let v = &e.validation;
                t.add_row(vec![
                    name,
                    e.recipe.clone(),
                    e.training_rows.to_string(),
                    pct(v.mape_percent),
                    pct(v.p90_ape_percent),
                    format!(
                        "{:+.1}%..{:+.1}%",
                        (v.log_residual_p10.exp() - 1.0) * 100.0,
                        (v.log_residual_p90.exp() - 1.0) * 100.0
                    ),
                    e.nodes.to_string(),
                    bytes(e.bytes),
                ]);
            }
            align_numbers(&mut t, 2);
            println!("{t}");
            println!("{} models, {}", m.models.len(), bytes(total));
            print_calibrations(&set.calibrations);
            Ok(())
        }
    }
}

/// The runtimes `stepcast calibrate` fitted next to these models: per cluster (and framework),
/// on how many runs, how well (raw and grouped cross-validation), and the fitted values.
fn print_calibrations(c: &Calibrations) {
    if c.clusters.is_empty() {
        println!(
            "no calibration: steps on these models compose under each cluster's runtime defaults \
             (`stepcast calibrate` fits one to measured runs)"
        );
        return;
    }
    let mut t = table(&[
        "cluster",
        "framework",
        "runs",
        "raw mean / bias %",
        "CV mean / max / bias %",
        "launch µs",
        "collective µs",
        "in-situ",
        "contention",
        "per-step ms",
        "FA2",
        "at a bound",
        "fitted",
    ]);
    for e in &c.clusters {
        let r = &e.runtime;
        let cv = e
            .cross_validated
            .as_ref()
            .map_or("one family".to_string(), |s| {
                format!(
                    "{:.1} / {:.1} / {:+.1}",
                    s.mean_abs_percent, s.max_abs_percent, s.bias_percent
                )
            });
        t.add_row(vec![
            e.cluster.clone(),
            e.framework.clone().unwrap_or_else(|| "any".into()),
            e.fitted_on.runs.to_string(),
            format!("{:.1} / {:+.1}", e.raw.mean_abs_percent, e.raw.bias_percent),
            cv,
            format!("{:.0}", r.launch_us),
            format!("{:.0}", r.collective_launch_us),
            format!("{:.3}", r.in_situ_efficiency),
            format!("{:.2}", r.contention),
            format!("{:.1}", r.step_overhead_ms),
            format!("{:.2}", r.flash_attention_2_efficiency),
            if e.at_bound.is_empty() {
                "–".into()
            } else {
                e.at_bound.join(", ")
            },
            format!("{}, stepcast {}", e.created_at, e.stepcast),
        ]);
    }
    println!(
        "calibrations (calibration.yaml; a cluster file's models.calibration_from borrows one):"
    );
    println!("{t}");
    // what each fit has seen: a prediction outside it says so
    for e in &c.clusters {
        let under = e
            .framework
            .as_ref()
            .map(|f| format!(" under {f}"))
            .unwrap_or_default();
        if let Some(range) = &e.fitted_on.range {
            println!("  {}{under} fitted on {}", e.cluster, range.summary());
        }
        if let Some(held_out) = e.held_out_summary() {
            println!("  {}{under} {held_out}", e.cluster);
        }
        // the training types whose predictions take a spread of their own
        let own: Vec<String> = e
            .cross_validated_by_dtype
            .iter()
            .filter(|(_, s)| s.runs >= stepcast::hardware::MIN_RUNS_OF_A_TYPE)
            .map(|(d, s)| format!("{d} {:.1} % of {} runs", s.mean_abs_percent, s.runs))
            .collect();
        if !own.is_empty() {
            println!(
                "  {}{under} grouped cross-validation per training type, each its predictions' \
                 own spread: {} mean |error|",
                e.cluster,
                own.join(", ")
            );
        }
    }
}
