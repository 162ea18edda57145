//! End-to-end tests of the `stepcast` binary on small synthetic data.

mod common;

use std::fs;

use common::{
    assert_user_error, json_of, read_json, repo, stderr, stdout, stepcast, write_dataset,
};

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// A small synthetic dataset in `tmp/ds` and the models `train` fits to it in `tmp/models`.
fn trained(tmp: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    trained_with(tmp, &[])
}

/// `trained`, with `extra` arguments to `train`.
fn trained_with(tmp: &std::path::Path, extra: &[&str]) -> (std::path::PathBuf, std::path::PathBuf) {
    let ds = tmp.join("ds");
    let models = tmp.join("models");
    write_dataset(&ds);
    let args = ["train", s(&ds), "--out", s(&models), "--quiet"];
    let out = stepcast(&[&args[..], extra].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    (ds, models)
}

#[test]
fn train_eval_and_show_work_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let models = tmp.path().join("models");
    write_dataset(&ds);

    let out = stepcast(&["train", s(&ds), "--out", s(&models), "--quiet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("gemm fwd fp16"), "{text}");
    assert!(models.join("manifest.json").is_file());
    assert!(models.join("models.bin").is_file());

    let out = stepcast(&["eval", s(&models), s(&ds), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let norm = rows
        .iter()
        .find(|r| r["op"] == "rmsnorm" && r["phase"] == "fwd")
        .expect("rmsnorm row");
    // 2 % noise on a smooth function: the learned model must beat the roofline by far
    let mape = norm["mape_percent"].as_f64().unwrap();
    let roof = norm["roofline_mape_percent"].as_f64().unwrap();
    assert!(
        mape < 5.0 && mape < roof / 3.0,
        "mape {mape} roofline {roof}"
    );
    // collectives are reported per layout
    assert!(rows
        .iter()
        .any(|r| r["op"] == "all_reduce" && r["layout"] == serde_json::json!([2, 4])));

    for split in ["holdout-largest-hidden", "holdout-longest-seq", "none"] {
        let out = stepcast(&["eval", s(&models), s(&ds), "--split", split]);
        assert!(out.status.success(), "{split}: {}", stderr(&out));
        assert!(stdout(&out).contains("MAPE"), "{split}");
    }
    // holding out the largest hidden size puts those queries outside the training range
    let out = stepcast(&[
        "eval",
        s(&models),
        s(&ds),
        "--split",
        "holdout-largest-hidden",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let qkv = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "qkv" && r["phase"] == "fwd")
        .unwrap();
    assert_eq!(qkv["out_of_coverage_percent"].as_f64().unwrap(), 100.0);

    let out = stepcast(&["models", "show", s(&models)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("NVIDIA A100-SXM4-80GB") && text.contains("synthetic-a100"),
        "{text}"
    );
    assert!(text.contains("NCCL 2.21.5"), "{text}");
    assert!(
        text.contains("no calibration: steps on these models"),
        "{text}"
    );

    // retraining into the same directory replaces the models
    let out = stepcast(&[
        "train",
        s(&ds),
        "--out",
        s(&models),
        "--quiet",
        "--seed",
        "3",
    ]);
    assert!(out.status.success());
    let manifest = read_json(&models.join("manifest.json"));
    assert_eq!(manifest["seed"], 3);
}

/// `train` stores each collective model's probe table (what calibrating the analytic network
/// model on it reads, so a prediction need not walk its trees 8 × layouts times), equal to what
/// its trees give; a file without the table is evaluated on demand to the same values; and
/// `models repack` rewrites a directory to the same bytes when nothing is missing.
#[test]
fn collective_probe_tables_are_stored_and_repack_keeps_the_models() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, models) = trained(tmp.path());
    let set = stepcast::regress::ModelSet::load(&models).unwrap();
    let mut collectives = 0;
    for m in set.models() {
        let shapes = m.probe_shapes();
        if shapes.is_empty() {
            assert!(m.probes_us.is_empty(), "{}", m.key);
            continue;
        }
        collectives += 1;
        assert_eq!(shapes.len(), m.layouts.len() * 8, "{}", m.key);
        assert_eq!(m.probes_us, m.evaluate_probes(&shapes), "{}", m.key);
        let mut without = m.clone();
        without.probes_us.clear();
        assert_eq!(*without.probe_times_us(), m.probes_us[..], "{}", m.key);
    }
    assert!(collectives > 0);
    drop(set);

    let before = fs::read(models.join("models.bin")).unwrap();
    let out = stepcast(&["models", "repack", s(&models)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("repacked"), "{}", stdout(&out));
    assert_eq!(fs::read(models.join("models.bin")).unwrap(), before);

    let out = stepcast(&["models", "repack", s(&tmp.path().join("nowhere"))]);
    assert_user_error(&out, &["nowhere", "models directory not found"]);
}

/// `train --out DIR` removes only model files an earlier stepcast wrote in DIR: a manifest
/// naming other files (outside DIR, or not ours) deletes nothing.
#[test]
fn training_never_deletes_files_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    write_dataset(&ds);
    let models = tmp.path().join("models");
    fs::create_dir_all(&models).unwrap();
    let outside = tmp.path().join("victim.json");
    let absolute = tmp.path().join("absolute.json");
    for f in [&outside, &absolute] {
        fs::write(f, "keep me").unwrap();
    }
    for name in [
        "config.json",
        "gemm.fwd.fp16.json",
        "gemm.fwd.fp16.nodes",
        "notes.nodes",
    ] {
        fs::write(models.join(name), "x").unwrap();
    }
    // an earlier (per-model-file) manifest naming files inside and outside the directory
    let manifest = serde_json::json!({
        "format_version": 2,
        "feature_schema_version": 1,
        "models": [
            {"file": "../victim.json"},
            {"file": absolute.display().to_string()},
            {"file": "config.json"},
            {"file": "notes.json"},
            {"file": "gemm.fwd.fp16.json"},
        ],
    });
    fs::write(models.join("manifest.json"), manifest.to_string()).unwrap();
    let out = stepcast(&["train", s(&ds), "--out", s(&models), "--quiet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");
    assert_eq!(fs::read_to_string(&absolute).unwrap(), "keep me");
    assert!(models.join("config.json").is_file() && models.join("notes.nodes").is_file());
    // the earlier format's own model files are replaced by models.bin
    assert!(!models.join("gemm.fwd.fp16.json").exists());
    assert!(!models.join("gemm.fwd.fp16.nodes").exists());
    assert!(models.join("models.bin").is_file());
}

#[test]
fn training_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    write_dataset(&ds);
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    assert!(stepcast(&["train", s(&ds), "--out", s(&a), "--quiet"])
        .status
        .success());
    assert!(stepcast(&["train", s(&ds), "--out", s(&b), "--quiet"])
        .status
        .success());
    // the same models, byte for byte
    let fa = fs::read(a.join("models.bin")).unwrap();
    let fb = fs::read(b.join("models.bin")).unwrap();
    assert!(fa == fb, "models.bin differs between two trainings");
}

/// `train --grid-report` lists every candidate fitted with its validation error and size, and
/// marks each group's best: a model's is the one the manifest records; a role the pooled model
/// serves keeps its own best marked, with no model.
#[test]
fn the_grid_report_lists_every_candidate_and_the_one_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let grid = tmp.path().join("grid.csv");
    let (_, models) = trained_with(tmp.path(), &["--grid-report", s(&grid)]);
    let manifest = read_json(&models.join("manifest.json"));
    let kept: Vec<(String, String, f64)> = csv::Reader::from_path(&grid)
        .unwrap()
        .records()
        .map(Result::unwrap)
        .inspect(|r| {
            assert_eq!(r.len(), 5, "{r:?}");
            assert!(r[2].parse::<f64>().unwrap() >= 0.0 && r[3].parse::<u64>().unwrap() > 0);
        })
        .filter(|r| &r[4] == "1")
        .map(|r| (r[0].to_string(), r[1].to_string(), r[2].parse().unwrap()))
        .collect();
    // each model's candidate, with the error the manifest records; the other groups' best
    // candidates are of roles the pooled model serves (no model of their own)
    let entries = manifest["models"].as_array().unwrap();
    let name = |k: &serde_json::Value| {
        let name = format!("{} {} {}", k["op"], k["phase"], k["dtype"]).replace('"', "");
        match k["role"].as_str() {
            Some(role) => format!("{name} {role}"),
            None => name,
        }
    };
    for e in entries {
        let name = name(&e["key"]);
        let (_, recipe, mape) = kept.iter().find(|(key, ..)| *key == name).expect(&name);
        assert_eq!(recipe, e["recipe"].as_str().unwrap(), "{name}");
        let recorded = e["validation"]["mape_percent"].as_f64().unwrap();
        assert!(
            (mape - recorded).abs() < 1e-4,
            "{name}: {mape} vs {recorded}"
        );
    }
    let served: Vec<String> = entries
        .iter()
        .flat_map(|e| {
            let pooled = name(&e["key"]);
            let roles = e["serves_roles"].as_array().cloned().unwrap_or_default();
            roles
                .into_iter()
                .map(move |r| format!("{pooled} {}", r.as_str().unwrap()))
        })
        .collect();
    assert!(!served.is_empty());
    assert_eq!(kept.len(), entries.len() + served.len());
    for (key, ..) in &kept {
        let own = entries.iter().any(|e| name(&e["key"]) == *key);
        assert!(own || served.contains(key), "{key}");
    }
    let header = fs::read_to_string(&grid).unwrap();
    assert!(header.starts_with("model,recipe,val_mape_percent,nodes,chosen\n"));
}

#[test]
fn bad_datasets_are_reported_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("m");
    let o = s(&out_dir);

    // missing directory
    let missing = tmp.path().join("nope");
    assert_user_error(
        &stepcast(&["train", s(&missing), "--out", o]),
        &["nope", "not found"],
    );

    // no meta.yaml
    let bare = tmp.path().join("bare");
    fs::create_dir_all(&bare).unwrap();
    assert_user_error(&stepcast(&["train", s(&bare), "--out", o]), &["meta.yaml"]);

    let cases: [(&str, &str, &[&str]); 6] = [
        ("wrong-columns", "op,dtype,phase,batch,seq,width\nrmsnorm,fp16,fwd,1,2,3\n", &["rmsnorm.csv", "missing column 'time_us'"]),
        ("nan", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\nrmsnorm,fp16,fwd,1,2,3,NaN\n", &["rmsnorm.csv:3", "time_us = NaN"]),
        ("negative", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,-5\n", &["rmsnorm.csv:2", "time_us = -5"]),
        ("zero", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,0\n", &["rmsnorm.csv:2"]),
        ("truncated", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\nrmsnorm,fp16,fw", &["rmsnorm.csv:3", "truncated"]),
        ("empty", "op,dtype,phase,batch,seq,width,time_us\n", &["no measured rows"]),
    ];
    for (name, csv, needles) in cases {
        let dir = tmp.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("meta.yaml"), common::META).unwrap();
        fs::write(dir.join("rmsnorm.csv"), csv).unwrap();
        let out = stepcast(&["train", s(&dir), "--out", o]);
        assert_user_error(&out, needles);
    }

    // a malformed meta.yaml names the file and the field
    let dir = tmp.path().join("badmeta");
    write_dataset(&dir);
    fs::write(
        dir.join("meta.yaml"),
        common::META.replace("sm_count: 108", "sm_count: many"),
    )
    .unwrap();
    assert_user_error(
        &stepcast(&["train", s(&dir), "--out", o]),
        &["meta.yaml", "sm_count"],
    );
}

#[test]
fn models_of_another_version_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let models = tmp.path().join("models");
    write_dataset(&ds);
    assert!(stepcast(&["train", s(&ds), "--out", s(&models), "--quiet"])
        .status
        .success());

    let set_field = |path: &std::path::Path, field: &str, value: u64| {
        let mut v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
        v[field] = value.into();
        fs::write(path, v.to_string()).unwrap();
    };
    // models.bin: magic, format version, feature schema version (u32 LE each after the magic)
    let bin = models.join("models.bin");
    let mut bytes = fs::read(&bin).unwrap();
    bytes[20..24].copy_from_slice(&99u32.to_le_bytes());
    fs::write(&bin, &bytes).unwrap();
    assert_user_error(
        &stepcast(&["eval", s(&models), s(&ds)]),
        &["models.bin", "feature schema version 99", "retrain"],
    );
    // trees changed after training are refused, not used
    bytes[20..24].copy_from_slice(&1u32.to_le_bytes());
    let last = bytes.len() - 3;
    bytes[last] ^= 0x55;
    fs::write(&bin, &bytes).unwrap();
    assert_user_error(
        &stepcast(&["eval", s(&models), s(&ds)]),
        &["models.bin", "checksum", "retrain"],
    );

    set_field(&models.join("manifest.json"), "format_version", 7);
    assert_user_error(
        &stepcast(&["models", "show", s(&models)]),
        &["manifest.json", "version 7"],
    );

    assert_user_error(
        &stepcast(&["models", "show", s(&tmp.path().join("none"))]),
        &["models directory not found"],
    );
}

#[test]
fn import_reads_the_estimate_train_time_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("Perlmutter");
    let op = src.join("operator");
    let nccl = src.join("nccl");
    fs::create_dir_all(&op).unwrap();
    fs::create_dir_all(&nccl).unwrap();
    let gpu = "NVIDIAA100-SXM4-80GB";
    fs::write(
        op.join(format!("{gpu}.csv")),
        "GPU,Function,Precision,Propagation,Best_model,Best_config,Best_error%\n\
         NVIDIAA100-SXM4-80GB,linear1,fp16,fwd,rforest,\"{'n_estimators': 100}\",0.056\n",
    )
    .unwrap();
    let mut lin = String::from("mp,b,l,dim,F_dur(us),B_dur(us)\n");
    for mp in [1, 2] {
        for l in [1024, 2048] {
            for dim in [2048, 4096] {
                lin.push_str(&format!(
                    "{mp}.0,4.0,{l}.0,{dim}.0,{}.5,{}.0\n",
                    l * dim / 10000,
                    l * dim / 5000
                ));
            }
        }
    }
    fs::write(op.join(format!("{gpu}_linear1_fp16.csv")), &lin).unwrap();
    fs::write(
        nccl.join(format!("{gpu}_allgather_large_fp16_2_4.csv")),
        "shape,nodes,GPUsPerNode,dur(us)\n134217728.0,2.0,4.0,432505.8\n",
    )
    .unwrap();
    let out_ds = tmp.path().join("imported");
    let out = stepcast(&[
        "datasets",
        "import",
        "--format",
        "estimate-train-time",
        s(&src),
        "--out",
        s(&out_ds),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let gemm = fs::read_to_string(out_ds.join("gemm.csv")).unwrap();
    // linear1 at mp 2, b 4, l 1024, dim 2048 -> m 4096, n 3072, k 2048, role qkv
    assert!(
        gemm.contains("gemm,qkv,fp16,fwd,4096,3072,2048,1,4,1024,2048,,2"),
        "{gemm}"
    );
    // all-gather: 134,217,728 fp16 elements per rank on 8 ranks -> 2 GiB gathered
    let ag = fs::read_to_string(out_ds.join("all_gather.csv")).unwrap();
    assert!(ag.contains(",2147483648,8,2,4,"), "{ag}");
    let meta = fs::read_to_string(out_ds.join("meta.yaml")).unwrap();
    assert!(
        meta.contains("label: linear1") && meta.contains("mape_percent: 5.6"),
        "{meta}"
    );

    // importing twice into the same place is refused
    let again = stepcast(&[
        "datasets",
        "import",
        "--format",
        "estimate-train-time",
        s(&src),
        "--out",
        s(&out_ds),
    ]);
    assert_user_error(&again, &["already holds a dataset"]);

    // a malformed source row is reported with its file and line
    lin.push_str("1.0,4.0,abc,2048.0,1.0,2.0\n");
    fs::write(op.join(format!("{gpu}_linear1_fp16.csv")), &lin).unwrap();
    let out = stepcast(&[
        "datasets",
        "import",
        "--format",
        "estimate-train-time",
        s(&src),
        "--out",
        s(&tmp.path().join("x")),
    ]);
    assert_user_error(
        &out,
        &["NVIDIAA100-SXM4-80GB_linear1_fp16.csv:10", "l = 'abc'"],
    );
}

/// `predict --json` of the paper's Llemma 7B example on Perlmutter under `rules`.
fn llemma_on_perlmutter(rules: &str) -> serde_json::Value {
    let out = stepcast(&[
        "predict",
        "--cluster",
        &repo("hardware-profiles/perlmutter.yaml"),
        "--model",
        "llemma-7b",
        "--tp",
        "2",
        "--pp",
        "4",
        "--dp",
        "2",
        "--micro-batch",
        "4",
        "--micro-batches",
        "8",
        "--rules",
        rules,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn predict_reproduces_the_papers_llemma_example() {
    // the paper's tool predicts 9,465,235 µs for this job (estimate-train-time
    // results_backup/llemma_7b_4_2_2_P.csv); with its composition rules we land within 3 %
    let p = llemma_on_perlmutter("paper");
    let step = p["step_time_s"].as_f64().unwrap();
    assert!((step / 9.465235 - 1.0).abs() < 0.03, "{step}");
    assert_eq!(p["layout"]["stage_layers"], serde_json::json!([8, 9, 9, 6]));
    let [lo, hi] = [
        p["interval_s"][0].as_f64().unwrap(),
        p["interval_s"][1].as_f64().unwrap(),
    ];
    assert!(lo < step && step < hi);
    // everything came from the shipped A100 models
    assert_eq!(
        p["sources_percent"]["learned"].as_f64().unwrap().round(),
        100.0
    );
}

#[test]
fn the_papers_per_stage_optimizer_does_not_step_megatrons_fused_adam() {
    // the shipped A100 models learned GPT-NeoX's per-stage optimizer (the paper's data): the
    // paper's rules use it, Megatron's fused Adam on the same GPU is its memory traffic
    let optimizer_sources = |rules: &str| {
        let p = llemma_on_perlmutter(rules);
        let stages = p["stages"].as_array().expect("stages");
        stages
            .iter()
            .flat_map(|stage| stage["update"].as_array().expect("update calls"))
            .filter(|c| c["label"] == "optimizer step")
            .map(|c| {
                let q = c["query"].as_str().unwrap().to_string();
                (q, c["estimate"]["source"].as_str().unwrap().to_string())
            })
            .collect::<Vec<_>>()
    };
    let paper = optimizer_sources("paper");
    assert_eq!(paper.len(), 4, "{paper:?}"); // one per stage
    assert!(
        paper
            .iter()
            .all(|(q, s)| q.contains("_stage)") && s == "learned"),
        "{paper:?}"
    );
    let megatron = optimizer_sources("megatron");
    assert_eq!(megatron.len(), 4, "{megatron:?}");
    assert!(
        megatron
            .iter()
            .all(|(q, s)| q.contains("(fused_adam)") && s == "roofline"),
        "{megatron:?}"
    );
}

#[test]
fn built_in_clusters_predict_anywhere_with_their_built_in_models() {
    // from an empty directory, `--cluster perlmutter` is the shipped file with its shipped models
    let empty = tempfile::tempdir().unwrap();
    let args = |cluster: &str| {
        vec![
            "predict".to_string(),
            "--cluster".into(),
            cluster.into(),
            "--model".into(),
            "llemma-7b".into(),
            "--tp".into(),
            "2".into(),
            "--pp".into(),
            "4".into(),
            "--dp".into(),
            "2".into(),
            "--micro-batch".into(),
            "4".into(),
            "--micro-batches".into(),
            "8".into(),
            "--json".into(),
        ]
    };
    let run = |cluster: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_stepcast"))
            .args(args(cluster))
            .current_dir(empty.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let by_name = run("perlmutter");
    let by_file = run(&repo("hardware-profiles/perlmutter.yaml"));
    assert_eq!(by_name["step_time_s"], by_file["step_time_s"]);
    assert_eq!(by_name["sources_percent"], by_file["sources_percent"]);
    assert!(by_name["sources_percent"]["learned"].as_f64().unwrap() > 50.0);
    // an unknown name lists the built-in ones
    let out = stepcast(&[
        "predict",
        "--cluster",
        "no-such-cluster",
        "--model",
        "llama2-7b",
    ]);
    assert_user_error(&out, &["no-such-cluster", "dgx-h100", "perlmutter"]);
}

#[test]
fn predict_reads_a_job_file_and_flags_override_it() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.yaml");
    fs::write(
        &job,
        format!(
            "cluster: {}\nmodel: llama2-7b\nparallel:\n  tp: 2\n  pp: 2\n  dp: 2\n  micro_batch: 1\n  global_batch: 64\n",
            repo("hardware-profiles/dgx-h100.yaml")
        ),
    )
    .unwrap();
    let out = stepcast(&["predict", "--job", s(&job), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["layout"]["micro_batches"], 32);
    let out = stepcast(&["predict", "--job", s(&job), "--dp", "4", "--json"]);
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            p["layout"]["dp"].as_u64(),
            p["layout"]["micro_batches"].as_u64()
        ),
        (Some(4), Some(16))
    );
    // the table names the model and its sources
    let out = stepcast(&["predict", "--job", s(&job)]);
    let text = stdout(&out);
    assert!(
        text.contains("step time") && text.contains("sources") && text.contains("llama2-7b"),
        "{text}"
    );
}

#[test]
fn predict_without_models_falls_back_to_the_roofline_unless_strict() {
    let cluster = repo("hardware-profiles/mi300x.yaml");
    let args = [
        "predict",
        "--cluster",
        &cluster,
        "--model",
        "llama3-8b",
        "--tp",
        "1",
        "--dp",
        "8",
        "--global-batch",
        "64",
    ];
    let out = stepcast(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    // and says how far the roofline alone was off on published runs
    assert!(
        stdout(&out).contains("times what the roofline alone predicted, 1.27 at the median"),
        "{}",
        stdout(&out)
    );
    let mut strict = args.to_vec();
    strict.push("--strict");
    assert_user_error(&stepcast(&strict), &["--strict"]);
}

#[test]
fn predict_rejects_bad_inputs_with_what_to_change() {
    let tmp = tempfile::tempdir().unwrap();
    let h100 = repo("hardware-profiles/dgx-h100.yaml");
    let base = |extra: &[&str]| {
        let mut a = vec![
            "predict",
            "--cluster",
            h100.as_str(),
            "--micro-batch",
            "1",
            "--micro-batches",
            "8",
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let run = |a: Vec<String>| stepcast(&a.iter().map(String::as_str).collect::<Vec<_>>());

    assert_user_error(
        &run(base(&["--model", "llama9-1t"])),
        &["unknown model 'llama9-1t'", "llama2-7b"],
    );
    assert_user_error(
        &run(base(&["--model", "llama2-7b", "--tp", "3"])),
        &["heads (32)", "tp = 3", "1, 2, 4, 8"],
    );
    assert_user_error(
        &run(base(&[
            "--model",
            "llama2-7b",
            "--tp",
            "8",
            "--pp",
            "8",
            "--dp",
            "512",
        ])),
        &["32768 GPUs", "16384", "lower dp"],
    );
    assert_user_error(
        &run(base(&["--model", "llama2-7b", "--pp", "64"])),
        &["32 layers", "pp = 64"],
    );
    let out = stepcast(&[
        "predict",
        "--cluster",
        &h100,
        "--model",
        "llama2-7b",
        "--dp",
        "8",
        "--micro-batch",
        "3",
        "--global-batch",
        "100",
    ]);
    assert_user_error(&out, &["global batch 100", "micro-batch × dp = 3 × 8 = 24"]);

    // malformed config.json
    let cfg = tmp.path().join("config.json");
    fs::write(
        &cfg,
        r#"{"model_type": "llama", "num_hidden_layers": "many"}"#,
    )
    .unwrap();
    assert_user_error(
        &run(base(&["--model", s(&cfg)])),
        &["config.json", "num_hidden_layers"],
    );

    // cluster YAML with a missing field, and with a wrong unit in a key name
    let yaml = fs::read_to_string(&h100).unwrap();
    let missing = tmp.path().join("missing.yaml");
    fs::write(&missing, yaml.replace("gpus_per_node: 8\n", "")).unwrap();
    let out = stepcast(&[
        "predict",
        "--cluster",
        s(&missing),
        "--model",
        "llama2-7b",
        "--micro-batches",
        "2",
    ]);
    assert_user_error(&out, &["missing.yaml", "gpus_per_node"]);
    let unit = tmp.path().join("unit.yaml");
    fs::write(
        &unit,
        yaml.replace("bandwidth_gb_per_s: 450", "bandwidth_gbps: 450"),
    )
    .unwrap();
    let out = stepcast(&[
        "predict",
        "--cluster",
        s(&unit),
        "--model",
        "llama2-7b",
        "--micro-batches",
        "2",
    ]);
    assert_user_error(&out, &["unit.yaml", "bandwidth_gbps", "bandwidth_gb_per_s"]);
    let negative = tmp.path().join("negative.yaml");
    fs::write(
        &negative,
        yaml.replace(
            "bandwidth_gbit_per_s_per_nic: 400",
            "bandwidth_gbit_per_s_per_nic: -400",
        ),
    )
    .unwrap();
    let out = stepcast(&[
        "predict",
        "--cluster",
        s(&negative),
        "--model",
        "llama2-7b",
        "--micro-batches",
        "2",
    ]);
    assert_user_error(
        &out,
        &[
            "negative.yaml",
            "bandwidth_gbit_per_s_per_nic",
            "physical range",
        ],
    );
}

#[test]
fn bench_commands_run_the_harness_or_say_how_to_build_it() {
    let me = std::path::PathBuf::from(env!("CARGO_BIN_EXE_stepcast"));
    // a stepcast alone in a directory, with no harness on PATH
    let tmp = tempfile::tempdir().unwrap();
    let lonely = tmp.path().join("stepcast");
    fs::copy(&me, &lonely).unwrap();
    let out = std::process::Command::new(&lonely)
        .args(["bench", "plan"])
        .env("PATH", tmp.path())
        .output()
        .unwrap();
    assert_user_error(
        &out,
        &["stepcast-bench is not installed", "--features cuda"],
    );
    // beside the harness (cargo builds both when testing the workspace) it is run
    if me.with_file_name("stepcast-bench").is_file() {
        let out = stepcast(&["bench", "plan", "--quick"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).contains("plan 'quick'"));
        let out = stepcast(&["models", "check", "--help"]);
        assert!(stdout(&out).contains("--cluster"), "{}", stdout(&out));
    }
}

/// Every JSON output says which stepcast made it (version, commit), the command line and its
/// inputs with digests: predict, memory, search, ettr, eval, models show, datasets show and
/// bench plan.
#[test]
fn every_json_output_carries_its_provenance() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, models) = common::trained_models(tmp.path());
    let cluster = repo("hardware-profiles/dgx-h100.yaml");
    let search_json = tmp.path().join("search.json");
    let job = [
        "--cluster",
        &cluster,
        "--model",
        "llama2-7b",
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "2",
        "--micro-batch",
        "1",
        "--micro-batches",
        "4",
        "--json",
    ];
    let runs: Vec<(Vec<&str>, &[&str])> = vec![
        (
            [&["predict"][..], &job].concat(),
            &["cluster", "architecture", "models"],
        ),
        (
            [&["memory"][..], &job].concat(),
            &["cluster", "architecture"],
        ),
        (
            vec![
                "ettr", "--step-s", "2", "--nodes", "16", "--steps", "1000", "--save-s", "30",
                "--json",
            ],
            &[],
        ),
        (
            vec!["eval", s(&models), s(&ds), "--json"],
            &["models", "dataset"],
        ),
        (vec!["models", "show", s(&models), "--json"], &["models"]),
        (vec!["datasets", "show", s(&ds), "--json"], &["dataset"]),
    ];
    let check = |doc: &serde_json::Value, roles: &[&str], what: &str| {
        let p = &doc["provenance"];
        assert_eq!(p["tool"], "stepcast", "{what}: {doc}");
        assert_eq!(p["version"], env!("CARGO_PKG_VERSION"), "{what}");
        assert!(!p["commit"].as_str().unwrap().is_empty(), "{what}");
        assert!(p["arguments"].as_array().unwrap().len() > 1, "{what}");
        let inputs = p["inputs"].as_array().unwrap();
        for role in roles {
            let input = inputs
                .iter()
                .find(|i| i["role"] == *role)
                .unwrap_or_else(|| panic!("{what}: no {role} in {inputs:?}"));
            if *role != "architecture" {
                assert_eq!(
                    input["digest"].as_str().unwrap().len(),
                    16,
                    "{what}: {input}"
                );
            }
        }
    };
    for (args, roles) in &runs {
        let out = stepcast(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        check(&doc, roles, &args.join(" "));
    }
    let out = stepcast(&[
        "search",
        "--cluster",
        &cluster,
        "--model",
        "llama2-7b",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--json",
        s(&search_json),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&search_json).unwrap()).unwrap();
    check(&doc, &["cluster", "architecture", "models"], "search");
    // the same models give the same fingerprint everywhere: models show and the JSON
    let out = stepcast(&["models", "show", s(&models)]);
    let shown: serde_json::Value =
        serde_json::from_slice(&stepcast(&["models", "show", s(&models), "--json"]).stdout)
            .unwrap();
    let fingerprint = shown["provenance"]["inputs"][0]["digest"].as_str().unwrap();
    assert!(stdout(&out).contains(fingerprint));
    // --version names the commit and the built-in models' fingerprints
    let out = stepcast(&["--version"]);
    let text = stdout(&out);
    assert!(
        text.contains("commit ") && text.contains("perlmutter") && text.contains("fingerprint"),
        "{text}"
    );
}

/// Completion scripts and man pages come from the parser itself: they name every command and
/// flag, bash accepts the script, and man pages go only into a directory that exists.
#[test]
fn completions_and_man_pages_name_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = stepcast(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for word in ["predict", "search", "cluster", "global-batch"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("stepcast.bash");
    fs::write(&script, stdout(&stepcast(&["completions", "bash"]))).unwrap();
    let syntax = std::process::Command::new("bash")
        .args(["-n", s(&script)])
        .status();
    if let Ok(status) = syntax {
        assert!(status.success(), "bash rejects the completion script");
    }

    let page = stdout(&stepcast(&["man"]));
    assert!(
        page.starts_with(".ie") && page.contains(".TH stepcast 1"),
        "{page}"
    );
    let out = stepcast(&["man", "--out", s(tmp.path())]);
    assert!(out.status.success(), "{}", stderr(&out));
    for name in [
        "stepcast.1",
        "stepcast-predict.1",
        "stepcast-datasets-show.1",
    ] {
        assert!(tmp.path().join(name).is_file(), "{name}");
    }
    let predict = fs::read_to_string(tmp.path().join("stepcast-predict.1")).unwrap();
    assert!(predict.contains("\\-\\-global\\-batch"), "{predict}");
    let missing = tmp.path().join("no-such-dir");
    assert_user_error(
        &stepcast(&["man", "--out", s(&missing)]),
        &["no-such-dir", "mkdir"],
    );
}

/// A layout for torchtitan (`--framework torchtitan`, or exported for it) is costed as
/// torchtitan runs by default — its cross-entropy, SDPA's FlashAttention-2, all-gather context
/// parallelism — unless a flag says otherwise, and the prediction says so.
#[test]
fn a_frameworks_defaults_cost_its_layouts() {
    let job: Vec<&str> =
        "--cluster dgx-h100 --model llama3-8b --cp 2 --dp 4 --micro-batch 1 --global-batch 8 --zero 3"
            .split_whitespace()
            .collect();
    let layout = |extra: &[&str]| {
        let p = json_of(&stepcast(
            &[&["predict"][..], &job, extra, &["--json"]].concat(),
        ));
        p["layout"].clone()
    };
    let megatron = layout(&[]);
    assert!(megatron.get("cross_entropy").is_none(), "{megatron}");
    assert_eq!(megatron["cp_comm"], "p2p");
    let titan = layout(&["--framework", "torchtitan"]);
    assert_eq!(titan["cross_entropy"], "pytorch");
    assert_eq!(titan["attention_kernel"], "flash-attention-2");
    assert_eq!(titan["cp_comm"], "all-gather");
    // a flag of the user's wins over the framework's default
    let native = layout(&["--framework", "torchtitan", "--attention-kernel", "native"]);
    assert_eq!(native["attention_kernel"], "native");
    assert_eq!(native["cross_entropy"], "pytorch");
    let text = stepcast(&[&["predict"][..], &job, &["--framework", "torchtitan"]].concat());
    assert!(
        stdout(&text).contains("costed as torchtitan runs by default: --cross-entropy pytorch"),
        "{}",
        stdout(&text)
    );
    // exported for torchtitan, the layout is costed and launched as torchtitan runs it
    let out = stepcast(&[&["export", "--format", "torchtitan"][..], &job].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let toml = stdout(&out);
    assert!(
        toml.contains("context_parallel_rotate_method = \"allgather\"")
            && toml.contains("cp 2 (all-gather)"),
        "{toml}"
    );
}

/// PyTorch model code run without torch.compile (`--elementwise eager`, torchtitan's default)
/// costs each operation of its norms, rotary embedding and SiLU-and-multiply as a kernel of
/// its own: slower than the fused kernels, said on the layout line, exported as torchtitan's
/// `[compile] enable = false`, refused for Megatron-Core and under the paper's rules.
#[test]
fn eager_elementwise_code_costs_its_passes_and_exports_as_such() {
    let job: Vec<&str> =
        "--cluster dgx-h100 --model llama3-8b --dp 8 --micro-batch 1 --global-batch 8 --zero 3"
            .split_whitespace()
            .collect();
    let predict = |extra: &[&str]| {
        json_of(&stepcast(
            &[&["predict"][..], &job, extra, &["--json"]].concat(),
        ))
    };
    let fused = predict(&["--elementwise", "fused"]);
    let eager = predict(&["--elementwise", "eager"]);
    assert!(
        fused["layout"].get("elementwise").is_none(),
        "{}",
        fused["layout"]
    );
    assert_eq!(eager["layout"]["elementwise"], "eager");
    let step = |p: &serde_json::Value| p["step_time_s"].as_f64().unwrap();
    assert!(
        step(&eager) > 1.05 * step(&fused),
        "{} {}",
        step(&eager),
        step(&fused)
    );
    // torchtitan's default, noted as such
    let titan = predict(&["--framework", "torchtitan"]);
    assert_eq!(titan["layout"]["elementwise"], "eager");
    let text = stdout(&stepcast(
        &[&["predict"][..], &job, &["--framework", "torchtitan"]].concat(),
    ));
    assert!(
        text.contains("--elementwise eager") && text.contains("eager element-wise kernels"),
        "{text}"
    );
    let export = |extra: &[&str]| stepcast(&[&["export"][..], &job, extra].concat());
    let toml = stdout(&export(&["--format", "torchtitan"]));
    assert!(toml.contains("[compile]\nenable = false"), "{toml}");
    let toml = stdout(&export(&[
        "--format",
        "torchtitan",
        "--elementwise",
        "fused",
    ]));
    assert!(toml.contains("[compile]\nenable = true"), "{toml}");
    let run = |line: &str| stepcast(&line.split_whitespace().collect::<Vec<_>>());
    // torchtitan's async tensor parallelism needs torch.compile: a layout overlapping TP
    // communication is costed and exported compiled, and refused eager
    let tp = "export --format torchtitan --cluster dgx-h100 --model llama3-8b --tp 2 --dp 4 \
              --global-batch 8 --zero 3 --sequence-parallel --tp-comm-overlap";
    let toml = stdout(&run(tp));
    assert!(toml.contains("[compile]\nenable = true"), "{toml}");
    assert_user_error(
        &run(&format!("{tp} --elementwise eager")),
        &["torch.compile", "--elementwise fused"],
    );
    assert_user_error(
        &run(
            "export --format megatron --cluster dgx-h100 --model llama3-8b --dp 8 \
              --global-batch 8 --elementwise eager",
        ),
        &["megatron", "--elementwise fused"],
    );
    assert_user_error(
        &run(
            "predict --cluster perlmutter --model llemma-7b --rules paper --tp 2 --pp 4 \
              --dp 2 --micro-batch 4 --micro-batches 8 --elementwise eager",
        ),
        &["paper", "--elementwise eager"],
    );
}

/// A switch is written bare, `true|false` or, as NeMo's and Megatron's users write them,
/// `on|off`: each spelling costs the same layout.
#[test]
fn switches_are_written_on_or_off_as_frameworks_write_them() {
    let predicted = |switch: &[&str]| {
        let base = "predict --cluster dgx-h100 --model llama3-8b --tp 2 --dp 4 --global-batch 8 \
                    --sequence-parallel --json";
        let args: Vec<&str> = base
            .split_whitespace()
            .chain(switch.iter().copied())
            .collect();
        let out = json_of(&stepcast(&args));
        (
            out["step_time_s"].as_f64().unwrap(),
            out["layout"]["overlap"]["tp"].clone(),
        )
    };
    let on = predicted(&["--tp-comm-overlap"]);
    let off = predicted(&[]);
    assert_eq!(on.1, true);
    assert_eq!(off.1, false);
    assert_ne!(on.0, off.0, "the overlap moves this step");
    for (spelling, want) in [("on", &on), ("true", &on), ("off", &off), ("false", &off)] {
        assert_eq!(
            &predicted(&["--tp-comm-overlap", spelling]),
            want,
            "{spelling}"
        );
    }
}

/// torchtitan's layer-level selective checkpointing (`--recompute selective-layer`) exports as
/// its every-second-layer option.
#[test]
fn layer_level_checkpointing_exports_as_torchtitans_every_second_layer() {
    let run = |line: &str| stepcast(&line.split_whitespace().collect::<Vec<_>>());
    // torchtitan's layer-level checkpointing, every 2nd layer
    let toml = stdout(&run(
        "export --format torchtitan --cluster dgx-h100 --model llama3-8b \
                            --dp 8 --global-batch 8 --zero 3 --recompute selective-layer",
    ));
    assert!(
        toml.contains("mode = \"selective\"\nselective_ac_option = \"2\""),
        "{toml}"
    );
}

/// `export` turns the job flags, or a search's N-th best row, into each framework's launch,
/// and refuses what a framework cannot run as costed.
#[test]
fn export_writes_each_frameworks_launch_from_flags_or_a_search() {
    let tmp = tempfile::tempdir().unwrap();
    let job = [
        "--cluster",
        "dgx-h100",
        "--model",
        "llama3-8b",
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
        "--sequence-parallel",
        "--zero",
        "0",
    ];
    let run = |format: &str| {
        let out = stepcast(&[&["export", "--format", format][..], &job].concat());
        assert!(out.status.success(), "{format}: {}", stderr(&out));
        stdout(&out)
    };
    let m = run("megatron");
    assert!(
        m.contains("--tensor-model-parallel-size 2") && m.contains("--nnodes 2"),
        "{m}"
    );
    let n = run("nemo");
    assert!(
        n.contains("llm.llama3_8b.pretrain_recipe") && n.contains("tensor_model_parallel_size = 2"),
        "{n}"
    );
    let t = run("torchtitan");
    assert!(
        t.contains("data_parallel_replicate_degree = 4") && t.contains("flavor = \"8B\""),
        "{t}"
    );
    // --json: the launch as a document with its provenance; --no-calibration: headed by the
    // raw physics' step and the cluster's defaults
    let out = stepcast(&[&["export", "--format", "nemo", "--json"][..], &job].concat());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["framework"], "nemo", "{doc}");
    assert_eq!(doc["file_name"], "recipe.py", "{doc}");
    assert_eq!(doc["text"].as_str().unwrap(), n, "{doc}");
    assert_eq!(doc["provenance"]["tool"], "stepcast", "{doc}");
    let raw = stepcast(
        &[
            &["export", "--format", "megatron", "--no-calibration"][..],
            &job,
        ]
        .concat(),
    );
    let raw = stdout(&raw);
    assert!(raw.contains("; the cluster's runtime defaults)"), "{raw}");
    assert!(m.contains("; calibrated for dgx-h100 on "), "{m}");

    // a search's best row, exported with the cluster and model the search recorded
    let search = tmp.path().join("search.json");
    let out = stepcast(&[
        "search",
        "--cluster",
        "dgx-h100",
        "--model",
        "llama3-8b",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--zero",
        "1",
        "--json",
        s(&search),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = tmp.path().join("launch.sh");
    let out = stepcast(&[
        "export",
        "--format",
        "megatron",
        "--from-search",
        s(&search),
        "--out",
        s(&script),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(&script).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&search).unwrap()).unwrap();
    let best = &doc["rows"][0]["layout"];
    assert!(
        text.contains(&format!("--tensor-model-parallel-size {}", best["tp"])),
        "{text}"
    );
    assert!(
        text.contains(&format!("--micro-batch-size {}", best["micro_batch"])),
        "{text}"
    );
    let out = stepcast(&[
        "export",
        "--format",
        "megatron",
        "--from-search",
        s(&search),
        "--rank",
        "0",
    ]);
    assert_user_error(&out, &["--rank 0", "give 1 to"]);
    // a search whose row no longer rebuilds as it was predicted (edited, or another
    // stepcast's) is refused; one without its inputs asks for them, and is exported with them
    let edited = tmp.path().join("edited.json");
    let mut changed = doc.clone();
    changed["rows"][0]["layout"]["micro_batches"] = serde_json::json!(1_000);
    fs::write(&edited, changed.to_string()).unwrap();
    let export = |file: &std::path::Path, extra: &[&str]| {
        let args = ["export", "--format", "megatron", "--from-search", s(file)];
        stepcast(&[&args[..], extra].concat())
    };
    assert_user_error(
        &export(&edited, &[]),
        &[
            "row 1 rebuilds to a different layout",
            "run the search again",
        ],
    );
    let mut bare = doc.clone();
    bare["provenance"]["inputs"] = serde_json::json!([]);
    fs::write(&edited, bare.to_string()).unwrap();
    assert_user_error(
        &export(&edited, &[]),
        &["names no cluster", "give --cluster"],
    );
    let with_cluster = ["--cluster", "dgx-h100"];
    assert_user_error(
        &export(&edited, &with_cluster),
        &["names no model", "give --model"],
    );
    let out = export(
        &edited,
        &[&with_cluster[..], &["--model", "llama3-8b"]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), fs::read_to_string(&script).unwrap());
    // the search's framework and models directory are followed: a directory gone since is
    // named with the fix
    let mut composer = doc.clone();
    composer["provenance"]["inputs"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"role": "framework", "name": "composer"}));
    fs::write(&edited, composer.to_string()).unwrap();
    let out = export(&edited, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("costed as the search was: --framework composer"),
        "{}",
        stderr(&out)
    );
    let gone = tmp.path().join("gone");
    for input in composer["provenance"]["inputs"].as_array_mut().unwrap() {
        if input["role"] == "models" {
            input["name"] = serde_json::json!(gone);
        }
    }
    fs::write(&edited, composer.to_string()).unwrap();
    assert_user_error(
        &export(&edited, &[]),
        &[
            "read models",
            "gone, which is not a directory here",
            "give --models",
        ],
    );
    // a schedule Megatron lacks is refused with the fix
    let out = stepcast(
        &[
            &["export", "--format", "megatron", "--schedule", "gpipe"][..],
            &job,
        ]
        .concat(),
    );
    assert_user_error(&out, &["GPipe", "--schedule 1f1b"]);
}

#[test]
fn context_parallelism_and_node_counts_as_users_give_them() {
    let job = |extra: &[&str]| -> Vec<String> {
        [
            "--cluster",
            "dgx-h100",
            "--model",
            "llama3-8b",
            "--tp",
            "2",
            "--cp",
            "2",
            "--dp",
            "2",
            "--micro-batch",
            "1",
            "--global-batch",
            "8",
            "--seq-len",
            "32768",
            "--sequence-parallel",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let args = |cmd: &str, extra: &[&str]| -> Vec<String> {
        std::iter::once(cmd.to_string()).chain(job(extra)).collect()
    };
    let call = |v: Vec<String>| stepcast(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let out = call(args("predict", &[]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("tp 2 · cp 2 (p2p) · pp 1 · dp 2 = 8 GPUs"),
        "{text}"
    );
    assert!(text.contains("CP comm"), "{text}");
    // the all-gather variant exposes its exchange
    let out = call(args("predict", &["--cp-comm", "all-gather"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("cp 2 (all-gather)"));
    // export carries cp to every framework
    let m = stdout(&call(args("export", &["--format", "megatron"])));
    assert!(
        m.contains("--context-parallel-size 2") && m.contains("--cp-comm-type p2p"),
        "{m}"
    );
    let n = stdout(&call(args("export", &["--format", "nemo"])));
    assert!(n.contains("context_parallel_size = 2"), "{n}");
    // a sequence the chunks do not divide, and a cluster too small once --nodes shrinks it
    let mut odd = args("predict", &[]);
    let seq = odd.iter().position(|a| a == "--seq-len").unwrap();
    odd[seq + 1] = "32766".into();
    assert_user_error(&call(odd), &["2·cp = 4 chunks", "seq-len 32766"]);
    assert_user_error(
        &call(args("predict", &["--nodes", "0"])),
        &["--nodes 0", "between 1 and"],
    );
    let out = call(args("predict", &["--nodes", "1"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut bigger = job(&["--nodes", "1"]);
    let dp = bigger.iter().position(|a| a == "--dp").unwrap();
    bigger[dp + 1] = "4".into();
    let out = call(
        std::iter::once("predict".to_string())
            .chain(bigger)
            .collect(),
    );
    assert_user_error(
        &out,
        &["tp·cp·pp·dp = 2·2·1·4 = 16 GPUs", "1 nodes × 8", "--nodes"],
    );
}

/// Gemma 2 9B from its published config.json: its norms after the attention and the MLP, its
/// logits' soft cap and its embeddings' scaling are in the operator list and make the step
/// longer than the same model without them (a YAML of the same sizes); the scores' cap,
/// inside the fused attention kernel, is said not to be costed, and is costed once the
/// attention is unfused.
/// An MPT config.json (mosaicml/mpt-7b's, with the FlashAttention llm-foundry trains with)
/// predicts the step of the architecture file the MPT benchmarks were checked with; as
/// published (`attn_impl` torch) its attention runs unfused, and the step is longer.
#[test]
fn mpt_config_json_costs_as_the_benchmarks_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = tmp.path().join(name);
        fs::write(&path, text).unwrap();
        path
    };
    let config = |attn_impl: &str| {
        format!(
            r#"{{"model_type":"mpt","d_model":4096,"n_heads":32,"n_layers":32,
                "expansion_ratio":4,"max_seq_len":2048,"vocab_size":50432,"no_bias":true,
                "norm_type":"low_precision_layernorm","learned_pos_emb":true,
                "attn_config":{{"alibi":true,"attn_impl":"{attn_impl}"}}}}"#
        )
    };
    let flash = write("flash.json", &config("flash"));
    let torch = write("torch.json", &config("torch"));
    let yaml = write(
        "mpt-7b.yaml",
        "name: mpt-7b\nlayers: 32\nhidden: 4096\nheads: 32\nkv_heads: 32\nffn_hidden: 16384\n\
         vocab: 50432\nnorm: layernorm\nactivation: gelu\nposition: alibi\n\
         linear_bias: false\nnorm_bias: false\nseq_len: 2048\nattention: flash\n\
         dropout: false\ntied_embeddings: true\n",
    );
    let step = |model: &std::path::Path| -> f64 {
        let out = stepcast(&[
            "predict",
            "--model",
            s(model),
            "--cluster",
            "dgx-a100",
            "--dp",
            "8",
            "--zero",
            "3",
            "--micro-batch",
            "4",
            "--global-batch",
            "256",
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    let (from_config, from_yaml, unfused) = (step(&flash), step(&yaml), step(&torch));
    assert_eq!(from_config, from_yaml);
    assert!(
        unfused > from_yaml,
        "unfused {unfused} s, flash {from_yaml} s"
    );
}

/// OLMo 2 from its config.json predicts what the YAML of its block does (norms only after
/// the attention and the MLP, query and key norms over the projection): the norms before are
/// gone from the operators, the output norms listed, the step shorter than the same model
/// with both, and exporting it for Megatron-LM refused with OLMo 2's reason.
#[test]
fn olmo_2_costs_its_reordered_norms() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = tmp.path().join(name);
        fs::write(&path, text).unwrap();
        path
    };
    let config = write(
        "config.json",
        r#"{"_name_or_path":"allenai/OLMo-2-1124-7B","model_type":"olmo2","hidden_size":4096,
            "intermediate_size":11008,"num_attention_heads":32,"num_key_value_heads":32,
            "num_hidden_layers":32,"vocab_size":100352,"max_position_embeddings":4096,
            "hidden_act":"silu","attention_bias":false,"tie_word_embeddings":false}"#,
    );
    let sizes = "name: allenai/OLMo-2-1124-7B\nlayers: 32\nhidden: 4096\nheads: 32\n\
                 ffn_hidden: 11008\nvocab: 100352\nnorm: rmsnorm\nactivation: swiglu\n\
                 seq_len: 4096\nqk_norm: true\npost_norms: true\n";
    let olmo = write(
        "olmo.yaml",
        &format!("{sizes}pre_norms: false\nqk_norm_span: projection\n"),
    );
    let both = write("both.yaml", sizes);
    let job = [
        "--cluster",
        "dgx-h100",
        "--tp",
        "2",
        "--dp",
        "4",
        "--sequence-parallel",
        "--micro-batch",
        "1",
        "--global-batch",
        "32",
    ];
    let run = |command: &str, model: &std::path::Path, extra: &[&str]| {
        let mut args = vec![command, "--model", s(model)];
        args.extend(job);
        args.extend(extra);
        stepcast(&args)
    };
    let step = |model: &std::path::Path| -> f64 {
        let out = run("predict", model, &["--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    let (from_config, from_yaml, with_both) = (step(&config), step(&olmo), step(&both));
    assert_eq!(from_config, from_yaml);
    assert!(from_yaml < with_both, "{from_yaml} {with_both}");
    let out = run("predict", &config, &["--operators", "--wide"]);
    let text = stdout(&out);
    for part in [
        "attention output norm",
        "mlp output norm",
        "q norm",
        "k norm",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    for gone in ["input norm", "post-attention norm"] {
        assert!(!text.contains(gone), "{gone}: {text}");
    }
    let out = run("export", &config, &["--format", "megatron"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("OLMo-core"), "{}", stderr(&out));
}

#[test]
fn gemma_2_costs_its_output_norms_and_soft_caps() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    fs::write(
        &config,
        r#"{"_name_or_path":"google/gemma-2-9b","model_type":"gemma2","hidden_size":3584,
            "intermediate_size":14336,"num_attention_heads":16,"num_key_value_heads":8,
            "head_dim":256,"num_hidden_layers":42,"vocab_size":256000,
            "max_position_embeddings":8192,"hidden_activation":"gelu_pytorch_tanh",
            "sliding_window":4096,"attn_logit_softcapping":50.0,
            "final_logit_softcapping":30.0}"#,
    )
    .unwrap();
    let sizes = "name: gemma-2-9b\nlayers: 42\nhidden: 3584\nheads: 16\nkv_heads: 8\n\
                 head_dim: 256\nffn_hidden: 14336\nvocab: 256000\nnorm: rmsnorm\n\
                 activation: geglu\ntied_embeddings: true\nsliding_window: 4096\n\
                 global_attention_every: 2\n";
    let yaml = |name: &str, extra: &str| {
        let path = tmp.path().join(name);
        fs::write(&path, format!("{sizes}{extra}")).unwrap();
        path
    };
    let plain = yaml("plain.yaml", "");
    let gemma_2 = yaml(
        "gemma-2.yaml",
        "post_norms: true\nattention_softcap: true\nfinal_softcap: true\nscaled_embeddings: true\n",
    );
    let unfused = yaml(
        "unfused.yaml",
        "post_norms: true\nattention_softcap: true\nfinal_softcap: true\nattention: unfused\n",
    );
    let predict = |model: &std::path::Path, extra: &[&str]| {
        let args: Vec<&str> = [
            "predict",
            "--model",
            s(model),
            "--cluster",
            "dgx-h100",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--global-batch",
            "64",
            "--seq-len",
            "4096",
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect();
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let step = |model: &std::path::Path| -> f64 {
        let v: serde_json::Value = serde_json::from_str(&predict(model, &["--json"])).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    let (from_config, with, without) = (step(&config), step(&gemma_2), step(&plain));
    assert_eq!(from_config, with);
    assert!(with > without * 1.01, "{with} {without}");
    let text = predict(&config, &["--operators", "--wide"]);
    for part in [
        "attention output norm",
        "mlp output norm",
        "logits softcap",
        "embedding scale",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(!text.contains("scores softcap"), "{text}");
    assert!(
        text.contains("soft cap runs inside the fused attention kernel"),
        "{text}"
    );
    let text = predict(&unfused, &["--operators", "--wide"]);
    assert!(text.contains("scores softcap"), "{text}");
    assert!(
        !text.contains("inside the fused attention kernel"),
        "{text}"
    );
}

#[test]
fn a_mixture_of_experts_from_its_config_with_expert_parallelism_and_imbalance() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    fs::write(
        &config,
        r#"{"_name_or_path":"mistralai/Mixtral-8x7B-v0.1","model_type":"mixtral",
            "hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,
            "num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":32000,
            "max_position_embeddings":32768,"num_local_experts":8,"num_experts_per_tok":2,
            "hidden_act":"silu","tie_word_embeddings":false}"#,
    )
    .unwrap();
    let layout = [
        "--cluster",
        "dgx-h100",
        "--nodes",
        "8",
        "--tp",
        "2",
        "--pp",
        "4",
        "--dp",
        "8",
        "--ep",
        "8",
        "--micro-batch",
        "1",
        "--global-batch",
        "256",
        "--sequence-parallel",
    ];
    let command = |cmd: &[&str], extra: &[&str]| {
        let args: Vec<&str> = cmd
            .iter()
            .chain(&["--model", s(&config)])
            .chain(&layout)
            .chain(extra)
            .copied()
            .collect();
        stepcast(&args)
    };
    let run = |extra: &[&str]| command(&["predict"], extra);
    let step = |extra: &[&str]| -> f64 {
        let out = run(&[extra, &["--json"]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    let out = run(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("ep 8 (imbalance 1)") && text.contains("EP comm"),
        "{text}"
    );
    assert!(step(&["--moe-imbalance", "1.5"]) > step(&[]));
    // the operator list says where the host waits for the token counts: the forward's
    // dispatch only, and nowhere when every expert's input is padded to a capacity
    let waits = |extra: &[&str]| -> Vec<String> {
        let out = run(&[extra, &["--operators", "--wide"]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
            .lines()
            .filter(|l| l.contains("the host waits for the device"))
            .map(|l| l.split('┆').take(2).collect::<Vec<_>>().join("|"))
            .collect()
    };
    let dropless = waits(&[]);
    assert!(
        dropless.len() == 1 && dropless[0].contains("fwd") && dropless[0].contains("dispatch"),
        "{dropless:?}"
    );
    let padded = ["--moe-capacity-factor", "1", "--moe-pad-to-capacity"];
    assert!(waits(&padded).is_empty());
    let m = stdout(&command(&["export", "--format", "megatron"], &[]));
    assert!(
        m.contains("--num-experts 8 --moe-router-topk 2")
            && m.contains("--expert-model-parallel-size 8"),
        "{m}"
    );
    assert_user_error(
        &run(&["--moe-imbalance", "9"]),
        &["--moe-imbalance 9", "between 1"],
    );
}

/// A routing file from flags or a job file (relative to it): the header line shows the
/// per-layer loads it gives for the layout's ep, and a skew of 1.5 in every layer with one
/// expert per rank predicts what `--moe-imbalance 1.5` does.
#[test]
fn a_routing_file_gives_each_layer_its_load() {
    let tmp = tempfile::tempdir().unwrap();
    let mut csv = String::from("# tokens per expert from a run\nlayer,expert,tokens\n");
    for l in 0..32 {
        for e in 0..8 {
            csv += &format!("{l},{e},{}\n", if e == 0 { 21 } else { 13 });
        }
    }
    fs::write(tmp.path().join("routing.csv"), csv).unwrap();
    let model = std::path::PathBuf::from(repo("tests/data/mixtral-8x7b.yaml"));
    let job = tmp.path().join("job.yaml");
    fs::write(
        &job,
        format!(
            "cluster: dgx-h100\nmodel: {}\nmoe_routing: routing.csv\nparallel: {{dp: 8, ep: 8, \
             micro_batch: 1, global_batch: 64}}\n",
            model.display()
        ),
    )
    .unwrap();
    let step = |args: &[&str]| -> (f64, String) {
        let out = stepcast(&[&["predict"], args].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let out = stepcast(&[&["predict", "--json"], args].concat());
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        (v["step_time_s"].as_f64().unwrap(), text)
    };
    let (routed, text) = step(&["--job", s(&job)]);
    assert!(
        text.contains("ep 8 (busiest rank's load 1.50–1.50, mean 1.50, from"),
        "{text}"
    );
    let mut flags = vec!["--cluster", "dgx-h100", "--model", s(&model)];
    flags.extend("--dp 8 --ep 8 --micro-batch 1 --global-batch 64".split(' '));
    let routing = tmp.path().join("routing.csv");
    let (flag, _) = step(&[&flags[..], &["--moe-routing", s(&routing)]].concat());
    let imbalance = step(&[&flags[..], &["--moe-imbalance", "1.5"]].concat()).0;
    assert_eq!(routed, flag);
    assert_eq!(routed, imbalance);
    // ep 4 averages expert 0 with expert 1 on its rank: a lighter load
    let (ep4, text) = step(&["--job", s(&job), "--ep", "4"]);
    assert!(text.contains("load 1.21–1.21"), "{text}");
    assert!(ep4 < routed);
    // the README's example file reads as its header line says
    let example = repo("docs/examples/mixtral-routing-synthetic.csv");
    let (_, text) = step(&[&flags[..], &["--moe-routing", &example]].concat());
    assert!(text.contains("load 1.00–1.76, mean 1.39"), "{text}");
}

/// Llama 3.1 405B split as NVIDIA's recipe does (the embedding and the loss each take a layer's
/// place) from flags or a job file, and exported with Megatron's and NeMo's own switches.
#[test]
fn the_embedding_and_loss_can_count_as_layers_in_the_pipeline_split() {
    let layout = [
        "--cluster",
        "dgx-h100",
        "--model",
        "llama3-405b",
        "--tp",
        "8",
        "--pp",
        "8",
        "--vpp",
        "8",
        "--dp",
        "2",
        "--micro-batch",
        "1",
        "--global-batch",
        "64",
        "--sequence-parallel",
    ];
    let flags = [
        "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split",
    ];
    let out = stepcast(&[&["predict"][..], &layout].concat());
    assert_user_error(
        &out,
        &[
            "126 layers do not split",
            "--account-for-loss-in-pipeline-split",
        ],
    );
    let out = stepcast(&[&["predict"][..], &layout, &flags].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let split = "(embedding and loss counted as layers) [15, 16, 16, 16, 16, 16, 16, 15]";
    assert!(stdout(&out).contains(split), "{}", stdout(&out));
    // either alone: 32 layers and the one counted on three stages
    for (flag, header) in [
        (flags[0], "(embedding counted as a layer) [10, 11, 11]"),
        (flags[1], "(loss counted as a layer) [11, 11, 10]"),
    ] {
        let out = stepcast(&[
            "predict",
            "--cluster",
            "dgx-h100",
            "--model",
            "llama2-7b",
            "--pp",
            "3",
            "--micro-batch",
            "1",
            "--global-batch",
            "8",
            flag,
        ]);
        assert!(stdout(&out).contains(header), "{}", stderr(&out));
    }

    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.yaml");
    fs::write(
        &job,
        "cluster: dgx-h100\nmodel: llama3-405b\nparallel: {tp: 8, pp: 8, vpp: 8, dp: 2, \
         micro_batch: 1, global_batch: 64, sequence_parallel: true, \
         account_for_embedding_in_pipeline_split: true, account_for_loss_in_pipeline_split: true}\n",
    )
    .unwrap();
    let from_job = stepcast(&["predict", "--job", s(&job)]);
    assert!(from_job.status.success(), "{}", stderr(&from_job));
    assert!(stdout(&from_job).contains(split));

    let out = stepcast(&[&["export", "--format", "megatron"][..], &layout, &flags].concat());
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for arg in flags
        .iter()
        .chain(&["--num-virtual-stages-per-pipeline-rank 8"])
    {
        assert!(text.contains(arg), "{arg}: {text}");
    }
    assert!(
        !text.contains("--num-layers-per-virtual-pipeline-stage"),
        "{text}"
    );
    let out = stepcast(&[&["export", "--format", "nemo"][..], &layout, &flags].concat());
    assert!(
        stdout(&out).contains("model.config.account_for_loss_in_pipeline_split = True"),
        "{}",
        stdout(&out)
    );

    // the same chunks as Megatron-Core's layout string, from a job file: the same step
    let step = |args: &[&str]| -> f64 {
        let out = stepcast(&[&["predict", "--json"], args].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    fs::write(
        &job,
        "cluster: dgx-h100\nmodel: llama3-405b\nparallel: {tp: 8, pp: 8, dp: 2, \
         micro_batch: 1, global_batch: 64, sequence_parallel: true, \
         pipeline_layout: \"Et|(tt|)*62tL\"}\n",
    )
    .unwrap();
    assert_eq!(
        step(&["--job", s(&job)]),
        step(&[&layout[..], &flags].concat())
    );
    let out = stepcast(&["predict", "--job", s(&job)]);
    assert!(
        stdout(&out).contains("pipeline layout \"Et|(tt|)*62tL\" [15, 16"),
        "{}",
        stdout(&out)
    );
    let out = stepcast(&["export", "--format", "megatron", "--job", s(&job)]);
    let text = stdout(&out);
    assert!(
        text.contains("--pipeline-model-parallel-layout \"Et|(tt|)*62tL\"")
            && !text.contains("--num-virtual-stages-per-pipeline-rank"),
        "{text}"
    );
}

/// DeepSeek-V3 from its published config.json: predicted with expert parallelism and exported
/// for Megatron-LM with its latent attention and dense first layers.
#[test]
fn deepseek_v3_from_its_config_predicts_and_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    fs::write(
        &config,
        r#"{"model_type":"deepseek_v3","_name_or_path":"deepseek-ai/DeepSeek-V3",
        "vocab_size":129280,"hidden_size":7168,"intermediate_size":18432,"moe_intermediate_size":2048,
        "num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,
        "n_shared_experts":1,"n_routed_experts":256,"kv_lora_rank":512,"q_lora_rank":1536,
        "qk_rope_head_dim":64,"v_head_dim":128,"qk_nope_head_dim":128,"num_experts_per_tok":8,
        "n_group":8,"topk_group":4,
        "moe_layer_freq":1,"first_k_dense_replace":3,"hidden_act":"silu",
        "max_position_embeddings":163840,"tie_word_embeddings":false,"num_nextn_predict_layers":1}"#,
    )
    .unwrap();
    let layout = [
        "--cluster",
        "dgx-h100",
        "--model",
        s(&config),
        "--tp",
        "8",
        "--dp",
        "64",
        "--ep",
        "64",
        "--micro-batch",
        "1",
        "--global-batch",
        "512",
        "--sequence-parallel",
        "--json",
    ];
    let out = stepcast(&[&["predict"][..], &layout].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let step = p["step_time_s"].as_f64().unwrap();
    let mfu = p["mfu_percent"].as_f64().unwrap();
    assert!(
        step > 0.0 && step.is_finite() && mfu > 0.0 && mfu < 87.0,
        "{step} {mfu}"
    );
    let out = stepcast(
        &[
            &["export", "--format", "megatron"][..],
            &layout[..layout.len() - 1],
        ]
        .concat(),
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for arg in [
        "--multi-latent-attention",
        "--q-lora-rank 1536",
        "--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128",
        "--moe-layer-freq \"([0]*3+[1]*58)\"",
        "--num-experts 256",
    ] {
        assert!(text.contains(arg), "{arg}: {text}");
    }
    assert!(!text.contains("--mtp-num-layers"), "{text}");
    // with DeepSeek-V3's multi-token prediction module
    let with_mtp = [&layout[..layout.len() - 1], &["--mtp-layers", "1"]].concat();
    let out = stepcast(&[&["export", "--format", "megatron"][..], &with_mtp].concat());
    assert!(
        stdout(&out).contains("--mtp-num-layers 1"),
        "{}",
        stderr(&out)
    );
    let out = stepcast(&[&["predict"][..], &with_mtp, &["--json"]].concat());
    let p_mtp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(p_mtp["step_time_s"].as_f64().unwrap() > step);
    // NVIDIA's recipe: the module beside the loss in a layout string, MLA up-projections
    // and dense MLPs recomputed; the header says so and the export carries both
    let mut recipe = layout[..6].to_vec();
    recipe.extend(
        "--pp 2 --dp 32 --ep 32 --micro-batch 1 --global-batch 512 --sequence-parallel \
         --pipeline-layout Et*31|t*30mL --recompute-modules mla_up_proj,mlp \
         --moe-dispatcher hybridep"
            .split_whitespace(),
    );
    let out = stepcast(&[&["predict"][..], &recipe].concat());
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("recompute selective (mla_up_proj, mlp), pipeline layout \"Et*31|t*30mL\"")
            && text.contains("ep 32 (imbalance 1) over hybridep"),
        "{text}"
    );
    let out = stepcast(&[&["export", "--format", "megatron"][..], &recipe].concat());
    let text = stdout(&out);
    for arg in [
        "--recompute-granularity selective",
        "--recompute-modules mla_up_proj mlp",
        "--pipeline-model-parallel-layout \"Et*31|t*30mL\"",
        "--mtp-num-layers 1",
        "--moe-token-dispatcher-type flex",
        "--moe-flex-dispatcher-backend hybridep",
        "--moe-router-num-groups 8 --moe-router-group-topk 4",
    ] {
        assert!(text.contains(arg), "{arg}: {text}");
    }
}

/// The shipped DGX A100 file with its models directory replaced by `models`, in `dir` (its
/// collectives still from the shipped nccl-tests models).
fn dgx_a100_with_models(dir: &std::path::Path, models: &std::path::Path) -> std::path::PathBuf {
    let cluster = dir.join("cluster.yaml");
    let text = fs::read_to_string(repo("hardware-profiles/dgx-a100.yaml")).unwrap();
    let text = text
        .replace(
            "  dir: ../models/perlmutter",
            &format!("  dir: {}", s(models)),
        )
        .replace(
            "  collectives_from: ../models/a100-aiconfigurator",
            &format!("  collectives_from: {}", repo("models/a100-aiconfigurator")),
        );
    assert!(text.contains(s(models)) && text.contains("a100-aiconfigurator"));
    fs::write(&cluster, text).unwrap();
    cluster
}

/// Fused-Adam timings (what `bench collect` records for Megatron's step) train a model that
/// Megatron's optimizer step then uses on every stage, in place of the roofline.
#[test]
fn a_timed_fused_adam_steps_megatrons_optimizer() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    common::write_dataset(&ds);
    // 3 µs per million parameters over 3 ms: far from the 28-byte roofline, so it shows
    let mut rows = String::from("op,role,dtype,phase,params,tensors,time_us\n");
    for i in 1..=40u64 {
        let (params, tensors) = (i * 25_000_000, 20 + 3 * i);
        let t = 3000.0 + 3.0 * params as f64 / 1e6;
        rows.push_str(&format!(
            "optimizer_step,fused_adam,fp16,none,{params},{tensors},{t:.1}\n"
        ));
    }
    fs::write(ds.join("optimizer_step.csv"), rows).unwrap();
    let models = tmp.path().join("models");
    let out = stepcast(&["train", s(&ds), "--out", s(&models), "--quiet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let args = format!(
        "predict --cluster {} --model llama2-7b --tp 2 --pp 2 --dp 2 --micro-batch 1 \
         --micro-batches 4 --dtype fp16 --json",
        s(&cluster)
    );
    let out = stepcast(&args.split_whitespace().collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for stage in p["stages"].as_array().unwrap() {
        let step = stage["update"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["label"] == "optimizer step")
            .expect("an optimizer step");
        assert!(
            step["query"].as_str().unwrap().contains("(fused_adam)"),
            "{step}"
        );
        assert_eq!(step["estimate"]["source"], "learned", "{step}");
        let us = step["estimate"]["time_us"].as_f64().unwrap();
        assert!(us > 3000.0, "{us}");
    }
}

/// A runs CSV on `cluster`: two families under each of two frameworks (llama2-7b and
/// llama2-13b at dp 4 and 8, micro-batch 1, 2,048 tokens, bf16), composer's steps a quarter
/// longer than megatron's; one set, `s`.
fn runs_of_two_frameworks(cluster: &std::path::Path) -> String {
    let mut runs = String::from(
        "set,family,label,cluster,model,framework,tp,pp,dp,micro_batch,global_batch,seq_len,\
         dtype,recompute,zero,schedule,vpp,sequence_parallel,tp_comm_overlap,measured_step_s,\
         expressible,reason\n",
    );
    for (fw, scale) in [("composer", 1.25), ("megatron", 1.0)] {
        for (family, model) in [("llama2-7b", "llama2-7b"), ("llama2-13b", "llama2-13b")] {
            for dp in [4, 8] {
                runs.push_str(&format!(
                    "s,{family},{model} {fw} dp{dp},{},{model},{fw},1,1,{dp},1,{},2048,bf16,none,\
                     1,1f1b,1,false,0,{},true,\n",
                    s(cluster),
                    dp * 8,
                    scale * if family == "llama2-7b" { 3.3 } else { 6.1 }
                ));
            }
        }
    }
    runs
}

/// `calibrate --check` fits and writes nothing: it judges each run as `predict` composes it
/// now — under its framework's calibration where the cluster has one, else the cluster's,
/// else the defaults — beside the raw physics, and marks the sets a calibration was fitted on
/// (their error is in sample).
#[test]
fn calibrate_check_judges_runs_as_predict_composes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let csv = tmp.path().join("runs.csv");
    fs::write(&csv, runs_of_two_frameworks(&cluster)).unwrap();
    let report = tmp.path().join("check.json");
    let calibrate = |extra: &[&str]| {
        let mut args = vec!["calibrate", s(&csv), "--cluster", s(&cluster)];
        args.extend_from_slice(extra);
        stepcast(&args)
    };
    let check = || {
        let out = calibrate(&["--check", "--json", s(&report)]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&report).unwrap()).unwrap();
        (stdout(&out), json)
    };
    // no calibration yet: every run under the cluster's defaults, the raw physics itself
    let (text, json) = check();
    assert!(
        text.contains(
            "4 runs: the cluster's defaults (no calibration under composer for dgx-a100)"
        ) && text.contains("4 runs: the cluster's defaults (no calibration under megatron"),
        "{text}"
    );
    assert_eq!(json["check"], true);
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    assert!(runs.iter().all(|r| r["cross_validated_s"] == r["raw_s"]));
    assert_eq!(json["sets"]["s"]["fitted"], false);
    assert!(!models.join("calibration.yaml").exists());
    // with a fit of composer's runs, those are composed under it, as `predict --framework
    // composer` composes them; megatron's stay on the defaults (the cluster has no fit)
    let fitted = calibrate(&["--framework", "composer"]);
    assert!(fitted.status.success(), "{}", stderr(&fitted));
    let (text, json) = check();
    assert!(
        text.contains("4 runs: calibrated for dgx-a100 under composer on 4 measured runs")
            && text.contains("4 runs: the cluster's defaults (no calibration under megatron")
            && text.contains("s (in sample)"),
        "{text}"
    );
    let run = |label: &str| {
        json["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["label"] == label)
            .unwrap()
            .clone()
    };
    let (composer, megatron) = (run("llama2-7b composer dp4"), run("llama2-7b megatron dp4"));
    assert_eq!(megatron["cross_validated_s"], megatron["raw_s"]);
    assert_ne!(composer["cross_validated_s"], composer["raw_s"]);
    let predicted = json_of(&stepcast(&[
        "predict",
        "--cluster",
        s(&cluster),
        "--model",
        "llama2-7b",
        "--dp",
        "4",
        "--micro-batch",
        "1",
        "--global-batch",
        "32",
        "--seq-len",
        "2048",
        "--framework",
        "composer",
        "--json",
    ]))["step_time_s"]
        .as_f64()
        .unwrap();
    let checked = composer["cross_validated_s"].as_f64().unwrap();
    assert!(
        (checked / predicted - 1.0).abs() < 1e-9,
        "{checked} {predicted}"
    );
    assert_eq!(json["sets"]["s"]["fitted"], true);
    // a check fits nothing, so it takes no sets to fit on and writes no calibration
    let refused = calibrate(&["--check", "--fit-sets", "s"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}

/// What `calibrate` cannot use it says, with the fix: sets to fit on that no run has, runs on
/// a cluster file that does not load (left out with a warning; none left: refused), built-in
/// models without `--out`.
#[test]
fn calibrate_says_what_it_cannot_use() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let csv = tmp.path().join("runs.csv");
    let calibrate = |cluster: &std::path::Path, extra: &[&str]| {
        let args = ["calibrate", s(&csv), "--cluster", s(cluster)];
        stepcast(&[&args[..], extra].concat())
    };
    fs::write(&csv, runs_of_two_frameworks(&cluster)).unwrap();
    assert_user_error(
        &calibrate(&cluster, &["--fit-sets", "nope", "--dry-run"]),
        &["--fit-sets names 'nope'", "set column"],
    );
    let gone = tmp.path().join("gone.yaml");
    fs::write(&csv, runs_of_two_frameworks(&gone)).unwrap();
    let out = calibrate(&cluster, &["--dry-run"]);
    assert_user_error(
        &out,
        &["no run on a cluster with the models of", "cluster column"],
    );
    assert!(
        stderr(&out).contains(&format!("warning: runs on {} left out", s(&gone))),
        "{}",
        stderr(&out)
    );
    // a built-in cluster by name: its models are in the binary, with no directory to write to
    let builtin = std::path::PathBuf::from("dgx-a100");
    fs::write(&csv, runs_of_two_frameworks(&builtin)).unwrap();
    assert_user_error(
        &calibrate(&builtin, &[]),
        &["models are built in", "give --out FILE.yaml"],
    );
}

/// `calibrate --framework` fits one framework's runs alone and writes its own entry beside the
/// cluster's; `predict --framework` (and a job file's `framework:`) picks it, says so, and
/// says when a framework has none.
#[test]
fn a_framework_calibrated_on_its_own_runs_is_picked_by_predict() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let csv = tmp.path().join("runs.csv");
    fs::write(&csv, runs_of_two_frameworks(&cluster)).unwrap();
    let calibrate = |extra: &[&str]| {
        let mut args = vec!["calibrate", s(&csv), "--cluster", s(&cluster)];
        args.extend_from_slice(extra);
        stepcast(&args)
    };
    let out = calibrate(&["--framework", "Composer"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("under composer written"),
        "{}",
        stdout(&out)
    );
    // while another stepcast writes the models directory (a training, another calibration)
    // the calibration is refused, the file as it was
    let before = fs::read_to_string(models.join("calibration.yaml")).unwrap();
    let held = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(models.join(".stepcast.lock"))
        .unwrap();
    held.try_lock().unwrap();
    assert_user_error(
        &calibrate(&[]),
        &["another stepcast is using this directory"],
    );
    assert_eq!(
        fs::read_to_string(models.join("calibration.yaml")).unwrap(),
        before
    );
    drop(held);
    let out = calibrate(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written = fs::read_to_string(models.join("calibration.yaml")).unwrap();
    let entries: Vec<&str> = written.split("- cluster: dgx-a100").skip(1).collect();
    assert_eq!(entries.len(), 2, "{written}");
    assert!(entries
        .iter()
        .any(|e| e.contains("framework: composer") && e.contains("runs: 4")));
    assert!(entries
        .iter()
        .any(|e| !e.contains("framework:") && e.contains("runs: 8")));
    // `models show` lists both fits: cluster, framework, runs, errors and fitted values
    let shown = stdout(&stepcast(&["models", "show", s(&models), "--wide"]));
    let rows: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("│ dgx-a100 "))
        .collect();
    assert!(
        rows.len() == 2
            && rows
                .iter()
                .any(|l| l.contains("composer") && l.contains(" 4 "))
            && rows
                .iter()
                .any(|l| l.contains(" any ") && l.contains(" 8 ")),
        "{shown}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&stepcast(&["models", "show", s(&models), "--json"]).stdout)
            .unwrap();
    assert_eq!(json["calibrations"].as_array().map(Vec::len), Some(2));
    // predict picks the framework's entry, or says there is none and keeps the cluster's
    // `command` on `dp` GPUs at global batch `batch`
    let on = |command: &'static str, dp: &'static str, batch: &'static str, extra: &[&str]| {
        let mut args = vec![
            command,
            "--cluster",
            s(&cluster),
            "--model",
            "llama2-7b",
            "--tp",
            "1",
            "--pp",
            "1",
            "--dp",
            dp,
            "--micro-batch",
            "1",
            "--global-batch",
            batch,
            "--seq-len",
            "2048",
        ];
        args.extend_from_slice(extra);
        stepcast(&args)
    };
    let predict_on = |dp: &'static str, batch: &'static str, extra: &[&str]| {
        let out = on("predict", dp, batch, extra);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let predict = |extra: &[&str]| predict_on("4", "32", extra);
    let step = |text: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with("step time")).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let (general, composer) = (predict(&[]), predict(&["--framework", "composer"]));
    assert!(
        composer.contains("under composer on 4 measured runs"),
        "{composer}"
    );
    assert!(
        general.contains("on 8 measured runs") && !general.contains("under"),
        "{general}"
    );
    assert!(step(&composer) > step(&general), "{composer}\n{general}");
    // the fit records the range of its runs: inside it a prediction is silent, outside it
    // says which dimensions lie beyond the runs, and the raw physics does not
    assert!(!general.contains("outside the runs"), "{general}");
    let beyond = predict_on("32", "64", &[]);
    assert!(
        beyond.contains(
            "outside the runs the runtime was calibrated on: 32 GPUs on 4 nodes (runs: 4–8 GPUs \
             on 1 node)"
        ),
        "{beyond}"
    );
    // beyond them its interval spans how far published steps outside their calibration's
    // runs were off (mostly slower), not the fit's error on its own runs
    assert!(
        beyond.contains("as the step lies outside the calibrated runs, ×"),
        "{beyond}"
    );
    let beyond_json = json_of(&on("predict", "32", "64", &["--json"]));
    let band: Vec<f64> = beyond_json["interval_extrapolation_band"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let (step_s, high_s) = (
        beyond_json["step_time_s"].as_f64().unwrap(),
        beyond_json["interval_s"][1].as_f64().unwrap(),
    );
    let (band_low, band_high) = stepcast::predict::EXTRAPOLATION_BAND;
    assert!(band[0] <= band_low && band[1] >= band_high, "{band:?}");
    assert!(high_s >= step_s * band[1] * (1.0 - 1e-9), "{beyond_json}");
    let inside_json = json_of(&on("predict", "4", "32", &["--json"]));
    assert!(
        inside_json.get("interval_extrapolation_band").is_none()
            && inside_json["interval_s"][1].as_f64().unwrap()
                < inside_json["step_time_s"].as_f64().unwrap() * 1.40,
        "{inside_json}"
    );
    let raw = predict_on("32", "64", &["--no-calibration"]);
    assert!(!raw.contains("outside the runs"), "{raw}");
    // the interval carries the runtime's error on measured runs: the calibration's, or the raw
    // physics' on the same runs
    assert!(
        general.contains("operator models and the calibration's error on its runs"),
        "{general}"
    );
    assert!(
        raw.contains("operator models and the raw physics' error on measured runs"),
        "{raw}"
    );

    // search says it of its best layout, export of the step in its headline
    let searched = stepcast(&[
        "search",
        "--cluster",
        s(&cluster),
        "--model",
        "llama2-7b",
        "--gpus",
        "32",
        "--global-batch",
        "64",
        "--seq-len",
        "2048",
    ]);
    assert!(
        stdout(&searched).contains("warning: the best layout lies outside the runs"),
        "{}",
        stdout(&searched)
    );
    let exported = on("export", "32", "64", &["--format", "megatron"]);
    assert!(
        exported.status.success()
            && stderr(&exported).contains("the predicted step in the headline lies outside"),
        "{}",
        stderr(&exported)
    );
    assert!(
        shown.contains("dgx-a100 fitted on 4–8 GPUs on 1 node, 6.74–13 B parameters, sequences of 2,048 tokens, bf16"),
        "{shown}"
    );
    let jax = predict(&["--framework", "jax"]);
    assert!(jax.contains("no calibration under jax") && step(&jax) == step(&general));
    // the same from a job file
    let job = tmp.path().join("job.yaml");
    fs::write(
        &job,
        format!(
            "cluster: {}\nmodel: llama2-7b\nframework: composer\nparallel:\n  tp: 1\n  pp: 1\n  \
             dp: 4\n  micro_batch: 1\n  global_batch: 32\n  seq_len: 2048\n",
            s(&cluster)
        ),
    )
    .unwrap();
    let out = stepcast(&["predict", "--job", s(&job)]);
    assert!(stdout(&out).contains("under composer"), "{}", stdout(&out));
    // bad names and frameworks without runs are refused with what to change
    assert_user_error(
        &calibrate(&["--framework", "jax", "--dry-run"]),
        &["jax", "framework column"],
    );
    assert_user_error(
        &stepcast(&[
            "predict",
            "--cluster",
            s(&cluster),
            "--model",
            "llama2-7b",
            "--framework",
            "a b",
        ]),
        &["framework name"],
    );
}

/// A cluster with no measured runs of its own composes under the calibration its file borrows
/// (`models.calibration_from`) and says whose it is; `--no-calibration` still shows its own
/// defaults, and without the line the cluster keeps them. Perlmutter, the paper's cluster,
/// borrows the DGX A100's (the same GPU and kernel models).
#[test]
fn a_cluster_without_runs_composes_under_the_calibration_its_file_borrows() {
    let predict = |cluster: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "predict",
            "--cluster",
            cluster,
            "--model",
            "llemma-7b",
            "--tp",
            "2",
            "--pp",
            "2",
            "--dp",
            "1",
            "--micro-batch",
            "1",
            "--micro-batches",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // the launch cost the shipped DGX A100 calibration fitted
    let shipped = fs::read_to_string(repo("models/perlmutter/calibration.yaml")).unwrap();
    let entry = shipped
        .split("- cluster: dgx-a100\n  runtime:")
        .nth(1)
        .unwrap();
    let fitted: f64 = entry
        .split("launch_us: ")
        .nth(1)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let borrowed = predict("perlmutter", &[]);
    let summary = borrowed["calibration"].as_str().unwrap();
    assert!(
        summary.starts_with("calibrated for dgx-a100 on ")
            && summary.contains("borrowed by perlmutter"),
        "{summary}"
    );
    assert_eq!(borrowed["runtime"]["launch_us"].as_f64(), Some(fitted));
    let raw = predict("perlmutter", &["--no-calibration"]);
    assert!(raw["calibration"].is_null(), "{}", raw["calibration"]);
    assert_eq!(raw["runtime"]["launch_us"].as_f64(), Some(20.0));
    // the same file without the line: the cluster's own defaults, the same step as raw
    let tmp = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(repo("hardware-profiles/perlmutter.yaml")).unwrap();
    let own = text.replace("  calibration_from: dgx-a100\n", "").replace(
        "  dir: ../models/perlmutter",
        &format!("  dir: {}", repo("models/perlmutter")),
    );
    assert!(!own.contains("calibration_from") && own.contains(&repo("models/perlmutter")));
    let cluster = tmp.path().join("perlmutter.yaml");
    fs::write(&cluster, own).unwrap();
    let plain = predict(s(&cluster), &[]);
    assert!(plain["calibration"].is_null(), "{}", plain["calibration"]);
    assert_eq!(plain["step_time_s"], raw["step_time_s"]);
    assert_ne!(plain["step_time_s"], borrowed["step_time_s"]);
    // a name the models' calibrations lack is said, and the defaults compose
    let typo = cluster.with_file_name("typo.yaml");
    fs::write(
        &typo,
        fs::read_to_string(&cluster).unwrap().replace(
            "  collectives: true",
            "  collectives: true\n  calibration_from: dgx-a10",
        ),
    )
    .unwrap();
    let unknown = predict(s(&typo), &[]);
    let said = unknown["calibration"].as_str().unwrap();
    assert!(said.contains("calibration_from names 'dgx-a10'"), "{said}");
    assert_eq!(unknown["step_time_s"], raw["step_time_s"]);
    // a cluster with a framework's fit of its own keeps it for that framework and borrows for
    // the rest: the DGX A100 40 GB (MosaicML's Composer runs only)
    let calibration = |extra: &[&str]| {
        predict("dgx-a100-40gb", extra)["calibration"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(calibration(&[]).contains("borrowed by dgx-a100-40gb"));
    let composer = calibration(&["--framework", "composer"]);
    assert!(
        composer.starts_with("calibrated for dgx-a100-40gb under composer")
            && !composer.contains("borrowed"),
        "{composer}"
    );
}

/// The DGX H200 costs its kernels from NVIDIA's H200 measurements and composes them under the
/// runtime fitted on the DGX H100's runs (same SM, NVLink and software), read from beside the
/// H100's models; its 141 GB hold a layout the H100's 80 do not, and its memory-bound kernels
/// run at its 4.8 TB/s.
#[test]
fn the_dgx_h200_borrows_the_h100_runtime_and_has_its_own_memory() {
    let predict = |cluster: &str, extra: &[&str]| -> serde_json::Value {
        let mut args: Vec<&str> =
            "predict --model llama3-70b --tp 4 --pp 4 --dp 4 --micro-batch 1 \
             --global-batch 256 --seq-len 8192 --sequence-parallel --vpp 5 --json --cluster"
                .split_whitespace()
                .collect();
        args.push(cluster);
        args.extend_from_slice(extra);
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let shipped = fs::read_to_string(repo("models/h100-sxm/calibration.yaml")).unwrap();
    let fitted: f64 = shipped
        .split("launch_us: ")
        .nth(1)
        .and_then(|t| t.lines().next())
        .unwrap()
        .parse()
        .unwrap();
    let (h100, h200) = (predict("dgx-h100", &[]), predict("dgx-h200", &[]));
    let summary = h200["calibration"].as_str().unwrap();
    assert!(
        summary.starts_with("calibrated for dgx-h100 on ")
            && summary.contains("borrowed by dgx-h200"),
        "{summary}"
    );
    assert_eq!(h200["runtime"], h100["runtime"]);
    assert_eq!(h200["runtime"]["launch_us"].as_f64(), Some(fitted));
    // a framework's fit is borrowed the same way: the DGX H100's under Composer
    let composer = predict("dgx-h200", &["--framework", "composer"]);
    let said = composer["calibration"].as_str().unwrap();
    assert!(
        said.starts_with("calibrated for dgx-h100 under composer") && said.contains("borrowed"),
        "{said}"
    );
    assert_eq!(
        composer["runtime"],
        predict("dgx-h100", &["--framework", "composer"])["runtime"]
    );
    // the file beside the checkout's H100 file lends the same
    let from_file = predict(&repo("hardware-profiles/dgx-h200.yaml"), &[]);
    assert_eq!(from_file["step_time_s"], h200["step_time_s"]);
    assert_eq!(h100["memory"]["verdict"], "OOM");
    assert_eq!(h200["memory"]["verdict"], "FITS");
    // the norms come from the roofline at each GPU's HBM bandwidth: 3.35 against 4.8 TB/s
    let norm_us = |p: &serde_json::Value| {
        p["stages"][0]["fwd"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["label"] == "input norm")
            .and_then(|c| c["estimate"]["time_us"].as_f64())
            .unwrap()
    };
    assert!(
        norm_us(&h200) < 0.8 * norm_us(&h100),
        "{} {}",
        norm_us(&h200),
        norm_us(&h100)
    );
}

/// `search` and `export` say which runtime composed their steps, as `predict` does: the
/// calibration (here the one Perlmutter borrows), the cluster's defaults under
/// `--no-calibration`, and none under the paper's rules (the isolated-kernel sum).
#[test]
fn search_and_export_say_which_runtime_composed_their_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let search = |extra: &[&str]| {
        let mut args: Vec<&str> = "search --cluster perlmutter --model llemma-7b --gpus 8 \
                                   --global-batch 16 --tp 2 --pp 2,4 --micro-batch 1 \
                                   --schedule 1f1b"
            .split_whitespace()
            .collect();
        args.extend_from_slice(extra);
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let json = tmp.path().join("search.json");
    let text = search(&["--json", s(&json)]);
    assert!(
        text.contains("runtime  calibrated for dgx-a100") && text.contains("borrowed"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    assert!(doc["calibration"].as_str().unwrap().contains("dgx-a100"));
    assert!(doc["runtime"]["launch_us"].as_f64().unwrap() > 20.0);
    let raw = search(&["--no-calibration"]);
    assert!(raw.contains("runtime  the cluster's defaults"), "{raw}");
    let paper = search(&["--rules", "paper"]);
    assert!(!paper.contains("runtime "), "{paper}");
    let export = "export --cluster perlmutter --model llemma-7b --tp 2 --pp 2 --dp 2 \
                  --micro-batch 1 --micro-batches 4 --format megatron";
    let out = stepcast(&export.split_whitespace().collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let first = stdout(&out).lines().nth(1).unwrap_or_default().to_string();
    assert!(
        first.contains("s per step") && first.contains("calibrated for dgx-a100"),
        "{first}"
    );
}

/// A calibration next to good models that today's bounds refuse (fitted under wider ones) is
/// refused as the calibration's fault, with its own fix: training the models again, which
/// the models' message advises, would not mend it.
#[test]
fn a_calibration_outside_the_bounds_is_refused_with_its_own_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let shipped = fs::read_to_string(repo("models/perlmutter/calibration.yaml")).unwrap();
    let (head, tail) = shipped.split_once("step_overhead_ms: ").unwrap();
    let (_, rest) = tail.split_once('\n').unwrap();
    fs::write(
        models.join("calibration.yaml"),
        format!("{head}step_overhead_ms: 98.0\n{rest}"),
    )
    .unwrap();
    let out = stepcast(&[
        "predict",
        "--cluster",
        "dgx-a100",
        "--models",
        models.to_str().unwrap(),
        "--model",
        "llama2-7b",
        "--dp",
        "8",
        "--micro-batch",
        "1",
        "--global-batch",
        "8",
    ]);
    assert_user_error(
        &out,
        &[
            "reading the calibration of models",
            "calibration.yaml (dgx-a100)",
            "step_overhead_ms = 98",
            "write it again with `stepcast calibrate`",
        ],
    );
    assert!(!stderr(&out).contains("train them"), "{}", stderr(&out));
}

/// A parameter the fit puts at a bound is fitted again at its default, the others free, and
/// `calibrate` prints (and writes to its JSON) what the runs lose without the bound value.
#[test]
fn calibrate_says_what_each_parameter_at_a_bound_is_worth() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    // steps far slower than any runtime within bounds makes them: parameters end at bounds
    let mut runs = format!("{RUN_COLUMNS},expressible,reason\n");
    for (family, model, step) in [
        ("llama2-7b", "llama2-7b", 40.0),
        ("llama2-13b", "llama2-13b", 75.0),
    ] {
        for dp in [4, 8] {
            runs.push_str(&format!(
                "s,{family},{model} dp{dp},{},{model},1,1,{dp},1,{},2048,bf16,none,1,1f1b,1,\
                 false,0,{step},true,\n",
                s(&cluster),
                dp * 8,
            ));
        }
    }
    let (text, report) = calibrate_dry_run(tmp.path(), &runs, &cluster, &[]);
    let at_bound = report["fitted"]["at_bound"].as_array().unwrap();
    let held = report["held_at_default"].as_array().unwrap();
    assert!(!at_bound.is_empty(), "{text}");
    assert_eq!(held.len(), at_bound.len(), "{report}");
    for h in held {
        let name = h["parameter"].as_str().unwrap();
        assert!(at_bound.iter().any(|b| b == name), "{name}");
        // the refit keeps it at its default
        assert_eq!(h["refit"][name], h["default"], "{h}");
        assert_ne!(h["fitted"], h["default"], "{h}");
        assert!(
            text.contains(&format!("  {name} at its default")),
            "{name}: {text}"
        );
    }
}

/// A held-out set's runs beyond the range of the runs fitted on are counted and named: their
/// error is an extrapolation's.
#[test]
fn calibrate_names_held_out_runs_beyond_the_fitted_range() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let runs = data_parallel_runs(
        &cluster,
        &[
            ("fit", "llama2-7b", 4, 3.3),
            ("fit", "llama2-7b", 8, 3.3),
            ("fit", "llama2-13b", 4, 6.1),
            ("fit", "llama2-13b", 8, 6.1),
            ("far", "llama2-7b", 32, 3.4),
            ("far", "llama2-7b", 8, 3.3),
        ],
    );
    // and a run no layout expresses (tp 3 of 32 heads): counted as not predicted, its line named
    let unplannable = data_parallel_runs(&cluster, &[("far", "llama2-7b", 4, 3.3)])
        .lines()
        .nth(1)
        .unwrap()
        .replace(",llama2-7b,1,1,4,", ",llama2-7b,3,1,4,");
    let runs = format!("{runs}{unplannable}\n");
    let (text, report) = calibrate_dry_run(tmp.path(), &runs, &cluster, &["--fit-sets", "fit"]);
    assert!(
        text.contains("not predicted: 1 runs, e.g. line 8: ")
            && text.contains("are not divisible by tp = 3"),
        "{text}"
    );
    assert!(
        text.contains(
            "far (held out): 1 of 2 runs lie outside the fitted runs' range (e.g. 32 GPUs on 4 \
             nodes (runs: 4–8 GPUs on 1 node))"
        ),
        "{text}"
    );
    assert_eq!(report["sets"]["far"]["beyond_fitted_runs"], 1, "{report}");
    assert_eq!(report["sets"]["fit"]["beyond_fitted_runs"], 0, "{report}");
    // how many runs predict's widened interval holds, per set, and the spread it adds
    let sigma = report["interval_sigma_log"].as_f64().unwrap();
    assert!(sigma > 0.0 && sigma < 1.0, "{report}");
    for set in ["fit", "far"] {
        let inside = report["sets"][set]["inside_interval_percent"]
            .as_f64()
            .unwrap();
        assert!((0.0..=100.0).contains(&inside), "{report}");
    }
    assert!(
        text.contains("runs inside predict's 80 % interval"),
        "{text}"
    );
    let beyond: Vec<&serde_json::Value> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("beyond_fitted_runs").is_some())
        .collect();
    assert!(
        beyond.len() == 1 && beyond[0]["label"] == "llama2-7b dp32",
        "{report}"
    );
}

/// A calibration records its error on each set it was not fitted on, and a prediction under
/// it says so (text and JSON), as `models show` does: how far it carries to other software.
#[test]
fn a_calibration_says_how_it_did_on_the_sets_held_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let runs = data_parallel_runs(
        &cluster,
        &[
            ("fit", "llama2-7b", 4, 3.3),
            ("fit", "llama2-13b", 4, 6.1),
            ("other", "llama2-7b", 8, 4.4),
        ],
    );
    let csv = tmp.path().join("runs.csv");
    fs::write(&csv, runs).unwrap();
    let out = stepcast(&[
        "calibrate",
        s(&csv),
        "--cluster",
        s(&cluster),
        "--fit-sets",
        "fit",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written = fs::read_to_string(models.join("calibration.yaml")).unwrap();
    assert!(
        written.contains("held_out:\n    other:\n      runs: 1"),
        "{written}"
    );
    let predict = |extra: &[&str]| {
        let mut args = vec!["predict", "--cluster", s(&cluster), "--model", "llama2-7b"];
        args.extend("--tp 1 --dp 8 --micro-batch 1 --global-batch 64 --seq-len 2048".split(' '));
        args.extend_from_slice(extra);
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let text = predict(&[]);
    assert!(
        text.contains("on the runs of sets it was not fitted on: other ")
            && text.contains(" % (1 run) mean |error|")
            && text.contains("calibrate YOUR_RUNS.csv --check"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&predict(&["--json"])).unwrap();
    let other = &json["calibration_held_out"]["other"];
    assert_eq!(other["runs"], 1, "{json}");
    assert!(other["mean_abs_percent"].as_f64().unwrap() >= 0.0, "{json}");
    // the raw physics carries no calibration's record
    let raw = predict(&["--no-calibration"]);
    assert!(!raw.contains("not fitted on"), "{raw}");
    let out = stepcast(&["models", "show", s(&models)]);
    assert!(
        stdout(&out).contains("dgx-a100 on the runs of sets it was not fitted on: other "),
        "{}",
        stdout(&out)
    );
}

/// The HTML report says what its interval covers: the calibration's error on its runs, the raw
/// physics' under `--no-calibration`, the operator models alone under the paper's rules.
#[test]
fn the_report_says_what_the_interval_covers() {
    let tmp = tempfile::tempdir().unwrap();
    let html = tmp.path().join("p.html");
    let report = |extra: &[&str]| {
        let layout = "--model llama2-13b --tp 2 --dp 4 --micro-batch 1 --micro-batches 8";
        let mut args = vec!["predict", "--cluster", "dgx-h100", "--html", s(&html)];
        args.extend(layout.split(' '));
        args.extend_from_slice(extra);
        let out = stepcast(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        fs::read_to_string(&html).unwrap()
    };
    let calibrated = report(&[]);
    assert!(
        calibrated.contains(
            "the calibrated runtime's cross-validated error on the runs it was fitted on"
        ),
        "{calibrated}"
    );
    // the breakdown names the host's share (the calibrated per-step host work) beside the rest
    let host: f64 = calibrated
        .split(", host-bound ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no host-bound share: {calibrated}"));
    assert!(host > 0.0, "{calibrated}");
    // dgx-h100's shipped calibration held sets out: the report says how far it carried
    assert!(
        calibrated.contains("It does not cover other software: on the runs of sets it was not"),
        "{calibrated}"
    );
    assert!(report(&["--no-calibration"]).contains("the raw physics' error on the runs"));
    assert!(report(&["--rules", "paper"]).contains("the operator models' errors only"));
    // a step of very many pipeline passes moves each model along its critical path
    let html_of = |args: &str| {
        let mut all = vec!["predict", "--html", s(&html)];
        all.extend(args.split(' '));
        let out = stepcast(&all);
        assert!(out.status.success(), "{}", stderr(&out));
        fs::read_to_string(&html).unwrap()
    };
    let long = html_of(
        "--cluster dgx-h100 --model llama2-7b --tp 1 --pp 16 --dp 1 --micro-batch 1 \
         --micro-batches 8192",
    );
    assert!(long.contains("along the step's critical path"), "{long}");
    // beyond the calibration's runs: the extrapolation band, the warnings, and the calls
    // outside the training data listed to 20
    let far = html_of(
        "--cluster dgx-a100 --model llama3-405b --tp 8 --pp 8 --dp 2 --micro-batch 1 \
         --global-batch 64 --seq-len 131072 --recompute full",
    );
    for want in [
        "the step lies outside the runs its calibration was fitted on",
        "<h2>Warnings</h2><ul><li>",
        "more (<code>predict --json</code> lists them all)</li>",
    ] {
        assert!(far.contains(want), "{want}: {far}");
    }
    let listed = far
        .split("<h2>Outside the training data")
        .nth(1)
        .unwrap()
        .matches("<li>")
        .count();
    assert_eq!(listed, 21, "20 calls and the line saying how many more");
}

/// A runs CSV of data-parallel runs on `cluster` — (set, family, dp, measured step s), a
/// GPU running eight micro-batches of one 2,048-token sequence a step.
fn data_parallel_runs(cluster: &std::path::Path, rows: &[(&str, &str, u64, f64)]) -> String {
    let mut runs = format!("{RUN_COLUMNS},expressible,reason\n");
    for (set, family, dp, step) in rows {
        runs.push_str(&format!(
            "{set},{family},{family} dp{dp},{},{family},1,1,{dp},1,{},2048,bf16,none,1,1f1b,1,\
             false,0,{step},true,\n",
            s(cluster),
            dp * 8,
        ));
    }
    runs
}

/// The runs CSV columns every calibration test fills, up to the measured step time.
const RUN_COLUMNS: &str = "set,family,label,cluster,model,tp,pp,dp,micro_batch,global_batch,\
                           seq_len,dtype,recompute,zero,schedule,vpp,sequence_parallel,\
                           tp_comm_overlap,measured_step_s";

/// `calibrate --dry-run` of the runs CSV `runs` (written into `dir`) on `cluster`, with `extra`
/// arguments: its printed report and its JSON.
fn calibrate_dry_run(
    dir: &std::path::Path,
    runs: &str,
    cluster: &std::path::Path,
    extra: &[&str],
) -> (String, serde_json::Value) {
    let csv = dir.join("runs.csv");
    fs::write(&csv, runs).unwrap();
    let json = dir.join("report.json");
    let mut args = vec![
        "calibrate",
        s(&csv),
        "--cluster",
        s(cluster),
        "--dry-run",
        "--json",
        s(&json),
    ];
    args.extend_from_slice(extra);
    let out = stepcast(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    (stdout(&out), report)
}

/// A run that reported its peak memory is compared with the memory projection in the
/// measurement's scope, and a run the projection says does not fit is counted: it ran.
#[test]
fn calibrate_holds_the_memory_projection_against_the_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let mut runs = format!("{RUN_COLUMNS},measured_memory_gib,memory_scope,expressible,reason\n");
    // 40 GiB of PyTorch's reserved memory, 60 GiB on the device, nothing reported, and 16
    // sequences of 4,096 tokens of a 13B model without recomputation: far beyond 80 GiB
    for (family, micro_batch, seq, memory) in [
        ("llama2-7b", 1, 1024, "40,allocator"),
        ("llama2-7b", 1, 2048, "60,device"),
        ("llama2-7b", 1, 512, ","),
        ("llama2-13b", 16, 4096, ","),
    ] {
        runs.push_str(&format!(
            "s,{family},{family} mb{micro_batch},{},{family},1,1,8,{micro_batch},{},{seq},bf16,\
             none,1,1f1b,1,false,0,10.0,{memory},true,\n",
            s(&cluster),
            8 * micro_batch * 4,
        ));
    }
    let (text, report) = calibrate_dry_run(tmp.path(), &runs, &cluster, &[]);
    let memory = |i: usize| &report["runs"][i]["memory"];
    let gib = |v: &serde_json::Value| v.as_f64().unwrap();
    // reserved memory holds neither the CUDA context nor NCCL's buffers: the one data-parallel
    // communicator (0.5 GiB by default) is taken off; device memory counts everything
    assert_eq!(memory(0)["scope"], "allocator");
    let taken_off = gib(&memory(0)["projected_gib"]) - gib(&memory(0)["comparable_gib"]);
    assert!((taken_off - 0.5).abs() < 1e-9, "{}", memory(0));
    assert_eq!(memory(1)["comparable_gib"], memory(1)["projected_gib"]);
    assert!(memory(2).get("measured_gib").is_none(), "{}", memory(2));
    assert_eq!(memory(3)["verdict"], "OOM");
    let set = &report["sets"]["s"];
    assert_eq!(set["projected_oom"], 1, "{set}");
    assert_eq!(set["memory"]["runs"], 2, "{set}");
    let error = |i: usize| {
        100.0 * (gib(&memory(i)["comparable_gib"]) / gib(&memory(i)["measured_gib"]) - 1.0)
    };
    let mean = (error(0).abs() + error(1).abs()) / 2.0;
    assert!(
        (gib(&set["memory"]["mean_abs_percent"]) - mean).abs() < 1e-9,
        "{set}"
    );
    assert!(
        text.contains("s: 1 of 4 projected not to fit (OOM); 2 reported a peak"),
        "{text}"
    );
}

/// A run timed without its update (`time_scope` forward_backward, as NeuSight's labels) is
/// compared with the step until the optimizer would start: the same layout predicts less
/// than as a whole step, by at least the per-step host work, raw and calibrated.
#[test]
fn calibrate_compares_a_forward_backward_time_with_the_passes_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    let mut runs = format!("{RUN_COLUMNS},time_scope,expressible,reason\n");
    for (family, scope) in [("a", "step"), ("b", "forward_backward"), ("c", "")] {
        runs.push_str(&format!(
            "s,{family},{family},{},llama2-7b,1,1,8,1,32,1024,bf16,none,1,1f1b,1,false,0,1.0,\
             {scope},true,\n",
            s(&cluster),
        ));
    }
    let (_text, report) = calibrate_dry_run(tmp.path(), &runs, &cluster, &[]);
    let run = |i: usize, key: &str| report["runs"][i][key].as_f64().unwrap();
    // 5 ms of per-step host work by default, besides the optimizer step
    assert!(run(1, "raw_s") < run(0, "raw_s") - 0.005, "{report}");
    assert!(run(1, "fitted_s") < run(0, "fitted_s"), "{report}");
    assert_eq!(run(0, "raw_s"), run(2, "raw_s"));
    // the report says which run was timed so
    let scope = |i: usize| report["runs"][i].get("time_scope").cloned();
    assert_eq!(scope(1), Some(serde_json::json!("forward_backward")));
    assert_eq!((scope(0), scope(2)), (None, None));
    // and its memory without the optimizer's states, which it never made: 12 bytes a
    // parameter over 8 data-parallel ranks, ≈ 9.4 GiB of Llama 2 7B
    let memory = |i: usize| {
        report["runs"][i]["memory"]["projected_gib"]
            .as_f64()
            .unwrap()
    };
    let states = memory(0) - memory(1);
    assert!((8.5..10.5).contains(&states), "{states} {report}");
    assert_eq!(memory(0), memory(2));
}

/// The settings that change how a run holds its memory are said in the layout header, and
/// the memory they cost follows: NeMo's fp8 recipe (weights in fp8, gradients reduced in
/// bf16) holds less than the same layout with Transformer Engine's defaults.
/// Llama 3 8B at tp 2 × dp 4 on the DGX H100 under `base` and `extra` flags: the text
/// prediction and the same as JSON.
fn predict_text_and_json(base: &str, extra: &str) -> (String, serde_json::Value) {
    let mut args: Vec<&str> = "predict --cluster dgx-h100 --model llama3-8b --tp 2 --dp 4 \
                               --micro-batch 1 --global-batch 32 --sequence-parallel"
        .split_whitespace()
        .chain(base.split_whitespace())
        .chain(extra.split_whitespace())
        .collect();
    let text = stepcast(&args);
    assert!(text.status.success(), "{}", stderr(&text));
    args.push("--json");
    (stdout(&text), json_of(&stepcast(&args)))
}

#[test]
fn the_header_says_how_fp8_gradients_and_the_loss_run() {
    let predict = |extra: &str| {
        let (text, json) = predict_text_and_json("--dtype fp8", extra);
        (
            text,
            json["memory"]["ranks"][0]["total_gib"].as_f64().unwrap(),
        )
    };
    let (te, te_gib) = predict("");
    assert!(te.contains("fp8, recompute none"), "{te}");
    let (nemo, nemo_gib) = predict("--fp8-param-gather --grad-reduce-dtype bf16");
    assert!(
        nemo.contains("fp8 (weights in fp8), gradients reduced in bf16, recompute"),
        "{nemo}"
    );
    assert!(nemo_gib < te_gib - 1.0, "{nemo_gib} {te_gib}");
    let (titan, _) = predict("--fp8-library torchao --cross-entropy pytorch");
    assert!(
        titan.contains("fp8 (torchao), PyTorch's cross-entropy, recompute"),
        "{titan}"
    );
    let (gathered, _) = predict("--fp8-library torchao --fp8-param-gather");
    assert!(
        gathered.contains("fp8 (torchao, weights gathered in fp8), recompute"),
        "{gathered}"
    );
}

/// `--cross-entropy fused` (Transformer Engine's kernel over the 16-bit logits) is said in the
/// header, costs the loss at its roofline instead of the unfused model's time, so the step is
/// shorter, and keeps 2 bytes a logit instead of the fp32 logits, so the head's rank needs less.
#[test]
fn a_fused_cross_entropy_is_said_costed_at_its_roofline_and_holds_less() {
    let predict = |extra: &str| {
        let (text, json) = predict_text_and_json("", extra);
        let loss: Vec<String> = json["stages"][0]["fwd"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["label"] == "cross-entropy")
            .map(|c| c["estimate"]["source"].as_str().unwrap().to_string())
            .collect();
        (
            text,
            json["step_time_s"].as_f64().unwrap(),
            json["memory"]["ranks"][0]["total_gib"].as_f64().unwrap(),
            loss,
        )
    };
    let (_, unfused_s, unfused_gib, unfused_loss) = predict("");
    let (text, fused_s, fused_gib, fused_loss) = predict("--cross-entropy fused");
    assert!(
        text.contains("bf16, fused cross-entropy, recompute"),
        "{text}"
    );
    assert_eq!(fused_loss, ["roofline"], "{unfused_loss:?}");
    assert_ne!(unfused_loss, ["roofline"]);
    assert!(fused_s < unfused_s, "{fused_s} {unfused_s}");
    assert!(fused_gib < unfused_gib, "{fused_gib} {unfused_gib}");
}

/// GPT-2's vocabulary left unpadded (`vocab_divisible_by: 1`) puts the head on GEMMs whose
/// rows are 50,257 half-precision words long, not a multiple of 16 bytes: `--operators` says
/// so on the head's calls, the prediction warns, and the step is slower than with Megatron's
/// padding (50,304);
/// a zero divisor is refused with the field named.
#[test]
fn an_unpadded_vocabulary_runs_the_head_on_unaligned_gemms() {
    let tmp = tempfile::tempdir().unwrap();
    let arch = |name: &str, extra: &str| {
        let path = tmp.path().join(format!("{name}.yaml"));
        fs::write(
            &path,
            format!(
                "name: {name}\nlayers: 4\nhidden: 1024\nheads: 16\nvocab: 50257\nnorm: layernorm\n\
                 activation: gelu\nposition: learned\ntied_embeddings: true\n{extra}"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let padded = arch("padded", "");
    let unpadded = arch("unpadded", "vocab_divisible_by: 1\n");
    let cluster = repo("hardware-profiles/dgx-a100.yaml");
    // what `predict` prints (warnings included) for the model, with `extra` flags
    let run = |model: &str, extra: &[&str]| {
        let layout = [
            "--tp",
            "1",
            "--dp",
            "1",
            "--micro-batch",
            "2",
            "--global-batch",
            "2",
            "--seq-len",
            "1024",
        ];
        let args = [
            &["predict", "--model", model, "--cluster", &cluster][..],
            &layout,
            extra,
        ];
        let out = stepcast(&args.concat());
        assert!(out.status.success(), "{}", stderr(&out));
        (stdout(&out), stderr(&out))
    };
    let step = |model: &str| -> f64 {
        let v: serde_json::Value = serde_json::from_str(&run(model, &["--json"]).0).unwrap();
        v["step_time_s"].as_f64().unwrap()
    };
    let unaligned = |model: &str| -> Vec<String> {
        run(model, &["--operators", "--wide"])
            .0
            .lines()
            .filter(|l| l.contains("2-byte aligned"))
            .map(|l| l.split('┆').nth(1).unwrap_or_default().trim().to_string())
            .collect()
    };
    assert_eq!(unaligned(&unpadded), ["lm head", "lm head"]);
    assert!(unaligned(&padded).is_empty());
    // and the prediction warns, naming the shapes and the fix
    let warned = |model: &str| {
        let (out, err) = run(model, &[]);
        (out + &err)
            .lines()
            .any(|l| l.contains("not a multiple of 16 bytes") && l.contains("n=50257"))
    };
    assert!(warned(&unpadded) && !warned(&padded));
    assert!(step(&unpadded) > step(&padded) * 1.01);
    let zero = arch("zero", "vocab_divisible_by: 0\n");
    assert_user_error(
        &stepcast(&[
            "predict",
            "--model",
            &zero,
            "--cluster",
            &cluster,
            "--micro-batch",
            "1",
            "--global-batch",
            "1",
        ]),
        &["zero.yaml", "vocab_divisible_by"],
    );
}

/// `--cluster`'s help names every built-in cluster (every file of `hardware-profiles/`), so a
/// new one cannot be left out of it.
#[test]
fn the_cluster_flag_names_every_built_in_cluster() {
    let mut names: Vec<String> = fs::read_dir(repo("hardware-profiles"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".yaml").map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for command in ["predict", "search"] {
        let help = stdout(&stepcast(&[command, "--help"]));
        let line = help
            .split("--cluster <CLUSTER>\n")
            .nth(1)
            .unwrap_or_default()
            .split("\n\n")
            .next()
            .unwrap_or_default();
        // whole names ("dgx-a100" is a prefix of "dgx-a100-40gb")
        let listed: std::collections::BTreeSet<&str> = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .map(|w| w.trim_end_matches(['.', ')']))
            .collect();
        for name in &names {
            assert!(
                listed.contains(name.as_str()),
                "{command}: {name} not in {line}"
            );
        }
    }
}

/// CUDA graphs (`--cuda-graphs`, or `cuda_graphs:` in a job file) replay a captured part of
/// each layer with one launch: a host-bound step (a small model, short sequences, tp 8) gets
/// faster with the device's work unchanged; the layout line says so; an eager host-bound step
/// says what graphs would save, a device-bound one does not; the job file's scopes are
/// overridden by the flag; a scope the model cannot take is refused with the fix.
#[test]
fn cuda_graphs_take_the_host_off_a_host_bound_step() {
    let job: Vec<&str> = "--cluster dgx-h100 --model llama3-8b --tp 8 --micro-batch 1 \
                          --global-batch 8 --seq-len 256 --sequence-parallel"
        .split_whitespace()
        .collect();
    let predict = |extra: &[&str]| {
        json_of(&stepcast(
            &[&["predict"][..], &job, extra, &["--json"]].concat(),
        ))
    };
    let step = |p: &serde_json::Value| p["step_time_s"].as_f64().unwrap();
    let host = |p: &serde_json::Value| p["breakdown_s"]["host"].as_f64().unwrap();
    let eager = predict(&[]);
    let graphed = predict(&["--cuda-graphs", "attn,mlp"]);
    assert!(eager["layout"].get("cuda_graphs").is_none());
    assert_eq!(
        graphed["layout"]["cuda_graphs"],
        serde_json::json!(["attn", "mlp"])
    );
    assert!(
        host(&graphed) < 0.5 * host(&eager),
        "{} {}",
        host(&graphed),
        host(&eager)
    );
    assert!(step(&graphed) < step(&eager));
    // the device's work is the same: compute unchanged
    assert_eq!(
        eager["breakdown_s"]["compute"].as_f64(),
        graphed["breakdown_s"]["compute"].as_f64()
    );
    let text = stdout(&stepcast(
        &[&["predict"][..], &job, &["--cuda-graphs", "layer"]].concat(),
    ));
    assert!(text.contains("CUDA graphs (layer)"), "{text}");
    // no calibration run replayed graphs: the prediction says it lies outside them
    assert!(
        text.contains("CUDA graphs (runs: every kernel issued eagerly)"),
        "{text}"
    );
    // the eager prediction says what graphs would save, as `--cuda-graphs layer` costs it
    let advice = &eager["cuda_graphs_advice"];
    assert_eq!(advice["scopes"], serde_json::json!(["layer"]));
    let layer = predict(&["--cuda-graphs", "layer"]);
    assert_eq!(
        advice["step_time_s"].as_f64(),
        layer["step_time_s"].as_f64()
    );
    assert!(
        (advice["saved_s"].as_f64().unwrap() - (step(&eager) - step(&layer))).abs() < 1e-9,
        "{advice}"
    );
    assert!(
        graphed.get("cuda_graphs_advice").is_none(),
        "only for eager steps"
    );
    let composer = predict(&["--framework", "composer"]);
    assert!(
        composer.get("cuda_graphs_advice").is_none(),
        "Composer has no graphs to turn on"
    );
    let text = stdout(&stepcast(&[&["predict"][..], &job].concat()));
    assert!(
        text.contains("cuda graphs") && text.contains("(--cuda-graphs layer) would take it from"),
        "{text}"
    );
    // a device-bound step (long sequences, 8 GPUs of data parallelism) gets no advice
    let long: Vec<&str> = "predict --cluster dgx-h100 --model llama3-8b --dp 8 --micro-batch 1 \
                           --global-batch 32 --json"
        .split_whitespace()
        .collect();
    let long = json_of(&stepcast(&long));
    assert!(
        long.get("cuda_graphs_advice").is_none(),
        "{}",
        long["breakdown_s"]
    );
    // a job file's scopes, overridden by the flag
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("job.yaml");
    fs::write(
        &file,
        "cluster: dgx-h100\nmodel: llama3-8b\nparallel:\n  tp: 8\n  micro_batch: 1\n  \
         global_batch: 8\n  seq_len: 256\n  sequence_parallel: true\n  cuda_graphs: [attn, mlp]\n",
    )
    .unwrap();
    let from_job = json_of(&stepcast(&["predict", "--job", s(&file), "--json"]));
    assert_eq!(step(&from_job), step(&graphed));
    let off = json_of(&stepcast(&[
        "predict",
        "--job",
        s(&file),
        "--cuda-graphs",
        "none",
        "--json",
    ]));
    assert_eq!(step(&off), step(&eager));
    assert_user_error(
        &stepcast(&[&["predict"][..], &job, &["--cuda-graphs", "moe_router"]].concat()),
        &["--cuda-graphs", "experts", "drop it"],
    );
}

/// A host-bound mixture of experts is advised the scopes Megatron-Core can capture around its
/// token dispatch — attention, the router and the dispatch's preprocessing, and the dense MLP
/// only where some layer has one — each advice costed as that `--cuda-graphs` list is.
#[test]
fn cuda_graph_advice_for_a_mixture_names_the_mlp_only_where_a_layer_is_dense() {
    let tmp = tempfile::tempdir().unwrap();
    for (dense_layers, scopes) in [
        (
            0,
            serde_json::json!(["attn", "moe_router", "moe_preprocess"]),
        ),
        (
            1,
            serde_json::json!(["attn", "mlp", "moe_router", "moe_preprocess"]),
        ),
    ] {
        let arch = tmp.path().join(format!("moe-{dense_layers}.yaml"));
        fs::write(
            &arch,
            format!(
                "name: tiny-moe\nlayers: 4\nhidden: 1024\nheads: 8\nvocab: 32000\n\
                 norm: rmsnorm\nactivation: swiglu\nffn_hidden: 2816\n\
                 moe: {{experts: 8, top_k: 2, expert_ffn: 512, dense_layers: {dense_layers}}}\n"
            ),
        )
        .unwrap();
        let predict = |extra: &[&str]| {
            let job = [
                "predict",
                "--cluster",
                "dgx-h100",
                "--model",
                s(&arch),
                "--tp",
                "8",
                "--micro-batch",
                "1",
                "--global-batch",
                "8",
                "--seq-len",
                "256",
                "--sequence-parallel",
                "--json",
            ];
            json_of(&stepcast(&[&job[..], extra].concat()))
        };
        let eager = predict(&[]);
        let advice = &eager["cuda_graphs_advice"];
        assert_eq!(advice["scopes"], scopes, "dense layers {dense_layers}");
        let listed: Vec<&str> = scopes
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let graphed = predict(&["--cuda-graphs", &listed.join(",")]);
        assert_eq!(
            advice["step_time_s"].as_f64(),
            graphed["step_time_s"].as_f64()
        );
    }
}

/// Runs whose FlashAttention-2 calls took 1/0.6 of the time costed and everything else as
/// costed, at sequences where the attention is a small and a large share of the step: the
/// calibration finds the attention's own efficiency (not one in-situ efficiency for every
/// kernel), writes it, and `predict` says it under the runtime line.
#[test]
fn calibrate_finds_a_slow_flash_attention_2_apart_from_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ds, models) = trained(tmp.path());
    let cluster = dgx_a100_with_models(tmp.path(), &models);
    // 65,536 tokens a GPU each step, one sequence a micro-batch: 65,536 / seq micro-batches
    let micro_batches = |seq: u64| 65536 / seq;
    let layout = |model: &str, seq: u64| -> Vec<String> {
        [
            "--model",
            model,
            "--tp",
            "1",
            "--pp",
            "1",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--seq-len",
            &seq.to_string(),
            "--global-batch",
            &(8 * micro_batches(seq)).to_string(),
            "--attention-kernel",
            "flash-attention-2",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let mut runs = String::from(
        "set,family,label,cluster,model,framework,tp,pp,dp,micro_batch,global_batch,seq_len,\
         attention_kernel,measured_step_s\n",
    );
    for model in ["llama2-7b", "llama2-13b"] {
        for seq in [2048u64, 8192, 16384] {
            let mut args = vec![
                "predict",
                "--cluster",
                s(&cluster),
                "--no-calibration",
                "--json",
            ];
            let l = layout(model, seq);
            args.extend(l.iter().map(|a| a.as_str()));
            let p = json_of(&stepcast(&args));
            let stage = &p["stages"][0];
            let attention_us: f64 = ["fwd", "bwd"]
                .iter()
                .flat_map(|k| stage[k].as_array().unwrap())
                .filter(|c| c["query"].as_str().unwrap().starts_with("flash_attention"))
                .map(|c| c["count"].as_f64().unwrap() * c["estimate"]["time_us"].as_f64().unwrap())
                .sum();
            assert!(attention_us > 0.0, "{p}");
            let measured = p["step_time_s"].as_f64().unwrap()
                + micro_batches(seq) as f64 * attention_us * (1.0 / 0.6 - 1.0) / 1e6;
            runs.push_str(&format!(
                "s,{model},{model} s{seq},{},{model},pytorch,1,1,8,1,{},{seq},flash-attention-2,\
                 {measured}\n",
                s(&cluster),
                8 * micro_batches(seq)
            ));
        }
    }
    let csv = tmp.path().join("runs.csv");
    fs::write(&csv, runs).unwrap();
    // the report gives each run's FlashAttention-2 seconds within its raw step
    let report = tmp.path().join("report.json");
    let out = stepcast(&[
        "calibrate",
        s(&csv),
        "--cluster",
        s(&cluster),
        "--dry-run",
        "--json",
        s(&report),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&report).unwrap()).unwrap();
    for r in json["runs"].as_array().unwrap() {
        let (attention, raw) = (
            r["raw_flash_attention_2_s"].as_f64().unwrap(),
            r["raw_s"].as_f64().unwrap(),
        );
        assert!(attention > 0.0 && attention < raw, "{r}");
    }
    let out = stepcast(&["calibrate", s(&csv), "--cluster", s(&cluster)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = fs::read_to_string(models.join("calibration.yaml")).unwrap();
    let value = |name: &str| -> f64 {
        let at = text.find(&format!("{name}: ")).unwrap() + name.len() + 2;
        text[at..].lines().next().unwrap().parse().unwrap()
    };
    let fa2 = value("flash_attention_2_efficiency");
    assert!((0.5..0.7).contains(&fa2), "{fa2}\n{text}");
    // the rest of each step was as costed: in-situ efficiency stays near its default
    assert!(value("in_situ_efficiency") > 0.85, "{text}");
    let mut args = vec!["predict", "--cluster", s(&cluster)];
    let l = layout("llama2-7b", 8192);
    args.extend(l.iter().map(|a| a.as_str()));
    let out = stepcast(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("FlashAttention-2 at {fa2:.2} of its costed speed")),
        "{}",
        stdout(&out)
    );
    // fitted on FA2 runs, so an FA2 step is no extrapolation of that; the shipped DGX H100 fit
    // (runs with cuDNN attention) warns that it learned nothing of FA2's own speed
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains("FlashAttention-2 (runs: none"), "{all}");
    let mut args = vec!["predict", "--cluster", "dgx-h100"];
    let l = layout("llama3-8b", 8192);
    args.extend(l.iter().map(|a| a.as_str()));
    let out = stepcast(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        all.contains(
            "FlashAttention-2 (runs: none, so the runtime takes its calls at their costed speed)"
        ),
        "{all}"
    );
}

#[test]
fn train_can_keep_some_operator_kinds_and_says_so_in_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    write_dataset(&ds);
    let models = tmp.path().join("models");
    let out = stepcast(&[
        "train",
        s(&ds),
        "--out",
        s(&models),
        "--quiet",
        "--operators",
        "gemm,rmsnorm",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let read = |dir: &std::path::Path| read_json(&dir.join("manifest.json"));
    let manifest = read(&models);
    assert_eq!(
        manifest["operators"],
        serde_json::json!(["gemm", "rmsnorm"])
    );
    let ops: std::collections::BTreeSet<&str> = manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"]["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["gemm", "rmsnorm"].into_iter().collect());
    // all kinds: no selection recorded
    let all = tmp.path().join("all");
    assert!(stepcast(&["train", s(&ds), "--out", s(&all), "--quiet"])
        .status
        .success());
    assert!(read(&all).get("operators").is_none());
    // a kind that is not one, or that the dataset did not measure: one message, exit 2
    for (bad, says) in [
        ("gemms", "not an operator kind"),
        ("rope", "has no rope rows"),
    ] {
        let out = stepcast(&["train", s(&ds), "--out", s(&all), "--operators", bad]);
        assert_user_error(&out, &[bad, says]);
    }
}

#[test]
fn datasets_compare_reports_the_ratio_at_the_common_points() {
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old");
    let new = tmp.path().join("new");
    write_dataset(&old);
    write_dataset(&new);
    // the new collection's GEMMs 10 % slower; its other kinds left out
    let gemm = fs::read_to_string(old.join("gemm.csv")).unwrap();
    let mut lines = gemm.lines();
    let header = lines.next().unwrap();
    let col = header.split(',').position(|c| c == "time_us").unwrap();
    let mut slower = format!("{header}\n");
    for line in lines {
        let mut cells: Vec<String> = line.split(',').map(String::from).collect();
        let t: f64 = cells[col].parse().unwrap();
        cells[col] = format!("{:.6}", t * 1.1);
        slower.push_str(&cells.join(","));
        slower.push('\n');
    }
    for entry in fs::read_dir(&new).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "csv") {
            fs::remove_file(path).unwrap();
        }
    }
    fs::write(new.join("gemm.csv"), slower).unwrap();
    let out = stepcast(&["datasets", "compare", s(&old), s(&new), "--json"]);
    let report = json_of(&out);
    let kinds = report["by_kind"].as_array().unwrap();
    assert!(!kinds.is_empty());
    for k in kinds {
        assert!(k["label"].as_str().unwrap().starts_with("gemm"), "{k}");
        let median = k["median"].as_f64().unwrap();
        assert!((median - 1.1).abs() < 1e-3, "{k}");
    }
    assert!(report["only_old"].as_u64().unwrap() > 0, "the other kinds");
    assert_eq!(report["only_new"], 0);
    let text = stdout(&stepcast(&["datasets", "compare", s(&old), s(&new)]));
    assert!(
        text.contains("points in both") && text.contains("operator, old time"),
        "{text}"
    );
    // nothing in common: one message, exit 2
    let other = tmp.path().join("other");
    fs::create_dir_all(&other).unwrap();
    fs::copy(old.join("meta.yaml"), other.join("meta.yaml")).unwrap();
    fs::write(
        other.join("gemm.csv"),
        format!("{header}\ngemm,qkv,fp16,fwd,7,7,7,1,1,7,7,1,1.000,1,1.000\n"),
    )
    .unwrap();
    let out = stepcast(&["datasets", "compare", s(&old), s(&other)]);
    assert_user_error(&out, &["share no measured point"]);
}

/// The shipped DGX H100 calibration gives its BF16 and FP8 runs each their own spread (its
/// file's `cross_validated_by_dtype`), and a prediction's interval takes its type's: BF16 runs
/// were closer than FP8 ones, so a BF16 step's interval is the narrower.
#[test]
fn a_prediction_takes_the_spread_of_its_training_type() {
    let sigma = |dtype: &str| {
        let mut args: Vec<&str> = "predict --cluster dgx-h100 --model llama3-8b --tp 2 --dp 4 \
             --global-batch 32 --sequence-parallel --json --dtype"
            .split_whitespace()
            .collect();
        args.push(dtype);
        let p = json_of(&stepcast(&args));
        p["interval_runtime_sigma_log"].as_f64().unwrap()
    };
    let shipped = std::fs::read_to_string(repo("models/h100-sxm/calibration.yaml")).unwrap();
    let mean_of = |dtype: &str| -> f64 {
        // the dgx-h100 entry's mean |error| of that type (the first entry of the file)
        let at = shipped.find(&format!("    {dtype}:\n")).unwrap();
        let rest = &shipped[at..];
        let m = rest.find("mean_abs_percent: ").unwrap() + "mean_abs_percent: ".len();
        rest[m..m + rest[m..].find('\n').unwrap()].parse().unwrap()
    };
    let spread = |mean: f64| (std::f64::consts::PI / 2.0).sqrt() * (mean / 100.0).ln_1p();
    let (bf16, fp8) = (sigma("bf16"), sigma("fp8"));
    assert!((bf16 - spread(mean_of("bf16"))).abs() < 1e-9, "{bf16}");
    assert!((fp8 - spread(mean_of("fp8"))).abs() < 1e-9, "{fp8}");
    assert!(bf16 < fp8);
    // and `models show` says which types have their own
    let shown = stdout(&stepcast(&["models", "show", &repo("models/h100-sxm")]));
    let line = format!("fp8 {:.1} % of ", mean_of("fp8"));
    assert!(
        shown.contains("grouped cross-validation per training type") && shown.contains(&line),
        "{shown}"
    );
}

/// `predict --steps` sizes the whole run: training time is steps × the step, `--tokens` of as
/// many tokens is the same run, a checkpoint written twice as fast takes half the time, and a
/// checkpoint interval other than the optimal one says what the optimal one would give.
#[test]
fn predict_sizes_a_training_run_by_steps_or_tokens() {
    let run = |extra: &[&str]| {
        let args = [
            "predict",
            "--cluster",
            "dgx-h100",
            "--model",
            "llama2-7b",
            "--dp",
            "8",
            "--global-batch",
            "64",
        ];
        let out = stepcast(&[&args[..], extra].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let json = |extra: &[&str]| -> serde_json::Value {
        serde_json::from_str(&run(&[extra, &["--json"]].concat())).unwrap()
    };
    let by_steps = json(&["--steps", "100000"]);
    let step_s = by_steps["step_time_s"].as_f64().unwrap();
    let outcome = &by_steps["run"]["outcome"];
    let training_s = outcome["training_s"].as_f64().unwrap();
    assert!(
        (training_s / (1e5 * step_s) - 1.0).abs() < 1e-12,
        "{outcome}"
    );
    assert!(outcome["end_to_end_s"].as_f64().unwrap() > training_s);
    // 64 sequences of 4,096 tokens a step
    let by_tokens = json(&["--tokens", "26214400000"]);
    assert_eq!(by_tokens["run"]["outcome"], *outcome);
    let save = |gb: &str| {
        json(&[
            "--steps",
            "100000",
            "--checkpoint-write-gb-per-s-per-node",
            gb,
        ])["run"]["checkpoint_save_s"]
            .as_f64()
            .unwrap()
    };
    assert!((save("2") / save("4") - 2.0).abs() < 1e-9);
    let optimal = outcome["optimal_interval"].as_u64().unwrap();
    assert_eq!(outcome["checkpoint_interval"].as_u64(), Some(optimal));
    let text = run(&["--steps", "100000"]);
    assert!(
        text.contains(&format!(
            "100000 steps, {:.2} days of training",
            training_s / 86_400.0
        )) && text.contains(&format!("every {optimal} steps (optimal)")),
        "{text}"
    );
    let often = json(&["--steps", "100000", "--checkpoint-interval", "50"]);
    let often = &often["run"]["outcome"];
    assert!(often["ettr"].as_f64() < outcome["ettr"].as_f64(), "{often}");
    let text = run(&["--steps", "100000", "--checkpoint-interval", "50"]);
    let said = format!(
        "every 50 steps (optimal: {optimal}, ETTR {:.2} %)",
        100.0 * outcome["optimal_ettr"].as_f64().unwrap()
    );
    assert!(text.contains(&said), "{said}: {text}");
    // a shorter run reads in hours
    assert!(run(&["--steps", "5000"]).contains(" h of training"));
}

/// `datasets show` prints the dataset's name, GPU, source and fingerprint, and per operator,
/// phase and type the rows measured and the points skipped.
#[test]
fn datasets_show_counts_rows_and_skipped_points_per_group() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    write_dataset(&ds);
    std::fs::write(
        ds.join("rmsnorm.csv"),
        "op,dtype,phase,batch,seq,width,time_us,status,note\n\
         rmsnorm,fp16,fwd,1,512,1024,5.0,ok,\n\
         rmsnorm,fp16,fwd,2,512,1024,6.0,ok,\n\
         rmsnorm,fp16,fwd,4,512,1024,,skipped,out of memory\n\
         rmsnorm,fp16,bwd,1,512,1024,7.5,ok,\n",
    )
    .unwrap();
    let out = stepcast(&["datasets", "show", s(&ds)]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let json = json_of(&stepcast(&["datasets", "show", s(&ds), "--json"]));
    let fingerprint = json["provenance"]["inputs"][0]["digest"].as_str().unwrap();
    assert!(
        text.contains(&format!("fingerprint: {fingerprint}")),
        "{text}"
    );
    assert!(
        text.lines().next().unwrap().contains(" — collected "),
        "{text}"
    );
    assert!(text.contains("source: "), "{text}");
    let row = |op: &str, phase: &str| -> Vec<String> {
        text.lines()
            .map(|l| {
                l.split(|c: char| "│┆|".contains(c) || c.is_whitespace())
                    .filter(|w| !w.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .find(|w| w.len() == 5 && w[0] == op && w[1] == phase)
            .unwrap_or_else(|| panic!("no {op} {phase} row: {text}"))
    };
    assert_eq!(row("rmsnorm", "fwd")[2..], ["fp16", "2", "1"]);
    assert_eq!(row("rmsnorm", "bwd")[2..], ["fp16", "1", "0"]);
    assert_eq!(row("all_reduce", "none")[2..], ["fp16", "90", "0"]);
}

/// A Qwen mixture with dense layers between its expert ones (`decoder_sparse_step` 2: experts
/// in the odd layers) predicts, holds fewer experts, and exports its layers as Megatron marks
/// them; dense layers in no pattern stepcast costs are refused, naming the file.
#[test]
fn a_mixture_with_interleaved_dense_layers_from_its_config() {
    let tmp = tempfile::tempdir().unwrap();
    let config = |step: u64, dense: &str| {
        let path = tmp
            .path()
            .join(format!("config-{step}-{}.json", dense.len()));
        fs::write(
            &path,
            format!(
                r#"{{"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,
                    "moe_intermediate_size":768,"num_attention_heads":32,"num_key_value_heads":4,
                    "head_dim":128,"num_hidden_layers":8,"vocab_size":151936,"num_experts":128,
                    "num_experts_per_tok":8,"decoder_sparse_step":{step},"mlp_only_layers":{dense},
                    "hidden_act":"silu","tie_word_embeddings":false}}"#
            ),
        )
        .unwrap();
        path
    };
    let layout = [
        "--cluster",
        "dgx-h100",
        "--tp",
        "2",
        "--sequence-parallel",
        "--pp",
        "2",
        "--ep",
        "4",
        "--dp",
        "4",
        "--micro-batch",
        "1",
        "--global-batch",
        "32",
    ];
    let run = |cmd: &[&str], model: &std::path::Path| {
        let args: Vec<&str> = cmd
            .iter()
            .chain(&["--model", s(model)])
            .chain(&layout)
            .copied()
            .collect();
        stepcast(&args)
    };
    let (every, odd) = (config(1, "[]"), config(2, "[]"));
    let weights = |model: &std::path::Path| {
        let out = run(&["predict", "--json"], model);
        assert!(out.status.success(), "{}", stderr(&out));
        json_of(&out)["memory"]["ranks"][0]["weights_gib"]
            .as_f64()
            .unwrap()
    };
    // half the layers hold a dense MLP of 6,144 instead of 128 experts of 768
    assert!(weights(&odd) < weights(&every));
    let m = stdout(&run(&["export", "--format", "megatron"], &odd));
    assert!(
        m.contains("--moe-layer-freq \"([0,1,0,1,0,1,0,1])\""),
        "{m}"
    );
    let uneven = config(1, "[1]");
    assert_user_error(
        &run(&["predict"], &uneven),
        &[
            s(&uneven),
            "mlp_only_layers = {1}",
            "describe the model in YAML",
        ],
    );
}

/// Llama 4's language model from its text_config: chunked attention on three layers of four
/// once the sequence is longer than a chunk (global below), experts in every other layer, and
/// a Megatron export refused for the chunks it cannot say.
#[test]
fn a_llama_4_config_costs_its_chunks_and_interleaved_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    fs::write(
        &config,
        r#"{"model_type":"llama4_text","hidden_size":1024,"intermediate_size":1024,
            "intermediate_size_mlp":4096,"num_attention_heads":8,"num_key_value_heads":2,
            "head_dim":128,"num_hidden_layers":8,"vocab_size":32000,"num_local_experts":8,
            "num_experts_per_tok":1,"interleave_moe_layer_step":2,"attention_chunk_size":2048,
            "no_rope_layers":[],"hidden_act":"silu","tie_word_embeddings":false}"#,
    )
    .unwrap();
    let run = |cmd: &str, seq: &str, extra: &[&str]| {
        let mut args = vec![cmd, "--model", s(&config), "--cluster", "dgx-h100"];
        args.extend([
            "--ep",
            "8",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--global-batch",
            "8",
        ]);
        args.extend(["--seq-len", seq]);
        args.extend(extra);
        stepcast(&args)
    };
    let attention = |seq: &str| -> Vec<String> {
        let out = run("predict", seq, &["--operators", "--wide"]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
            .lines()
            .filter(|l| l.contains("attention") && l.contains("flash_attention fwd"))
            .map(|l| l.split('┆').nth(1).unwrap_or_default().trim().to_string())
            .collect()
    };
    let long = attention("8192");
    assert!(
        long.iter().any(|l| l.contains("chunked attention")),
        "{long:?}"
    );
    let short = attention("2048");
    assert!(!short.iter().any(|l| l.contains("chunked")), "{short:?}");
    assert_user_error(
        &run("export", "8192", &["--format", "megatron"]),
        &["chunked attention", "slides"],
    );
}

/// `predict` says which frameworks run its layout as costed — exactly those whose `export`
/// succeeds — in its text and its JSON, and that none does where none would.
#[test]
fn predict_names_the_frameworks_that_run_its_layout() {
    let job = [
        "--cluster",
        "dgx-h100",
        "--model",
        "llama2-7b",
        "--micro-batch",
        "1",
        "--global-batch",
        "8",
    ];
    let cases: [(&[&str], &[&str]); 3] = [
        (&["--tp", "2", "--dp", "4"], &["megatron", "nemo"]),
        (
            &[
                "--tp",
                "2",
                "--dp",
                "4",
                "--sequence-parallel",
                "--zero",
                "3",
            ],
            &["torchtitan"],
        ),
        (&["--dp", "8", "--rules", "paper"], &[]),
    ];
    for (layout, expected) in cases {
        let args = [&job[..], layout].concat();
        let json = json_of(&stepcast(&[&["predict", "--json"][..], &args].concat()));
        let listed: Vec<&str> = json["runs_as_costed_on"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(listed, expected, "{layout:?}");
        for f in ["megatron", "nemo", "torchtitan"] {
            let e = stepcast(&[&["export", "--format", f][..], &args].concat());
            assert_eq!(e.status.success(), listed.contains(&f), "{f} {layout:?}");
        }
        let text = stdout(&stepcast(&[&["predict"][..], &args].concat()));
        let line = text.lines().find(|l| l.starts_with("frameworks")).unwrap();
        if expected.is_empty() {
            assert!(
                line.contains("none of megatron, nemo, torchtitan"),
                "{line}"
            );
        } else {
            assert!(
                line.contains(&format!("runs as costed on {}", expected.join(", "))),
                "{line}"
            );
        }
    }
}
