//! End-to-end tests of the `stepcast` binary on small synthetic data.

mod common;

use std::fs;

use common::{assert_user_error, stderr, stdout, stepcast, write_dataset};

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
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
    assert!(models.join("rmsnorm.fwd.fp16.json").is_file());

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
    let manifest: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(models.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["seed"], 3);
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
    for file in ["gemm.fwd.fp16.json", "all_reduce.none.fp16.json"] {
        let fa: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(a.join(file)).unwrap()).unwrap();
        let fb: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(b.join(file)).unwrap()).unwrap();
        assert_eq!(fa["forest"], fb["forest"], "{file}");
    }
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
        ("nan", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\nrmsnorm,fp16,fwd,1,2,3,NaN\n", &["rmsnorm.csv:3", "positive and finite"]),
        ("negative", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,-5\n", &["rmsnorm.csv:2", "positive"]),
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

    let file = models.join("rmsnorm.fwd.fp16.json");
    let text = fs::read_to_string(&file).unwrap();
    fs::write(
        &file,
        text.replacen(
            "\"feature_schema_version\":1",
            "\"feature_schema_version\":99",
            1,
        ),
    )
    .unwrap();
    assert_user_error(
        &stepcast(&["eval", s(&models), s(&ds)]),
        &[
            "rmsnorm.fwd.fp16.json",
            "feature schema version 99",
            "retrain",
        ],
    );

    let manifest = models.join("manifest.json");
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(
        &manifest,
        text.replacen("\"format_version\": 1", "\"format_version\": 7", 1),
    )
    .unwrap();
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
