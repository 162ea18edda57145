//! Command-line interface: argument types (clap) and one module per command.

mod bench;
mod calibrate;
mod chart;
mod datasets;
mod docs;
mod eval;
mod export;
mod graphs;
mod layout;
mod memory;
mod models;
mod output;
mod plot;
mod predict;
mod report;
mod run;
mod runs;
mod search;
mod stamp;
#[cfg(test)]
mod test_support;
mod train;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "stepcast",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("STEPCAST_COMMIT"), ")"),
    about = "Predict the step time of distributed LLM training from per-operator models",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Print tables as wide as their content instead of wrapping them to the terminal.
    #[arg(long, global = true)]
    pub wide: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Predict the step time of a model on a cluster under a parallel layout.
    Predict(Box<predict::PredictArgs>),
    /// Project the memory each GPU of a layout needs, and whether it fits.
    Memory(Box<memory::MemoryArgs>),
    /// Find the best layouts of a model on N GPUs at a global batch.
    Search(Box<search::SearchArgs>),
    /// A run's effective training time ratio, end-to-end time and best checkpoint interval
    /// from a known step time (MoFa's fault-tolerance model).
    Ettr(run::EttrArgs),
    /// Work with measurement datasets.
    #[command(subcommand)]
    Datasets(datasets::DatasetsCommand),
    /// Train one model per operator kind and phase from a dataset.
    Train(train::TrainArgs),
    /// Measure models' error on a dataset (refitting their recipes on a split).
    Eval(eval::EvalArgs),
    /// Fit the runtime (host issue cost, in-situ efficiency, contention, per-step overhead,
    /// FlashAttention-2 efficiency) of a cluster's models to measured training runs,
    /// cross-validated by model family.
    Calibrate(Box<calibrate::CalibrateArgs>),
    /// Measured training runs for `calibrate`: `stepcast runs import LOG… --cluster C --out
    /// RUNS.csv` makes runs-CSV rows of Megatron-LM (Megatron-DeepSpeed, Megatron-Bridge), NeMo 2
    /// and torchtitan training logs.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Inspect trained models, or check them against this machine.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// The GPU harness: `stepcast bench collect --out <dir>`, `stepcast bench plan` (runs
    /// stepcast-bench; see `stepcast bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// A stepcast-bench command and its arguments, passed as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Re-collect what drifted on this GPU node and retrain the cluster's models (runs
    /// `stepcast-bench retrain`).
    #[command(disable_help_flag = true)]
    Retrain {
        /// Passed to `stepcast-bench retrain` as they are (`stepcast retrain --help` lists
        /// them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A predicted layout as a framework's launch: Megatron-LM arguments, a NeMo 2.0 recipe or
    /// a torchtitan job configuration.
    Export(Box<export::ExportArgs>),
    /// Print a shell completion script: `stepcast completions bash > ~/.local/share/bash-completion/completions/stepcast`.
    Completions(docs::CompletionsArgs),
    /// Print the man page, or write one per command with --out DIR.
    Man(docs::ManArgs),
}

/// A value parser for a library enum users write by name: its names as the possible values,
/// each with its one-line help, so the library needs no clap.
pub fn named<T>() -> impl clap::builder::TypedValueParser<Value = T>
where
    T: stepcast::named::Named + std::str::FromStr + Clone + Send + Sync,
{
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        T::ALL
            .iter()
            .map(|v| PossibleValue::new(v.name()).help(v.help())),
    )
    .map(|s| {
        s.parse::<T>()
            .unwrap_or_else(|_| unreachable!("clap admits only the names it was given"))
    })
}

/// A value parser for a switch written `--flag`, `--flag true|false` or, as NeMo's and
/// Megatron's users write them, `--flag on|off`.
pub fn switch() -> impl clap::builder::TypedValueParser<Value = bool> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(["true", "false", "on", "off"]).map(|s| s == "true" || s == "on")
}

/// `--version`: the version, the commit and the fingerprint of every built-in models set (the
/// same fingerprint `models show` and every JSON output's provenance give).
pub fn long_version() -> String {
    let mut text = format!(
        "{} (commit {})\nbuilt-in models:",
        stepcast::provenance::VERSION,
        stepcast::provenance::COMMIT
    );
    for (name, bytes) in stepcast::assets::MODELS {
        let fingerprint = stepcast::regress::bundle::fingerprint(bytes);
        text += &format!(
            "\n  {name:<20} fingerprint {}",
            fingerprint.as_deref().unwrap_or("(not a models file)")
        );
    }
    text
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    output::set_wide(cli.wide);
    match cli.command {
        Command::Predict(args) => predict::run(*args),
        Command::Memory(args) => memory::run(*args),
        Command::Search(args) => search::run(*args),
        Command::Ettr(args) => run::run_ettr(args),
        Command::Datasets(cmd) => datasets::run(cmd),
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Calibrate(args) => calibrate::run(*args),
        Command::Runs(cmd) => runs::run(cmd),
        Command::Models(models::ModelsCommand::Check { args }) => {
            bench::run(&[vec!["check".to_string()], args].concat())
        }
        Command::Models(cmd) => models::run(cmd),
        Command::Bench { args } => bench::run(&args),
        Command::Retrain { args } => bench::run(&[vec!["retrain".to_string()], args].concat()),
        Command::Export(args) => export::run(*args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every command, all the way down, with its `--help` line; the ones
    /// that have none, named by their command path.
    fn arguments_without_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            arguments_without_help(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    /// `stepcast predict -h` and the man pages list every flag with a line saying what it is:
    /// a flag with an empty line there (`--tp`, as it once was) fails here.
    #[test]
    fn every_argument_of_every_command_says_what_it_is() {
        let mut missing = Vec::new();
        arguments_without_help(&super::Cli::command(), "stepcast", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
