//! `stepcast runs import [--format megatron-log|megatron-bridge] LOG… --cluster C --out
//! RUNS.csv`: one row per training log appended to a runs CSV (the architecture each run's
//! arguments or configuration describe written beside it), ready for `stepcast calibrate
//! RUNS.csv --cluster C`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use stepcast::calibrate::megatron_log::{self, ImportOptions, COLUMNS};
use stepcast::hardware::Cluster;
use stepcast::Error;

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Make runs-CSV rows of training logs (Megatron-LM's, or Megatron-Bridge's with their
    /// configuration): the layout, precision and architecture from the argument dump rank 0
    /// prints (or the configuration), the step time from the iteration lines past the
    /// warm-up, the peak reserved memory from the memory reports.
    Import(ImportArgs),
}

/// Training log formats `runs import` reads.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Megatron-LM's `pretrain_gpt.py` output: the `---- arguments ----` dump and the
    /// `elapsed time per iteration (ms)` lines; Megatron-DeepSpeed's too (its ZeRO stage and
    /// precision from the DeepSpeed engine's printed configuration, a `deepspeed` row).
    MegatronLog,
    /// Megatron-Bridge's (NeMo 2's) training output, its iteration lines Megatron-LM's, with
    /// the run's configuration from `--config` (the YAML `--dryrun` prints or
    /// `logger.save_config_filepath` saves) and its GPUs from `--gpus`.
    MegatronBridge,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The logs' format.
    #[arg(long, value_enum, default_value = "megatron-log")]
    pub format: LogFormat,
    /// Training logs, one run each: the job's output (rank 0 prints the arguments, the last
    /// rank the iteration lines; where each rank writes its own file, give the two
    /// concatenated).
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// With `--format megatron-bridge`: the runs' configuration (Megatron-Bridge's
    /// ConfigContainer YAML).
    #[arg(long, value_name = "CONFIG.yaml")]
    pub config: Option<PathBuf>,
    /// With `--format megatron-bridge`: the GPUs the runs used (the configuration does not say).
    #[arg(long)]
    pub gpus: Option<u64>,
    /// The cluster the runs ran on (a built-in name or a cluster file).
    #[arg(long)]
    pub cluster: String,
    /// The runs CSV to append to (created with a header where it does not exist).
    #[arg(long, value_name = "RUNS.csv")]
    pub out: PathBuf,
    /// A preset or architecture file every log ran, instead of the architecture written from
    /// each log's arguments.
    #[arg(long)]
    pub model: Option<String>,
    /// The source set the rows are reported under.
    #[arg(long, default_value = "mine")]
    pub set: String,
    /// The model family (grouped cross-validation leaves one out at a time) [the model's
    /// name].
    #[arg(long)]
    pub family: Option<String>,
    /// Iteration lines ending at or before this iteration are warm-up and left out (the
    /// first steps compile, allocate and tune).
    #[arg(long, default_value_t = 10)]
    pub warmup_iterations: u64,
}

pub fn run(cmd: RunsCommand) -> anyhow::Result<()> {
    match cmd {
        RunsCommand::Import(args) => import(args),
    }
}

