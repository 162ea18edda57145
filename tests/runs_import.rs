//! `stepcast runs import`: a Megatron-LM log becomes a runs-CSV row that `calibrate` composes
//! exactly as `predict` composes the same layout, appended beside earlier rows; bad logs and
//! files are refused with the file named.

mod common;

use std::fs;
use std::path::Path;

use common::{assert_user_error, json_of, read_json, stderr, stdout, stepcast};

/// A Megatron-LM rank-0 log of Llama 3 8B (tp 2 · pp 2 · dp 4, sequence parallel, bf16,
/// distributed optimizer): the argument dump, five iteration lines (the first the warm-up,
/// the fourth with a skipped iteration; the others 2010, 2000 and 1990 ms) and two ranks'
/// memory reports.
fn llama3_8b_log() -> String {
    fs::read_to_string(common::repo("tests/data/megatron/llama3-8b-tp2-pp2.log")).unwrap()
}

/// `predict --json` of `model` under the log's layout.
fn predict(model: &str, extra: &[&str]) -> serde_json::Value {
    predict_under("megatron", model, extra)
}

/// `predict --json --framework FRAMEWORK` of `model` under the log's layout.
fn predict_under(framework: &str, model: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "predict",
        "--cluster",
        "dgx-h100",
        "--model",
        model,
        "--framework",
        framework,
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "4",
        "--micro-batch",
        "1",
        "--global-batch",
        "64",
        "--dtype",
        "bf16",
        "--sequence-parallel",
        "--json",
    ];
    args.extend_from_slice(extra);
    json_of(&stepcast(&args))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `calibrate CSV --cluster C --check`: its standard output and the first run of its JSON report
/// (written beside the CSV).
fn checked(csv: &Path, cluster: &str) -> (String, serde_json::Value) {
    let report = csv.with_file_name("check.json");
    let check = stepcast(&[
        "calibrate",
        s(csv),
        "--cluster",
        cluster,
        "--check",
        "--json",
        s(&report),
    ]);
    assert!(check.status.success(), "{}", stderr(&check));
    (stdout(&check), read_json(&report)["runs"][0].clone())
}

/// The step `calibrate --check` composed for `run` is the one `predict --json` gave.
fn assert_same_step(run: &serde_json::Value, predicted: &serde_json::Value) {
    let (a, b) = (
        run["cross_validated_s"].as_f64().unwrap(),
        predicted["step_time_s"].as_f64().unwrap(),
    );
    assert!((a / b - 1.0).abs() < 1e-9, "calibrate {a} s, predict {b} s");
}

#[test]
fn a_megatron_log_becomes_a_row_calibrate_composes_as_predict_does() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("llama.log");
    fs::write(&log, llama3_8b_log()).unwrap();
    let csv = tmp.path().join("runs").join("runs.csv");
    fs::create_dir_all(csv.parent().unwrap()).unwrap();
    let import = |logs: &[&Path]| {
        let mut args = vec!["runs", "import", "--cluster", "dgx-h100", "--out", s(&csv)];
        args.extend(logs.iter().map(|l| s(l)));
        stepcast(&args)
    };
    let out = import(&[&log]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("2.000 s a step (median of 3 logged intervals, iterations 20–50)")
            && text.contains("peak reserved 64.000 GiB")
            && text.contains("line 2"),
        "{text}"
    );
    let rows = fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 2, "{rows}");
    let arch = csv
        .parent()
        .unwrap()
        .join("archs/megatron-l32-h4096-a32g8-f14336-v128256.yaml");
    assert!(arch.is_file());

    // calibrate composes the row as predict composes the layout it names
    let (_, run) = checked(&csv, "dgx-h100");
    assert_eq!(run["measured_s"], 2.0);
    assert_eq!(run["memory"]["measured_gib"], 64.0);
    let predicted = predict(s(&arch), &["--grad-reduce-dtype", "fp32"]);
    assert_same_step(&run, &predicted);
    let b = predicted["step_time_s"].as_f64().unwrap();
    // the same architecture is the Llama 3 8B preset's
    let preset = predict("llama3-8b", &[]);
    assert!((preset["step_time_s"].as_f64().unwrap() / b - 1.0).abs() < 1e-9);

    // a second log appends a row and keeps the architecture file
    let second = tmp.path().join("second.log");
    let slower = llama3_8b_log()
        .replace("(ms): 2010.0", "(ms): 2510.0")
        .replace("(ms): 2000.0", "(ms): 2500.0")
        .replace("(ms): 1990.0", "(ms): 2490.0");
    fs::write(&second, slower).unwrap();
    let out = import(&[&second]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("2.500 s a step") && stdout(&out).contains("line 3"));
    let rows = fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 3, "{rows}");
    assert_eq!(rows.lines().filter(|l| l.starts_with("set,")).count(), 1);

    // runs of one model only fit, and say they cannot be cross-validated (no zero error)
    let fit = stepcast(&["calibrate", s(&csv), "--cluster", "dgx-h100", "--dry-run"]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let text = stdout(&fit);
    assert!(
        text.contains("no grouped cross-validation (one model family")
            && !text.contains("grouped cross-validation 0.0 %"),
        "{text}"
    );
}

