//! `stepcast models show <dir>`, `stepcast models repack <dir>`.

use std::path::PathBuf;

use clap::Subcommand;

use super::output::{align_numbers, bytes, pct, table};
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
                return super::stamp::print(&m, vec![super::stamp::models(&set)]);
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
            Ok(())
        }
    }
}
