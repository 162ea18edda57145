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
}

#[test]
fn mock_collection_resumes_and_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    let args = [
        "collect",
        "--device",
        "mock",
        "--gpus",
        "0,1,2,3",
        "--quick",
        "--quiet",
        "--out",
        s(&out),
    ];
    let o = bench(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("test double"));
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
