//! Command-line interface: argument types (clap) and one module per command.

mod datasets;
mod eval;
mod models;
mod output;
mod predict;
mod train;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "stepcast",
    version,
    about = "Predict the step time of distributed LLM training from per-operator models",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Predict the step time of a model on a cluster under a parallel layout.
    Predict(Box<predict::PredictArgs>),
    /// Work with measurement datasets.
    #[command(subcommand)]
    Datasets(datasets::DatasetsCommand),
    /// Train one model per operator kind and phase from a dataset.
    Train(train::TrainArgs),
    /// Measure models' error on a dataset (refitting their recipes on a split).
    Eval(eval::EvalArgs),
    /// Inspect trained models.
    #[command(subcommand)]
    Models(models::ModelsCommand),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Predict(args) => predict::run(*args),
        Command::Datasets(cmd) => datasets::run(cmd),
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Models(cmd) => models::run(cmd),
    }
}