fn import(args: ImportArgs) -> anyhow::Result<()> {
    let bridge_args = bridge_arguments(&args)?;
    // the cluster and a named model as the CSV will name them, each checked first
    Cluster::load(Path::new(&args.cluster))?;
    let cluster = as_csv_names_it(&args.cluster)?;
    let model = match &args.model {
        Some(m) => {
            if !Path::new(m).is_file() {
                stepcast::workload::Arch::resolve(m)?;
            }
            Some(as_csv_names_it(m)?)
        }
        None => None,
    };
    let options = ImportOptions {
        set: args.set.clone(),
        family: args.family.clone(),
        cluster,
        model,
        warmup_iterations: args.warmup_iterations,
    };
    // every log is read before anything is written: one bad log writes no row
    let mut imported = Vec::new();
    for log in &args.logs {
        let text = stepcast::fsutil::read_to_string(log)?;
        let mut parsed = megatron_log::parse(&text);
        if let Some(config) = &bridge_args {
            parsed.args = config.clone();
        }
        let mut run =
            megatron_log::import(&parsed, &options).map_err(|message| Error::BadFile {
                path: log.clone(),
                message,
            })?;
        let source = format!("{}: {}", log.display(), run.columns["source"]);
        run.columns.insert("source", source);
        imported.push((log, run));
    }
    let dir = stepcast::fsutil::dir_of(&args.out);
    let archs: Vec<_> = imported
        .iter()
        .filter_map(|(_, run)| run.arch.as_ref())
        .collect();
    // an architecture file in the way refuses the import before anything is written
    for arch in &archs {
        arch_file(dir, arch)?;
    }
    // the CSV is locked before the architectures its rows name are written beside it (and
    // looked at again): another import into it is refused until both are written
    let mut csv = LockedCsv::open(&args.out)?;
    for arch in &archs {
        if let Some((path, text)) = arch_file(dir, arch)? {
            stepcast::fsutil::write_atomic(&path, text.as_bytes())?;
        }
    }
    let first_line = csv.append(imported.iter().map(|(_, run)| &run.columns).collect())?;
    for (i, (log, run)) in imported.iter().enumerate() {
        let c = &run.columns;
        let memory = c
            .get("measured_memory_gib")
            .map(|g| format!(", peak reserved {g} GiB"))
            .unwrap_or_default();
        println!(
            "{}: {} — {:.3} s a step ({}, iterations {}–{}){memory}{} \
             → {} line {}",
            log.display(),
            c["label"],
            run.step_ms / 1e3,
            megatron_log::intervals_phrase(run.intervals_used),
            run.iterations.0,
            run.iterations.1,
            if c["expressible"] == "true" {
                ""
            } else {
                " (kept, not expressible)"
            },
            args.out.display(),
            first_line + i,
        );
    }
    println!(
        "next: stepcast calibrate {} --cluster {} --check (how far predict is off on them), \
         then without --check to fit",
        args.out.display(),
        args.cluster
    );
    Ok(())
}

/// With `--format megatron-bridge`, the run's configuration read as the argument dump its logs
/// do not print; none for Megatron-LM's logs, which print it.
fn bridge_arguments(args: &ImportArgs) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let needs = "--format megatron-bridge needs --config CONFIG.yaml (the run's ConfigContainer \
                 YAML, as --dryrun prints it or logger.save_config_filepath saves it) and --gpus \
                 N (the GPUs the run used)";
    match (args.format, &args.config, args.gpus) {
        (LogFormat::MegatronLog, None, None) => Ok(None),
        (LogFormat::MegatronLog, ..) => Err(Error::Invalid(
            "--config and --gpus are read with --format megatron-bridge: Megatron-LM's logs \
             print their arguments themselves; drop them"
                .into(),
        )
        .into()),
        (LogFormat::MegatronBridge, Some(config), Some(gpus)) => {
            stepcast::limits::check_range("--gpus", "gpus", gpus as f64, 1.0..=1e6, "")
                .map_err(Error::Invalid)?;
            let text = stepcast::fsutil::read_to_string(config)?;
            let dump = megatron_log::args_of_bridge_config(&text, gpus).map_err(|message| {
                Error::BadFile {
                    path: config.clone(),
                    message,
                }
            })?;
            Ok(Some(dump))
        }
        (LogFormat::MegatronBridge, ..) => Err(Error::Invalid(needs.into()).into()),
    }
}

/// A cluster or model as the runs CSV names it: a built-in name as given, a file by its
/// absolute path (the CSV resolves relative paths against its own directory, not the
/// current one).
fn as_csv_names_it(name: &str) -> anyhow::Result<String> {
    let path = Path::new(name);
    if !path.is_file() {
        return Ok(name.to_string());
    }
    Ok(std::fs::canonicalize(path)
        .map_err(|e| Error::io(path, e))?
        .display()
        .to_string())
}