/// `stepcast runs import ARGS… --cluster dgx-h100 --out OUT`.
fn import_to(out: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["runs", "import"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--cluster", "dgx-h100", "--out", s(out)]);
    stepcast(&all)
}

/// A Megatron-Bridge (NeMo 2) run: its log prints Megatron's iteration lines but no argument
/// dump; its configuration comes from the YAML, its GPUs from the flag. The same run as the
/// Megatron-LM log's makes the same row.
#[test]
fn a_megatron_bridge_log_with_its_configuration_is_the_same_run() {
    let tmp = tempfile::tempdir().unwrap();
    let full = llama3_8b_log();
    let (head, rest) = full
        .split_once("------------------------ arguments")
        .unwrap();
    let (_, tail) = rest
        .split_once("end of arguments ---------------------\n")
        .unwrap();
    let bridge_log = tmp.path().join("bridge.log");
    fs::write(&bridge_log, format!("{head}{tail}")).unwrap();
    let megatron_log = tmp.path().join("megatron.log");
    fs::write(&megatron_log, &full).unwrap();
    let config = common::repo("tests/data/megatron/llama3-8b-tp2-pp2.bridge.yaml");
    fn bridge<'a>(log: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        [&["--format", "megatron-bridge", log][..], extra].concat()
    }
    let bl = s(&bridge_log);
    let with_config = ["--config", config.as_str(), "--gpus", "16"];
    let (a, b) = (tmp.path().join("a.csv"), tmp.path().join("b.csv"));
    let out = import_to(&a, &[s(&megatron_log)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = import_to(&b, &bridge(bl, &with_config));
    assert!(out.status.success(), "{}", stderr(&out));
    let row = |p: &Path| {
        let text = fs::read_to_string(p).unwrap();
        let line = text.lines().nth(1).unwrap().to_string();
        // all but the source, which names the log
        line.rsplit_once(",\"")
            .map_or(line.clone(), |(row, _)| row.to_string())
    };
    assert_eq!(row(&a), row(&b));
    // a Bridge log alone is not enough, Megatron-LM's needs no configuration, and a
    // configuration that is not one is named
    assert_user_error(
        &import_to(&b, &bridge(bl, &[])),
        &["--config CONFIG.yaml", "--gpus N"],
    );
    assert_user_error(
        &import_to(&a, &[&[s(&megatron_log)][..], &with_config].concat()),
        &["--format megatron-bridge"],
    );
    assert_user_error(
        &import_to(
            &b,
            &bridge(bl, &["--config", s(&megatron_log), "--gpus", "16"]),
        ),
        &["megatron.log"],
    );
}

/// A NeMo 2 run: its log prints Lightning's progress lines, its layout is the NeMo-Run task's
/// configuration, its model the preset of the task's model config class. The same run as the
/// Megatron-LM log's (Llama 3 8B, tp 2 · pp 2 on 16 GPUs) makes a row of the same layout, which
/// calibrate composes as predict composes it under `--framework nemo`.
#[test]
fn a_nemo_log_with_its_task_configuration_is_the_same_run() {
    let tmp = tempfile::tempdir().unwrap();
    let megatron_log = tmp.path().join("megatron.log");
    fs::write(&megatron_log, llama3_8b_log()).unwrap();
    let nemo_log = common::repo("tests/data/megatron/llama3-8b-tp2-pp2.nemo.log");
    let config = common::repo("tests/data/megatron/llama3-8b-tp2-pp2.nemo_config.yaml");
    let nemo = [
        "--format",
        "nemo",
        nemo_log.as_str(),
        "--config",
        config.as_str(),
    ];
    let (a, b) = (tmp.path().join("a.csv"), tmp.path().join("b.csv"));
    let out = import_to(&a, &[s(&megatron_log)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = import_to(&b, &nemo);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("llama3-8b 16 GPUs tp2 pp2 cp1 dp4 mbs1 gbs64 BF16")
            && text.contains("2.000 s a step (median of 3 logged intervals, iterations 20–40)"),
        "{text}"
    );
    // every column of the layout is the Megatron-LM log's
    let rows = |p: &Path| {
        let mut reader = csv::Reader::from_path(p).unwrap();
        let header = reader.headers().unwrap().clone();
        let row = reader.records().next().unwrap().unwrap();
        header
            .iter()
            .zip(row.iter())
            .map(|(h, v)| (h.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<String, String>>()
    };
    let (megatron, nemo_row) = (rows(&a), rows(&b));
    for (column, value) in &megatron {
        match column.as_str() {
            "framework" => assert_eq!(nemo_row[column], "nemo"),
            "model" => assert_eq!(nemo_row[column], "llama3-8b"),
            "set" | "family" | "label" | "source" | "measured_memory_gib" | "memory_scope" => {}
            _ => assert_eq!(&nemo_row[column], value, "{column}"),
        }
    }
    let (_, run) = checked(&b, "dgx-h100");
    assert_eq!(run["measured_s"], 2.0);
    let predicted = predict_under("nemo", "llama3-8b", &["--grad-reduce-dtype", "fp32"]);
    assert_same_step(&run, &predicted);
    // the configuration is needed, and its faults are named in it
    assert_user_error(
        &import_to(&b, &["--format", "nemo", nemo_log.as_str()]),
        &["--format nemo needs --config TASK_config.yaml"],
    );
    assert_user_error(
        &import_to(&b, &[&nemo[..], &["--gpus", "8"]].concat()),
        &["llama3-8b-tp2-pp2.nemo_config.yaml", "is 16 GPUs, --gpus 8"],
    );
    let other = tmp.path().join("mistral_config.yaml");
    let text = fs::read_to_string(&config).unwrap();
    fs::write(&other, text.replace("Llama3Config8B", "MistralConfig7B")).unwrap();
    let mistral = ["--format", "nemo", nemo_log.as_str(), "--config", s(&other)];
    assert_user_error(
        &import_to(&b, &mistral),
        &["mistral_config.yaml", "\"MistralConfig7B\"", "--model"],
    );
    // the Megatron log is no NeMo log: no step line, named so
    assert_user_error(
        &import_to(
            &b,
            &[
                "--format",
                "nemo",
                s(&megatron_log),
                "--config",
                config.as_str(),
            ],
        ),
        &[
            "megatron.log",
            "no step line past iteration 10",
            "train_step_timing",
        ],
    );
}

/// rank 0's step line as torchtitan prints it (colors, a launcher prefix, thousands separators)
fn torchtitan_line(step: u64, tps: &str) -> String {
    format!(
        "[rank0]:[titan] 2025-06-01 12:00:00,000 - root - INFO - \u{1b}[31mstep: {step:2}  \
         \u{1b}[32mloss:  6.4012  \u{1b}[38;2;54;234;195mmemory: 41.27GiB(51.99%)  \
         \u{1b}[34mtps: {tps}  \u{1b}[36mtflops: 300.12  \u{1b}[35mmfu: 30.35%\u{1b}[39m"
    )
}

/// A torchtitan run of the job `stepcast export --format torchtitan` wrote for a layout (Llama
/// 3 8B, tp 2 · FSDP 4, micro-batch 2 accumulated twice): its log's tokens per second per GPU
/// become the step (32 · 8192 / (8 · 4,096) = 8 s at the median line), and calibrate composes the
/// row exactly as predict composes that layout for torchtitan.
#[test]
fn a_torchtitan_log_with_its_exported_job_is_the_layout_predict_costs() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = [
        "--cluster",
        "dgx-h100",
        "--model",
        "llama3-8b",
        "--tp",
        "2",
        "--dp",
        "4",
        "--micro-batch",
        "2",
        "--global-batch",
        "32",
        "--zero",
        "3",
        "--sequence-parallel",
    ];
    let job = tmp.path().join("job.toml");
    let out = stepcast(
        &[
            &["export", "--format", "torchtitan", "--out", s(&job)][..],
            &layout,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let log = tmp.path().join("titan.log");
    let lines = [
        torchtitan_line(1, "612"),
        torchtitan_line(10, "4,000"),
        torchtitan_line(20, "4,096"),
        torchtitan_line(30, "4,200"),
        torchtitan_line(40, "3,990"),
    ];
    fs::write(&log, lines.join("\n")).unwrap();
    let csv = tmp.path().join("runs.csv");
    let titan = ["--format", "torchtitan", s(&log), "--config", s(&job)];
    let out = import_to(&csv, &[&titan[..], &["--gpus", "8"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("llama3-8b 8 GPUs tp2 pp1 cp1 dp4 mbs2 gbs32 BF16 torchtitan FSDP")
            && text.contains("8.000 s a step (median of 3 logged intervals, iterations 20–40)")
            && text.contains("peak reserved 41.270 GiB"),
        "{text}"
    );
    let (_, run) = checked(&csv, "dgx-h100");
    assert_eq!(run["measured_s"], 8.0);
    let mut predict = vec!["predict"];
    predict.extend(layout);
    predict.extend([
        "--framework",
        "torchtitan",
        "--grad-reduce-dtype",
        "fp32",
        "--json",
    ]);
    let predicted = json_of(&stepcast(&predict));
    assert_same_step(&run, &predicted);
    // the GPUs must add up with the job's degrees: refused naming the job's file
    let seven = import_to(&csv, &[&titan[..], &["--gpus", "7"]].concat());
    assert_user_error(
        &seven,
        &["job.toml", "is 8 GPUs, not the 7 given", "--gpus"],
    );
    assert!(!stderr(&seven).contains("titan.log"), "{}", stderr(&seven));
    // a log without a step past the warm-up is the log's fault, named so
    let short = tmp.path().join("short.log");
    fs::write(&short, torchtitan_line(5, "4,096")).unwrap();
    let short_titan = ["--format", "torchtitan", s(&short), "--config", s(&job)];
    assert_user_error(
        &import_to(&csv, &[&short_titan[..], &["--gpus", "8"]].concat()),
        &[
            "short.log",
            "no step line past step 10",
            "--warmup-iterations",
        ],
    );
    // a configuration that is not TOML, or none, is named with the fix
    let not_toml = [
        "--format",
        "torchtitan",
        s(&log),
        "--config",
        s(&log),
        "--gpus",
        "8",
    ];
    assert_user_error(
        &import_to(&csv, &not_toml),
        &[
            "titan.log",
            "not a torchtitan job configuration",
            "--job.config_file",
        ],
    );
    assert_user_error(
        &import_to(&csv, &["--format", "torchtitan", s(&log), "--gpus", "8"]),
        &["--format torchtitan needs --config JOB.toml"],
    );
}

/// A Megatron-DeepSpeed run (GPT-2 style 1.3 B, tp 2 · pp 2 · dp 2, fp16, full recompute,
/// ZeRO 1 as DeepSpeed's configuration prints it) becomes a `deepspeed` row that calibrate
/// composes as predict composes the same layout on the DGX A100.
#[test]
fn a_megatron_deepspeed_log_becomes_a_deepspeed_row() {
    let tmp = tempfile::tempdir().unwrap();
    let log = common::repo("tests/data/megatron/gpt-1.3b-deepspeed.log");
    let csv = tmp.path().join("runs.csv");
    let out = stepcast(&[
        "runs",
        "import",
        &log,
        "--cluster",
        "dgx-a100",
        "--out",
        s(&csv),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("FP16 DeepSpeed ZeRO 1 — 1.000 s a step"),
        "{}",
        stdout(&out)
    );
    let rows = fs::read_to_string(&csv).unwrap();
    let row = rows.lines().nth(1).unwrap();
    assert!(row.contains(",deepspeed,2,2,2,1,"), "{row}");
    let (_, run) = checked(&csv, "dgx-a100");
    let arch = tmp
        .path()
        .join("archs/megatron-l24-h2048-a16-f8192-v50432.yaml");
    // the layout the row names, as predict's flags
    let mut args: Vec<&str> = "predict --cluster dgx-a100 --framework deepspeed --tp 2 --pp 2 \
         --dp 2 --micro-batch 4 --global-batch 64 --seq-len 1024 --dtype fp16 --recompute full \
         --zero 1 --grad-reduce-dtype fp16 --overlap-grad-reduce false \
         --overlap-param-gather false --json --model"
        .split_whitespace()
        .collect();
    args.push(s(&arch));
    assert_same_step(&run, &json_of(&stepcast(&args)));
}

/// A cluster without models (every kernel from the roofline): its runs are checked as
/// `predict` composes them and a fit can be shown, but nothing is written, since `predict`
/// reads a calibration from next to a cluster's models.
#[test]
fn runs_on_a_cluster_without_models_are_checked_against_the_roofline() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("runs.csv");
    fs::write(
        &csv,
        "set,family,label,cluster,model,tp,pp,dp,micro_batch,global_batch,seq_len,measured_step_s\n\
         mine,llama2-7b,llama2-7b dp8,mi300x,llama2-7b,1,1,8,1,64,4096,9.5\n",
    )
    .unwrap();
    let (text, run) = checked(&csv, "mi300x");
    assert!(text.contains("the cluster's defaults"), "{text}");
    let predict: Vec<&str> = "predict --cluster mi300x --model llama2-7b --dp 8 --micro-batch 1 \
         --global-batch 64 --seq-len 4096 --json"
        .split_whitespace()
        .collect();
    assert_same_step(&run, &json_of(&stepcast(&predict)));
    let dry = stepcast(&["calibrate", s(&csv), "--cluster", "mi300x", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert_user_error(
        &stepcast(&["calibrate", s(&csv), "--cluster", "mi300x"]),
        &["names no models", "--check", "--dry-run"],
    );
}

#[test]
fn bad_logs_and_files_are_refused_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("runs.csv");
    let good = tmp.path().join("good.log");
    fs::write(&good, llama3_8b_log()).unwrap();
    let import = |log: &Path, extra: &[&str]| {
        let mut args = vec![
            "runs",
            "import",
            s(log),
            "--cluster",
            "dgx-h100",
            "--out",
            s(&csv),
        ];
        args.extend_from_slice(extra);
        stepcast(&args)
    };
    // no argument dump: nothing written
    let plain = tmp.path().join("plain.log");
    fs::write(&plain, "loss 1.0\nloss 0.9\n").unwrap();
    assert_user_error(
        &import(&plain, &[]),
        &["plain.log", "no argument dump", "rank 0"],
    );
    assert!(!csv.exists());
    // one bad log among good ones: no row at all
    let out = stepcast(&[
        "runs",
        "import",
        s(&good),
        s(&plain),
        "--cluster",
        "dgx-h100",
        "--out",
        s(&csv),
    ]);
    assert_user_error(&out, &["plain.log"]);
    assert!(!csv.exists());
    // every iteration line within the warm-up
    assert_user_error(
        &import(&good, &["--warmup-iterations", "1000"]),
        &["good.log", "past iteration 1000", "--warmup-iterations"],
    );
    // a CSV without the columns a row needs
    fs::write(&csv, "set,label\nx,y\n").unwrap();
    assert_user_error(&import(&good, &[]), &["runs.csv", "no column", "--out"]);
    // an empty file is a new one: it gets the header
    fs::write(&csv, "").unwrap();
    assert!(import(&good, &[]).status.success());
    assert!(fs::read_to_string(&csv)
        .unwrap()
        .starts_with("set,family,label,"));
    fs::remove_file(&csv).unwrap();
    fs::remove_dir_all(tmp.path().join("archs")).unwrap();
    // an architecture file of that name saying something else is not overwritten
    let arch = tmp
        .path()
        .join("archs/megatron-l32-h4096-a32g8-f14336-v128256.yaml");
    fs::create_dir_all(arch.parent().unwrap()).unwrap();
    fs::write(&arch, "name: mine\n").unwrap();
    assert_user_error(
        &import(&good, &[]),
        &["megatron-l32", "another architecture"],
    );
    assert_eq!(fs::read_to_string(&arch).unwrap(), "name: mine\n");
    assert!(!csv.exists(), "nothing written");
    // an unknown cluster or model
    assert_user_error(
        &stepcast(&[
            "runs",
            "import",
            s(&good),
            "--cluster",
            "nope",
            "--out",
            s(&csv),
        ]),
        &["nope"],
    );
    assert_user_error(&import(&good, &["--model", "nope-7b"]), &["nope-7b"]);
}

/// Run where a user keeps runs: `--out` a bare file name (the working directory), the model
/// a preset named as given (no architecture file written), appended to a CSV whose last row
/// lacks its newline, and a run stepcast cannot express kept with its reason.
#[test]
fn an_import_in_the_working_directory_appends_and_keeps_what_it_cannot_express() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("llama.log"), llama3_8b_log()).unwrap();
    let block = llama3_8b_log()
        .replace(
            "  recompute_granularity ........................... None",
            "  recompute_granularity ........................... full\n  \
             recompute_method ................................ block\n  \
             recompute_num_layers ............................ 2",
        )
        .replace("(ms): 2000.0", "(ms): 2100.0");
    fs::write(tmp.path().join("block.log"), block).unwrap();
    let import = |log: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_stepcast"))
            .current_dir(tmp.path())
            .args(["runs", "import", log, "--cluster", "dgx-h100"])
            .args(["--model", "llama3-8b", "--out", "runs.csv"])
            .output()
            .unwrap()
    };
    let out = import("llama.log");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("not expressible"),
        "{}",
        stdout(&out)
    );
    let csv = tmp.path().join("runs.csv");
    let rows = fs::read_to_string(&csv).unwrap();
    assert!(!tmp.path().join("archs").exists(), "a preset needs no file");
    // the row's last line without its newline, as an editor may leave it
    fs::write(&csv, rows.trim_end()).unwrap();
    let out = import("block.log");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(" (kept, not expressible)") && stdout(&out).contains("line 3"),
        "{}",
        stdout(&out)
    );
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let header = reader.headers().unwrap().clone();
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    for (row, expressible) in rows.iter().zip(["true", "false"]) {
        assert_eq!(&row[column("model")], "llama3-8b");
        assert_eq!(&row[column("expressible")], expressible);
        assert_eq!(&row[column("cluster")], "dgx-h100");
    }
    assert!(
        rows[1][column("source")].contains("2 of the"),
        "{:?}",
        rows[1]
    );
}

#[test]
fn a_file_another_import_holds_is_refused_and_a_blank_one_gets_its_header() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("llama.log");
    fs::write(&log, llama3_8b_log()).unwrap();
    let csv = tmp.path().join("runs.csv");
    let import = || {
        stepcast(&[
            "runs",
            "import",
            s(&log),
            "--cluster",
            "dgx-h100",
            "--model",
            "llama3-8b",
            "--out",
            s(&csv),
        ])
    };
    // a file of empty lines is a new one: the header written after them
    fs::write(&csv, "\n\r\n").unwrap();
    let out = import();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("runs.csv line 4"), "{}", stdout(&out));
    let text = fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[2].starts_with("set,family,label,"), "{text}");
    assert!(lines[3].starts_with("mine,llama3-8b,"), "{text}");
    // another process appending (it holds the file's lock): refused, the file untouched
    let held = fs::OpenOptions::new().append(true).open(&csv).unwrap();
    held.try_lock().unwrap();
    assert_user_error(&import(), &["runs.csv", "another stepcast is appending"]);
    assert_eq!(fs::read_to_string(&csv).unwrap(), text);
    drop(held);
    let out = import();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("runs.csv line 5"), "{}", stdout(&out));
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    assert_eq!(reader.records().count(), 2);
}
