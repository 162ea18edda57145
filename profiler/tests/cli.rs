//! End-to-end tests of the `stepcast-bench` binary with the mock device (a test double; no GPU).

use std::path::Path;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepcast-bench"))
        .args(args)
        .output()
        .expect("run stepcast-bench")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn plan_prints_counts_and_an_estimate() {
    let o = bench(&["plan"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("plan 'default'")
            && t.contains("gemm")
            && t.contains("estimated time on an H100"),
        "{t}"
    );
    // fp8 points are planned on a GPU with FP8 tensor cores, and said to be left out otherwise
    assert!(t.contains("fp8 points are left out: give --fp8"), "{t}");
    let o = bench(&["plan", "--fp8"]);
    assert!(!text(&o).contains("left out"), "{}", text(&o));
    let o = bench(&[
        "plan", "--quick", "--gpus", "2", "--timed", "3", "--keep", "5",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("keep ≤ timed"));
}

#[test]
fn plan_as_json_lists_every_point_with_its_provenance() {
    let o = bench(&["plan", "--quick", "--gpus", "4", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let points = doc["points"].as_array().unwrap();
    let per_operator: u64 = doc["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["points"].as_u64().unwrap())
        .sum();
    assert_eq!(points.len() as u64, per_operator);
    assert!(points.iter().all(|p| p["query"]["op"].is_string()));
    assert_eq!(doc["gpus_per_node"], 4);
    assert!(doc["estimated_s_h100"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["provenance"]["tool"], "stepcast");
    assert_eq!(doc["provenance"]["inputs"][0]["name"], "<built-in quick>");
    let o = bench(&["plan", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["provenance"]["inputs"][0]["name"], "<built-in default>");
}

/// `collect`'s arguments for the quick plan on a 4-GPU mock into `out`.
fn collect_quick_on_four_mock_gpus(out: &Path) -> Vec<&str> {
    let mut args: Vec<&str> = "collect --device mock --gpus 0,1,2,3 --quick --quiet --out"
        .split(' ')
        .collect();
    args.push(s(out));
    args
}

#[test]
fn mock_collection_resumes_and_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    let args = collect_quick_on_four_mock_gpus(&out);
    let o = bench(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("warning: the mock device is a test double"));
    let first = std::fs::read_to_string(out.join("gemm.csv")).unwrap();
    // collecting again into the same directory asks for --resume; with it nothing is repeated
    let o = bench(&args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--resume"));
    let mut resumed = args.to_vec();
    resumed.push("--resume");
    let o = bench(&resumed);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 points measured"), "{}", text(&o));
    assert!(!text(&o).contains("dropped"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("gemm.csv")).unwrap(),
        first
    );
    // a partial last row left by a kill is dropped, the rows before it kept
    let partial = "gemm,,bf16,fw";
    std::fs::write(out.join("gemm.csv"), format!("{first}{partial}")).unwrap();
    let o = bench(&resumed);
    let t = text(&o);
    assert!(
        t.contains(&format!(
            "dropped a partial last row ({} bytes)",
            partial.len()
        )),
        "{t}"
    );
    assert!(t.contains("0 points measured"), "{t}");
    assert_eq!(
        std::fs::read_to_string(out.join("gemm.csv")).unwrap(),
        first
    );
    // the rows keep every sample; collectives cover every group size of the 4 GPUs
    let ar = std::fs::read_to_string(out.join("all_reduce.csv")).unwrap();
    for gpn in 2..=4 {
        assert!(
            ar.contains(&format!(",{gpn},1,{gpn},")),
            "no group of {gpn}: {ar}"
        );
    }
    assert!(first
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .any(|c| c.matches(';').count() == 9));
}

#[test]
fn the_cuda_device_explains_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let o = bench(&[
        "collect",
        "--device",
        "cuda",
        "--quick",
        "--out",
        s(&tmp.path().join("x")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    // without the feature: how to build it; with it on a machine without a GPU: what is missing
    assert!(
        t.contains("--features cuda") || t.contains("libcuda.so not found"),
        "{t}"
    );
    assert!(!t.contains("panicked"));
}

#[test]
fn multi_node_launch_needs_a_rendezvous() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_stepcast-bench"))
        .args([
            "collect",
            "--device",
            "mock",
            "--quick",
            "--out",
            s(&tmp.path().join("x")),
        ])
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--rendezvous"));
}

/// Two processes of one launch (mock devices): process 0 announces the collectives still to
/// measure, process 1 runs exactly those and writes nothing; a resumed launch agrees again.
#[test]
fn nodes_of_a_launch_agree_on_the_collectives() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    let launch = |rank: &str, rendezvous: &Path, resume: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_stepcast-bench"));
        c.args([
            "collect", "--device", "mock", "--gpus", "0,1", "--quick", "--quiet",
        ])
        .args(["--out", s(&out), "--rendezvous", s(rendezvous)])
        .env("SLURM_PROCID", rank)
        .env("SLURM_NTASKS", "2");
        if resume {
            c.arg("--resume");
        }
        c
    };
    let first = tmp.path().join("rdv1");
    std::fs::create_dir(&first).unwrap();
    let spawn = |mut c: Command| {
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let follower = spawn(launch("1", &first, false));
    let leader = launch("0", &first, false).output().unwrap();
    let follower = follower.wait_with_output().unwrap();
    assert!(leader.status.success(), "{}", text(&leader));
    assert!(follower.status.success(), "{}", text(&follower));
    let measured = |o: &Output| -> usize {
        let t = text(o);
        let line = t.lines().find(|l| l.contains("points measured")).unwrap();
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    let collectives: usize = [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
    ]
    .iter()
    .filter_map(|k| std::fs::read_to_string(out.join(format!("{k}.csv"))).ok())
    .map(|t| t.lines().count() - 1)
    .sum();
    assert!(collectives > 0);
    assert_eq!(measured(&follower), collectives, "{}", text(&follower));
    assert!(measured(&leader) > collectives);
    // the same rendezvous directory again is refused; a new one resumes with nothing to do
    let o = launch("0", &first, true).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("new, empty directory"));
    let second = tmp.path().join("rdv2");
    std::fs::create_dir(&second).unwrap();
    let follower = spawn(launch("1", &second, true));
    let leader = launch("0", &second, true).output().unwrap();
    assert!(leader.status.success(), "{}", text(&leader));
    assert_eq!(measured(&follower.wait_with_output().unwrap()), 0);
}

/// Collects the quick plan on a 4-GPU mock into `dir/data`, trains models of it into
/// `dir/models` (as `stepcast train` would) and writes `dir/cluster.yaml` naming them: the DGX
/// H100 file with the mock's models, collectives included, and nothing transferred.
fn mock_models(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    let o = bench(&collect_quick_on_four_mock_gpus(&data));
    assert!(o.status.success(), "{}", text(&o));
    train_into(&data, &dir.join("models"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let h100 = std::fs::read_to_string(repo.join("hardware-profiles/dgx-h100.yaml")).unwrap();
    let (head, rest) = h100.split_once("\nmodels:\n").unwrap();
    let tail = &rest[rest.find("\nreliability:").unwrap()..];
    let cluster = dir.join("cluster.yaml");
    let models = format!("\nmodels:\n  dir: models\n  collectives: true{tail}");
    std::fs::write(&cluster, format!("{head}{models}")).unwrap();
    cluster
}

/// Trains every model of the dataset in `data` into `models`, as `stepcast train` does.
fn train_into(data: &Path, models: &Path) {
    use stepcast::dataset::Dataset;
    use stepcast::regress::train::{train, TrainOptions};
    use stepcast::regress::{Manifest, ModelSet};
    let dataset = Dataset::load(data).unwrap();
    let outcome = train(&dataset, &TrainOptions::default(), &|| {});
    let manifest = Manifest::of_training(&dataset, &outcome, 0, 0.0);
    ModelSet::save(models, manifest, outcome.models).unwrap();
}

/// `check` of `cluster`'s models on a 4-GPU mock.
fn check_on_four_mock_gpus(cluster: &Path) -> [&str; 7] {
    [
        "check",
        "--cluster",
        s(cluster),
        "--device",
        "mock",
        "--gpus",
        "0,1,2,3",
    ]
}

/// The operator rows `check` prints that say DRIFTED.
fn drifted(t: &str) -> Vec<&str> {
    t.lines()
        .filter(|l| l.contains("DRIFTED"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect()
}

/// `check` against models trained on the same mock: nothing drifted (exit 0); on a mock whose
/// GEMMs run 30 % slower ("after a driver update"): the GEMM rows drift (exit 3), in the table
/// and in the JSON, whose provenance names the cluster file.
#[test]
fn check_compares_this_node_with_the_models() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = mock_models(tmp.path());
    let check = check_on_four_mock_gpus(&cluster);
    let o = bench(&[&check[..], &["--quiet"]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("software: same as the models'"), "{t}");
    assert!(t.contains("measured/ref") && t.contains("\ngemm "), "{t}");
    assert!(!t.contains("probe: points of"), "{t}");
    assert!(
        t.contains("they were trained from dataset 'data': --previous <its directory>"),
        "{t}"
    );
    assert!(drifted(&t).is_empty(), "{t}");
    let slower = [&check[..], &["--quiet", "--mock-slowdown", "gemm=1.3"]].concat();
    let o = bench(&slower);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    let rows = drifted(&t);
    assert!(!rows.is_empty() && rows.iter().all(|r| *r == "gemm"), "{t}");
    assert!(t.contains("DRIFTED (> 10 %)"), "{t}");
    // a threshold above the slowdown lets it pass
    let o = bench(&[&slower[..], &["--threshold", "40"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = bench(&[&slower[..], &["--json"]].concat());
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["provenance"]["inputs"][0]["name"], s(&cluster));
    assert!(doc["probe_dataset"].is_null());
    let kinds = doc["kinds"].as_array().unwrap();
    for k in kinds {
        let gemm = k["op"] == "gemm";
        assert_eq!(k["drifted"], gemm, "{k}");
        let ratio = k["median_ratio"].as_f64().unwrap();
        let expected = if gemm { 1.3 } else { 1.0 };
        assert!((ratio - expected).abs() < 0.1, "{k}");
        // MAPE of the models' predictions against the probes: 1 − 1/1.3 = 23 % for the GEMMs
        let mape = k["mape_percent"].as_f64().unwrap();
        let expected = if gemm { 23.1 } else { 0.0 };
        assert!((mape - expected).abs() < 4.0, "{k}");
    }
    // the collectives the models could not learn (3 rows each) are counted, not compared
    let unmodelled = doc["unmodelled"].as_u64().unwrap();
    assert!(unmodelled > 0, "{doc}");
    let t = text(&bench(&slower));
    let line = format!(
        "{unmodelled} probes have no learned model nor a row of the collection and were not \
         compared"
    );
    assert!(t.contains(&line), "{t}");
    // the probe goes where --out says, as a dataset
    let probe = tmp.path().join("probe");
    let o = bench(&[&check[..], &["--quiet", "--out", s(&probe)]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains(s(&probe)), "{}", text(&o));
    assert!(probe.join("gemm.csv").is_file());
    let o = bench(&[&check[..], &["--quiet", "--out", s(&probe)]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("give --out a new directory"),
        "{}",
        text(&o)
    );
    // models trained under another driver: the change is named, in the table and the JSON
    let data = tmp.path().join("data");
    let meta = std::fs::read_to_string(data.join("meta.yaml")).unwrap();
    let older = meta.replace("driver: mock", "driver: 550.54.15");
    assert_ne!(older, meta);
    std::fs::write(data.join("meta.yaml"), older).unwrap();
    train_into(&data, &tmp.path().join("models"));
    let t = text(&bench(&[&check[..], &["--quiet"]].concat()));
    assert!(t.contains("software: driver 550.54.15 → mock"), "{t}");
    let o = bench(&[&check[..], &["--quiet", "--json"]].concat());
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        doc["software_changes"],
        serde_json::json!([["driver", "550.54.15", "mock"]])
    );
}

/// `check --previous` with the models' own collection: the probe times its points again and
/// compares each with its time then (exit 0 on the same mock, the GEMMs 1.3x on a slower one,
/// exit 3); the JSON names the dataset and its fingerprint; another dataset is refused (exit 2)
/// with both names.
#[test]
fn check_against_the_models_collection() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = mock_models(tmp.path());
    let data = tmp.path().join("data");
    let check = [
        &check_on_four_mock_gpus(&cluster)[..],
        &["--quiet", "--previous", s(&data)],
    ]
    .concat();
    let o = bench(&check);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains(&format!("probe: points of {}", s(&data))), "{t}");
    let gemm: Vec<&str> = t.lines().filter(|l| l.starts_with("gemm ")).collect();
    assert!(!gemm.is_empty(), "{t}");
    for line in gemm {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[3], "collection", "{line}");
        let ratio: f64 = cols[4].parse().unwrap();
        assert!((ratio - 1.0).abs() < 0.01, "{line}");
    }
    assert!(!t.contains("were not compared"), "{t}");
    let o = bench(&[&check[..], &["--mock-slowdown", "gemm=1.3", "--json"]].concat());
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let input = &doc["provenance"]["inputs"][1];
    assert_eq!(input["name"], s(&data), "{doc}");
    let fingerprint = stepcast::dataset::Dataset::load(&data).unwrap().fingerprint;
    assert_eq!(input["digest"], fingerprint.as_str(), "{doc}");
    assert_eq!(doc["previous_dataset"], s(&data));
    assert_eq!(doc["models_dataset"], "data");
    for k in doc["kinds"].as_array().unwrap() {
        assert_eq!(k["against"], "collection", "{k}");
        let expected = if k["op"] == "gemm" { 1.3 } else { 1.0 };
        let ratio = k["median_ratio"].as_f64().unwrap();
        assert!((ratio - expected).abs() < 0.01, "{k}");
    }
    // a copy under another name is another dataset
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    for f in std::fs::read_dir(&data).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, other.join(f.file_name().unwrap())).unwrap();
    }
    let meta = std::fs::read_to_string(other.join("meta.yaml")).unwrap();
    let name_line = meta.lines().find(|l| l.starts_with("name:")).unwrap();
    std::fs::write(
        other.join("meta.yaml"),
        meta.replace(name_line, "name: other"),
    )
    .unwrap();
    let mut refused = check.to_vec();
    *refused.last_mut().unwrap() = s(&other);
    let o = bench(&refused);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("is not the dataset") && t.contains("'other'"),
        "{t}"
    );
}

/// `retrain` on a node that did not drift keeps its models and writes nothing; on one whose
/// GEMMs drifted it continues the GEMMs an interrupted retrain left in `--out`, carries the
/// other rows over from the previous dataset, swaps the new models in and keeps the old ones
/// beside them; checked again, the models match the node; a finished `--out` is refused.
#[test]
fn retrain_recollects_what_drifted_and_swaps_the_models() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = mock_models(tmp.path());
    let device = ["--device", "mock", "--gpus", "0,1,2,3", "--quiet"];
    let slower = [&device[..], &["--mock-slowdown", "gemm=1.3"]].concat();
    let (old, new) = (tmp.path().join("data"), tmp.path().join("new"));
    let retrain = [
        &["retrain", "--cluster", s(&cluster), "--quick"][..],
        &["--previous", s(&old), "--out", s(&new)],
    ]
    .concat();
    let o = bench(&[&retrain[..], &device[..]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("nothing drifted past 10 %: the models are kept"),
        "{t}"
    );
    assert!(!new.exists());
    // a retrain interrupted after its first GEMM row (measured anew, 1.3 × slower) is continued
    std::fs::create_dir(&new).unwrap();
    std::fs::copy(old.join("meta.yaml"), new.join("meta.yaml")).unwrap();
    let gemms = std::fs::read_to_string(old.join("gemm.csv")).unwrap();
    let mut lines = gemms.lines();
    let header = lines.next().unwrap();
    let column = |name: &str| header.split(',').position(|c| c == name).unwrap();
    let (time, samples) = (column("time_us"), column("samples_us"));
    let slower_by = |v: &str| {
        v.split(';')
            .map(|x| (x.parse::<f64>().unwrap() * 1.3).to_string())
            .collect::<Vec<_>>()
            .join(";")
    };
    let mut first: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    first[time] = slower_by(&first[time]);
    first[samples] = slower_by(&first[samples]);
    std::fs::write(
        new.join("gemm.csv"),
        format!("{header}\n{}\n", first.join(",")),
    )
    .unwrap();
    let o = bench(&[&retrain[..], &slower[..]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(!t.contains("every kind is re-collected"), "{t}");
    let rest = t
        .split("re-collected gemm at the previous dataset's ")
        .nth(1)
        .unwrap_or_else(|| panic!("not at the previous dataset's points: {t}"));
    let number = |r: Option<&str>| -> usize {
        r.and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count: {t}"))
    };
    let points = number(Some(rest));
    let carried = number(rest.split('(').nth(1));
    let previous_rows = |kind: &str, dir: &Path| {
        std::fs::read_to_string(dir.join(format!("{kind}.csv")))
            .map_or(0, |t| t.lines().count() - 1)
    };
    let not_gemm: usize = std::fs::read_dir(&old)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let kind = name.strip_suffix(".csv")?.to_string();
            (kind != "gemm").then(|| previous_rows(&kind, &old))
        })
        .sum();
    assert_eq!(carried, not_gemm, "{t}");
    assert_eq!(points, previous_rows("gemm", &old), "{t}");
    assert_eq!(previous_rows("gemm", &new), previous_rows("gemm", &old));
    // the old models kept beside the new ones, named by today's date
    let kept: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("models.before-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(t.contains(&kept[0]), "{t}");
    let manifest = std::fs::read_to_string(tmp.path().join("models/manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    let today = manifest["created_at"].as_str().unwrap();
    assert_eq!(kept[0], format!("models.before-{today}"));
    // the network is the cluster file's (a node's collection cannot see it)
    assert_eq!(
        manifest["network"]["inter_node"]["technology"], "InfiniBand NDR",
        "{manifest}"
    );
    let meta = std::fs::read_to_string(new.join("meta.yaml")).unwrap();
    let name = manifest["dataset"]["name"].as_str().unwrap();
    assert!(meta.contains(&format!("name: {name}")), "{name}: {meta}");
    assert!(manifest["training_seconds"].as_f64().unwrap() > 0.0);
    // the slower node now matches its models
    let check = ["check", "--cluster", s(&cluster)];
    let o = bench(&[&check[..], &slower[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // the models now come from the new dataset: the first one is no longer theirs
    let before = std::fs::read_to_string(new.join("layernorm.csv")).unwrap();
    let slowest = [&device[..], &["--mock-slowdown", "gemm=1.9"]].concat();
    let o = bench(&[&retrain[..], &slowest[..]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("is not the dataset"), "{t}");
    // with the first models back, a finished retrain's dataset is not continued (its carried
    // rows would be held twice)
    let models = tmp.path().join("models");
    std::fs::remove_dir_all(&models).unwrap();
    std::fs::rename(tmp.path().join(&kept[0]), &models).unwrap();
    let o = bench(&[&retrain[..], &slowest[..]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("give a new --out"), "{t}");
    assert_eq!(
        std::fs::read_to_string(new.join("layernorm.csv")).unwrap(),
        before
    );
}

/// Without the dataset the models came from, `retrain` re-collects every kind of the plan: the
/// new models answer the kinds that did not drift as well (before, they had GEMM models only).
#[test]
fn retrain_without_the_previous_dataset_recollects_every_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = mock_models(tmp.path());
    let kinds = |dir: &Path| {
        let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        let mut kinds: Vec<String> = manifest["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["key"]["op"].as_str().unwrap().to_string())
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    };
    let before = kinds(&tmp.path().join("models"));
    assert!(before.len() > 5, "{before:?}");
    let o = bench(&[
        "retrain",
        "--cluster",
        s(&cluster),
        "--quick",
        "--out",
        s(&tmp.path().join("new")),
        "--device",
        "mock",
        "--gpus",
        "0,1,2,3",
        "--quiet",
        "--mock-slowdown",
        "gemm=1.3",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("every kind is re-collected"), "{t}");
    assert!(t.contains("at the plan's "), "{t}");
    assert!(t.contains("(0 rows carried over)"), "{t}");
    assert_eq!(kinds(&tmp.path().join("models")), before);
}

/// A STAND-IN for the node's Python with PyTorch (a test double, POSIX sh): it describes an H100
/// to the GPU probe, then reads the backend's request and answers its points in order — the
/// first skipped for memory, the second with a sample of 0 µs (under the timer's resolution),
/// each other with ten made-up samples (n.0 … n.9 for the n-th point) on cuDNN, every second
/// attention point on FlashAttention-2 — until it "crashes" on the last.
#[cfg(unix)]
const STAND_IN_PYTHON: &str = r#"#!/bin/sh
if [ "$1" = "-c" ]; then
    echo '["NVIDIA H100 80GB HBM3", 85520809984, 132, 52428800, 8]'
    exit 0
fi
echo '{"versions": {"torch": "2.11.0+stand-in", "cuda": "13.0", "cudnn": "91002"}}'
points=$(tr '{' '\n' | grep '"id":')
last=$(printf '%s\n' "$points" | wc -l)
printf '%s\n' "$points" | {
    n=0
    while read -r p; do
        n=$((n + 1))
        id=$(echo "$p" | sed 's/.*"id":\([0-9]*\).*/\1/')
        op=$(echo "$p" | sed 's/.*"op":"\([a-z_0-9]*\)".*/\1/')
        if [ "$n" -eq 1 ]; then
            echo "{\"id\": $id, \"skip\": \"out of memory\"}"
        elif [ "$n" -eq 2 ]; then
            echo "{\"id\": $id, \"samples_us\": [0.8, 0.0, 0.9], \"backend\": \"cudnn\"}"
        elif [ "$n" -eq "$last" ]; then
            echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2
            exit 1
        else
            backend=cudnn
            [ "$op" = flash_attention ] && [ $((n % 2)) -eq 0 ] && backend=flash_attention
            echo "{\"id\": $id, \"samples_us\": [$n.9, $n.1, $n.8, $n.2, $n.7, $n.3, $n.6, $n.4, $n.5, $n.0], \"backend\": \"$backend\", \"telemetry\": \"sm 1980 MHz\"}"
        fi
    done
}
"#;

/// `--device torch`: the GPU as the node's PyTorch describes it, every kernel (GEMMs included)
/// through the PyTorch backend, collectives skipped without the CUDA build; each answer a row
/// summarised by the sorted median, its backend and telemetry in the note, FlashAttention-2's
/// rows under their role; a skip and a crash of the backend kept as skipped rows with the
/// reason, and a point with a sample the dataset could not hold; the backend's versions in the
/// dataset's software stamp.
#[cfg(unix)]
#[test]
fn a_torch_collection_keeps_what_the_backend_answered() {
    use std::os::unix::fs::PermissionsExt;
    use stepcast::dataset::{Dataset, Status};
    use stepcast::ops::{OpKind, Role};
    let tmp = tempfile::tempdir().unwrap();
    let python = tmp.path().join("python");
    std::fs::write(&python, STAND_IN_PYTHON).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = tmp.path().join("ds");
    let o = bench(&[
        "collect",
        "--device",
        "torch",
        "--python",
        s(&python),
        "--quick",
        "--quiet",
        "--out",
        s(&out),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("on 8 × NVIDIA H100 80GB HBM3"), "{t}");
    assert!(t.contains("skipped 1 × out of memory"), "{t}");
    let crash = "PyTorch backend stopped (exit status: 1): RuntimeError: CUDA error: an illegal";
    assert!(t.contains(&format!("skipped 1 × {crash}")), "{t}");
    let ds = Dataset::load(&out).unwrap();
    let sw = &ds.meta.software;
    assert_eq!(sw.torch.as_deref(), Some("2.11.0+stand-in"));
    assert_eq!(
        (sw.cuda.as_deref(), sw.cudnn.as_deref()),
        (Some("13.0"), Some("91002"))
    );
    assert!(sw.attention_backend.as_deref().unwrap().contains("auto"));
    let (mut gemms, mut fa2, mut skipped) = (0, 0, Vec::new());
    for m in &ds.rows {
        if m.query.op.is_collective() {
            assert!(m.note.contains("--features cuda"), "{}", m.note);
            continue;
        }
        if m.status != Status::Ok {
            skipped.push(m.note.clone());
            continue;
        }
        assert_eq!(m.samples_us.len(), 10, "{}", m.query);
        assert_eq!(
            Some(m.time_us),
            stepcast::stats::sorted_median(&m.samples_us, 5)
        );
        assert!(m.note.ends_with("; sm 1980 MHz"), "{}", m.note);
        let on_fa2 = m.note.starts_with("flash_attention;");
        assert_eq!(
            m.query.role == Some(Role::FlashAttention2),
            on_fa2,
            "{}",
            m.query
        );
        fa2 += usize::from(on_fa2);
        gemms += usize::from(m.query.op == OpKind::Gemm);
    }
    assert!(
        gemms > 0 && fa2 > 0,
        "{gemms} GEMMs, {fa2} FlashAttention-2 rows"
    );
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(
        skipped
            .iter()
            .any(|n| n.starts_with("a sample of 0 µs, outside")),
        "{skipped:?}"
    );
    assert!(skipped.iter().any(|n| n == "out of memory"), "{skipped:?}");
    assert!(skipped.iter().any(|n| n.starts_with(crash)), "{skipped:?}");
    // the summary counts rows as the dataset holds them: the 0 µs point is skipped, not measured
    let ok = ds.rows.iter().filter(|m| m.is_ok()).count();
    let collectives = ds
        .rows
        .iter()
        .filter(|m| m.query.op.is_collective())
        .count();
    let line = format!(
        "{ok} points measured, 0 already in {}, {} skipped, 0 with throttled clocks",
        s(&out),
        skipped.len() + collectives
    );
    assert!(t.contains(&line), "{line}\n{t}");
    assert!(t.contains("skipped 1 × a sample of 0 µs"), "{t}");
}