/// The file an architecture the arguments describe is written to, `archs/NAME.yaml` beside the
/// CSV, and its text; none where that file already says the same, refused where it says
/// something else.
fn arch_file(
    dir: &Path,
    arch: &stepcast::workload::ArchSpec,
) -> anyhow::Result<Option<(PathBuf, String)>> {
    let path = dir.join("archs").join(format!("{}.yaml", arch.name));
    let text = format!(
        "# written by `stepcast runs import` from a Megatron log's arguments\n{}",
        serde_norway::to_string(arch)?
    );
    match std::fs::read_to_string(&path) {
        Ok(existing) if existing == text => Ok(None),
        Ok(_) => Err(Error::BadFile {
            path,
            message: "exists and describes another architecture under this name: move it, or \
                      write the runs CSV elsewhere"
                .into(),
        }
        .into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some((path, text))),
        Err(e) => Err(Error::io(&path, e).into()),
    }
}

/// A runs CSV open for appending, locked until dropped: two imports into one file must not
/// both write a header, nor one replace an architecture file between the other's check of it
/// and its rows.
struct LockedCsv {
    path: PathBuf,
    file: std::fs::File,
    /// What the file held when it was opened.
    text: String,
    /// Its columns (`COLUMNS` where the file is new), every column a row needs among them.
    header: Vec<String>,
    /// Whether the file is new: the header is written before the rows.
    new: bool,
}

impl LockedCsv {
    /// Opens (or creates) the runs CSV at `path`, locks it and reads its header; another
    /// import holding it is refused at once, and so is a file without the columns a row needs.
    fn open(path: &Path) -> anyhow::Result<LockedCsv> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::bad_file(
                    path,
                    "another stepcast is appending to this file: wait for it to finish",
                )
                .into())
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, e).into()),
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a runs CSV ({e})"),
        })?;
        // a file of empty lines is a new one (a CSV reader skips them)
        let new = text.chars().all(|c| c == '\n' || c == '\r');
        let header: Vec<String> = if new {
            COLUMNS.iter().map(|c| c.to_string()).collect()
        } else {
            let mut reader = csv::Reader::from_reader(text.as_bytes());
            let header: Vec<String> = reader
                .headers()
                .map_err(|e| Error::BadFile {
                    path: path.to_path_buf(),
                    message: format!("not a runs CSV ({e})"),
                })?
                .iter()
                .map(str::to_string)
                .collect();
            let missing: Vec<&str> = COLUMNS
                .iter()
                .copied()
                .filter(|c| !header.iter().any(|h| h == c))
                .collect();
            if !missing.is_empty() {
                return Err(Error::BadFile {
                    path: path.to_path_buf(),
                    message: format!(
                        "has no column {}: write the imported runs to a new file with --out",
                        missing.join(", ")
                    ),
                }
                .into());
            }
            header
        };
        Ok(LockedCsv {
            path: path.to_path_buf(),
            file,
            text,
            header,
            new,
        })
    }

    /// Appends `rows` in the header's column order (a new file, or one of empty lines, gets
    /// `COLUMNS` first), flushed to disk; returns the line the first row is written on.
    fn append(&mut self, rows: Vec<&BTreeMap<&'static str, String>>) -> anyhow::Result<usize> {
        let (path, text, header, new) = (&self.path, &self.text, &self.header, self.new);
        let mut out = Vec::new();
        // a last line without its newline (as an editor may leave it) is ended first
        if !text.is_empty() && !text.ends_with('\n') {
            out.push(b'\n');
        }
        {
            let mut w = csv::WriterBuilder::new().from_writer(&mut out);
            if new {
                w.write_record(header)?;
            }
            for row in &rows {
                w.write_record(
                    header
                        .iter()
                        .map(|h| row.get(h.as_str()).map_or("", String::as_str)),
                )?;
            }
            w.flush()?;
        }
        self.file
            .write_all(&out)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| Error::io(path, e))?;
        Ok(text.lines().count() + usize::from(new) + 1)
    }
}
