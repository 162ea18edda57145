//! `stepcast runs import [--format megatron-log|megatron-bridge|nemo|torchtitan] LOG… --cluster C
//! --out RUNS.csv`: one row per training log appended to a runs CSV (the architecture each
//! Megatron run's arguments or configuration describe written beside it), ready for
//! `stepcast calibrate RUNS.csv --cluster C`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use stepcast::calibrate::megatron_log::{self, ImportOptions, COLUMNS};
use stepcast::calibrate::{nemo_log, torchtitan_log};
use stepcast::hardware::Cluster;
use stepcast::Error;

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Make runs-CSV rows of training logs (Megatron-LM's, or Megatron-Bridge's, NeMo 2's or
    /// torchtitan's with their configuration): the layout, precision and architecture from the
    /// argument dump rank 0 prints (or the configuration), the step time from the iteration
    /// lines past the warm-up, the peak reserved memory from the memory reports.
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
    /// NeMo 2's training output (its `… | train_step_timing in s: 1.234` progress lines, or
    /// its progress bar's), with the NeMo-Run task's configuration from `--config` (the
    /// `<task>_config.yaml` NeMo-Run saves) and the model from its config class or `--model`.
    Nemo,
    /// torchtitan's training output (rank 0's `step: N … memory: M GiB … tps: T` lines), with
    /// the job's TOML from `--config` and its GPUs from `--gpus`.
    Torchtitan,
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
    /// ConfigContainer YAML); with `--format nemo`, the NeMo-Run task's `<task>_config.yaml`;
    /// with `--format torchtitan`, the job's TOML.
    #[arg(long, value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// With `--format megatron-bridge` or `torchtitan`: the GPUs the runs used (the
    /// configuration does not say); with `--format nemo`, where `trainer.devices` is not a
    /// count (checked against it where it is).
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
    let source = source(&args, &options)?;
    // every log is read before anything is written: one bad log writes no row
    let mut imported = Vec::new();
    for log in &args.logs {
        let text = stepcast::fsutil::read_to_string(log)?;
        let run = match &source {
            Source::Megatron(config) => {
                let mut parsed = megatron_log::parse(&text);
                if let Some(config) = config {
                    parsed.args = config.clone();
                }
                megatron_log::import(&parsed, &options)
            }
            Source::Nemo(task) => nemo_log::import(&nemo_log::parse(&text), task, &options),
            Source::Torchtitan(job) => torchtitan_log::import(&torchtitan_log::parse(&text), job),
        };
        let mut run = run.map_err(|message| Error::BadFile {
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
    let filled: Vec<&str> = COLUMNS
        .iter()
        .copied()
        // a file without `reason` takes rows that fill it: their source says it too
        .filter(|&c| c != "reason")
        .filter(|c| imported.iter().any(|(_, run)| run.columns.contains_key(c)))
        .collect();
    let mut csv = LockedCsv::open(&args.out, &filled)?;
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

/// Where a log's layout comes from: Megatron-LM's own argument dump, or a Megatron-Bridge
/// configuration read as that dump; a NeMo-Run task; the layout of torchtitan's job on its GPUs.
enum Source {
    Megatron(Option<BTreeMap<String, String>>),
    Nemo(nemo_log::Task),
    Torchtitan(torchtitan_log::Job),
}

/// The logs' layout source for `--format`, with `--config` and `--gpus` read and checked: a
/// refusal of what the configuration sets names its file, not a log's.
fn source(args: &ImportArgs, options: &ImportOptions) -> anyhow::Result<Source> {
    let gpus = |gpus: u64| {
        stepcast::limits::check_range("--gpus", "gpus", gpus as f64, 1.0..=1e6, "")
            .map_err(Error::Invalid)
    };
    let bad_config = |path: &PathBuf| {
        let path = path.clone();
        move |message| Error::BadFile { path, message }
    };
    match (args.format, &args.config, args.gpus) {
        (LogFormat::MegatronLog, None, None) => Ok(Source::Megatron(None)),
        (LogFormat::MegatronLog, ..) => Err(Error::Invalid(
            "--config and --gpus are read with --format megatron-bridge, nemo or torchtitan: \
             Megatron-LM's logs print their arguments themselves; drop them"
                .into(),
        )
        .into()),
        (LogFormat::MegatronBridge, Some(config), Some(n)) => {
            gpus(n)?;
            let text = stepcast::fsutil::read_to_string(config)?;
            let dump = megatron_log::args_of_bridge_config(&text, n).map_err(bad_config(config))?;
            Ok(Source::Megatron(Some(dump)))
        }
        (LogFormat::MegatronBridge, ..) => Err(Error::Invalid(
            "--format megatron-bridge needs --config CONFIG.yaml (the run's ConfigContainer \
             YAML, as --dryrun prints it or logger.save_config_filepath saves it) and --gpus \
             N (the GPUs the run used)"
                .into(),
        )
        .into()),
        (LogFormat::Nemo, Some(config), n) => {
            if let Some(n) = n {
                gpus(n)?;
            }
            let text = stepcast::fsutil::read_to_string(config)?;
            let resolve =
                |model: &str| stepcast::workload::Arch::resolve(model).map_err(|e| e.to_string());
            let task = nemo_log::task(&text, n, options.model.as_deref(), resolve)
                .map_err(bad_config(config))?;
            Ok(Source::Nemo(task))
        }
        (LogFormat::Nemo, None, _) => Err(Error::Invalid(
            "--format nemo needs --config TASK_config.yaml (the task's configuration NeMo-Run \
             saves in the experiment's configs folder)"
                .into(),
        )
        .into()),
        (LogFormat::Torchtitan, Some(config), Some(n)) => {
            gpus(n)?;
            let text = stepcast::fsutil::read_to_string(config)?;
            let layers = |model: &str| {
                stepcast::workload::Arch::resolve(model)
                    .map(|a| a.layers)
                    .map_err(|e| e.to_string())
            };
            let job = torchtitan_log::parse_config(&text)
                .and_then(|job| torchtitan_log::job(&job, n, layers, options))
                .map_err(bad_config(config))?;
            Ok(Source::Torchtitan(job))
        }
        (LogFormat::Torchtitan, ..) => Err(Error::Invalid(
            "--format torchtitan needs --config JOB.toml (the job configuration the run was \
             launched with, --job.config_file) and --gpus N (the GPUs the run used)"
                .into(),
        )
        .into()),
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
    /// import holding it is refused at once, and so is a file without a column the rows fill
    /// (`filled`; a file written before a column was added takes rows that leave it empty).
    fn open(path: &Path, filled: &[&str]) -> anyhow::Result<LockedCsv> {
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
            let missing: Vec<&str> = filled
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

#[cfg(test)]
mod tests {
    use super::*;

    fn import_args(format: LogFormat, config: Option<&str>, gpus: Option<u64>) -> ImportArgs {
        ImportArgs {
            format,
            logs: vec!["run.log".into()],
            config: config.map(PathBuf::from),
            gpus,
            cluster: "dgx-h100".into(),
            out: "runs.csv".into(),
            model: None,
            set: "mine".into(),
            family: None,
            warmup_iterations: 10,
        }
    }

    /// Megatron-LM's logs print their arguments: `--config` and `--gpus` are refused with
    /// them and needed (both) with Megatron-Bridge's and torchtitan's.
    #[test]
    fn a_bridge_or_torchtitan_import_needs_its_configuration_and_gpus() {
        use LogFormat::*;
        let options = ImportOptions {
            set: "mine".into(),
            family: None,
            cluster: "dgx-h100".into(),
            model: None,
            warmup_iterations: 10,
        };
        let refused = |a: ImportArgs| match source(&a, &options) {
            Ok(_) => panic!("{:?} accepted", a.format),
            Err(e) => e.to_string(),
        };
        assert!(matches!(
            source(&import_args(MegatronLog, None, None), &options).unwrap(),
            Source::Megatron(None)
        ));
        for a in [
            import_args(MegatronLog, Some("c.yaml"), None),
            import_args(MegatronLog, None, Some(8)),
        ] {
            assert!(refused(a).contains("Megatron-LM's logs print their arguments"));
        }
        for (format, needs) in [
            (MegatronBridge, "--format megatron-bridge needs --config"),
            (Torchtitan, "--format torchtitan needs --config JOB.toml"),
        ] {
            for a in [
                import_args(format, None, None),
                import_args(format, Some("c.yaml"), None),
                import_args(format, None, Some(8)),
            ] {
                assert!(refused(a).starts_with(needs), "{needs}");
            }
            let e = refused(import_args(format, Some("c.yaml"), Some(0)));
            assert!(e.contains("--gpus"), "{e}");
            let e = refused(import_args(format, Some("/nonexistent/c.yaml"), Some(8)));
            assert!(e.contains("/nonexistent/c.yaml"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job.toml");
        std::fs::write(&job, "[parallelism\n").unwrap();
        let e = refused(import_args(Torchtitan, job.to_str(), Some(8)));
        assert!(
            e.contains("job.toml") && e.contains("not a torchtitan job configuration"),
            "{e}"
        );
        // a layout the job sets that stepcast does not cost is the job file's fault
        std::fs::write(&job, "[parallelism]\ndata_parallel_replicate_degree = 2\n").unwrap();
        let e = refused(import_args(Torchtitan, job.to_str(), Some(8)));
        assert!(e.contains("job.toml") && e.contains("HSDP"), "{e}");
        std::fs::write(&job, "[model]\nname = \"llama3\"\nflavor = \"8B\"\n").unwrap();
        assert!(matches!(
            source(&import_args(Torchtitan, job.to_str(), Some(8)), &options).unwrap(),
            Source::Torchtitan(_)
        ));
    }

    #[test]
    fn a_file_is_named_by_its_absolute_path_and_a_built_in_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(as_csv_names_it("dgx-h100").unwrap(), "dgx-h100");
        let named = as_csv_names_it(file.to_str().unwrap()).unwrap();
        assert_eq!(
            Path::new(&named),
            std::fs::canonicalize(&file).unwrap().as_path()
        );
        assert!(Path::new(&named).is_absolute());
    }

    /// An architecture goes to `archs/NAME.yaml` beside the CSV: written where absent, left
    /// where the file says the same, refused where it says something else.
    #[test]
    fn an_architecture_file_is_written_once_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let arch = stepcast::workload::presets::preset("llama2-7b").unwrap();
        let (path, text) = arch_file(dir.path(), &arch).unwrap().expect("absent");
        assert_eq!(path, dir.path().join("archs/llama2-7b.yaml"));
        assert!(text.starts_with("# written by `stepcast runs import`"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        assert!(arch_file(dir.path(), &arch).unwrap().is_none());
        std::fs::write(&path, "name: other\n").unwrap();
        let e = arch_file(dir.path(), &arch).unwrap_err().to_string();
        assert!(
            e.contains("describes another architecture under this name"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(
            arch_file(dir.path(), &arch).is_err(),
            "a directory in its place"
        );
    }

    fn row(label: &str) -> BTreeMap<&'static str, String> {
        BTreeMap::from([("label", label.to_string()), ("tp", "2".to_string())])
    }

    /// A new file (or one of empty lines) gets the header first; an existing one keeps its
    /// column order, its unended last line is ended; each append says the line its first row
    /// is on; a second importer is refused while the first holds the file.
    #[test]
    fn rows_are_appended_under_the_file_s_own_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        let mut csv = LockedCsv::open(&path, &COLUMNS).unwrap();
        let e = LockedCsv::open(&path, &COLUMNS).err().unwrap().to_string();
        assert!(e.contains("another stepcast is appending"), "{e}");
        assert_eq!(csv.append(vec![&row("a"), &row("b")]).unwrap(), 2);
        drop(csv);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], COLUMNS.join(","));
        assert_eq!(lines.len(), 3);
        let at = |name: &str| COLUMNS.iter().position(|c| *c == name).unwrap();
        let cells: Vec<&str> = lines[2].split(',').collect();
        assert_eq!((cells[at("label")], cells[at("tp")]), ("b", "2"));
        assert_eq!(cells.len(), COLUMNS.len());

        // another order, a column of the user's own, no newline at the end
        let mut reordered: Vec<&str> = COLUMNS.iter().rev().copied().collect();
        reordered.push("note");
        std::fs::write(
            &path,
            format!("{}\n{}", reordered.join(","), ",".repeat(COLUMNS.len())),
        )
        .unwrap();
        let mut csv = LockedCsv::open(&path, &COLUMNS).unwrap();
        assert_eq!(csv.append(vec![&row("c")]).unwrap(), 3);
        drop(csv);
        let text = std::fs::read_to_string(&path).unwrap();
        let last: Vec<&str> = text.lines().nth(2).unwrap().split(',').collect();
        assert_eq!(last.len(), reordered.len());
        assert_eq!(
            last[reordered.iter().position(|c| *c == "label").unwrap()],
            "c"
        );

        std::fs::write(&path, "\n\n").unwrap();
        let mut csv = LockedCsv::open(&path, &COLUMNS).unwrap();
        assert_eq!(csv.append(vec![&row("d")]).unwrap(), 4);
        drop(csv);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().nth(2),
            Some(COLUMNS.join(",").as_str())
        );

        std::fs::write(&path, "set,family\nx,y\n").unwrap();
        let e = LockedCsv::open(&path, &COLUMNS).err().unwrap().to_string();
        assert!(e.contains("has no column label, cluster"), "{e}");
        // a file written before a column was added takes rows that leave it empty
        let before: Vec<&str> = COLUMNS
            .iter()
            .copied()
            .filter(|c| *c != "elementwise")
            .collect();
        std::fs::write(&path, format!("{}\n", before.join(","))).unwrap();
        let e = LockedCsv::open(&path, &COLUMNS).err().unwrap().to_string();
        assert!(e.contains("has no column elementwise:"), "{e}");
        let mut csv = LockedCsv::open(&path, &["label", "tp"]).unwrap();
        assert_eq!(csv.append(vec![&row("e")]).unwrap(), 2);
        drop(csv);
        std::fs::write(&path, [0xff, 0xfe, b'\n']).unwrap();
        let e = LockedCsv::open(&path, &COLUMNS).err().unwrap().to_string();
        assert!(e.contains("not a runs CSV"), "{e}");
    }
}
