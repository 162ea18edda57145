//! End-to-end tests of `stepcast search` and `stepcast ettr` through the binary.

mod common;

use common::{assert_user_error, repo, stderr, stdout, stepcast, LLAMA2_13B_ON_32};

/// Llama 2 7B on one node at global batch 8.
const LLAMA2_7B_ON_8: [&str; 6] = ["--model", "llama2-7b", "--gpus", "8", "--global-batch", "8"];

fn search(extra: &[&str]) -> std::process::Output {
    search_on("dgx-h100", extra)
}

/// `stepcast search` on the cluster file `hardware-profiles/<cluster>.yaml`.
fn search_on(cluster: &str, extra: &[&str]) -> std::process::Output {
    let cluster = repo(&format!("hardware-profiles/{cluster}.yaml"));
    let mut args = vec!["search", "--cluster", cluster.as_str()];
    args.extend_from_slice(extra);
    stepcast(&args)
}

#[test]
fn search_ranks_layouts_and_writes_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let csv_path = dir.path().join("all.csv");
    let json_path = dir.path().join("all.json");
    let html_path = dir.path().join("search.html");
    let o = search(
        &[
            &LLAMA2_13B_ON_32[..],
            &[
                "--top",
                "3",
                "--csv",
                csv_path.to_str().unwrap(),
                "--json",
                json_path.to_str().unwrap(),
                "--html",
                html_path.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("layouts enumerated") && text.contains("best: stepcast predict"),
        "{text}"
    );
    // it says which frameworks run the best layout as costed, or that none does
    assert!(
        text.contains("runs as costed on: ") || text.contains("note: none of megatron"),
        "{text}"
    );
    // and how the calibration every step is composed under did on the sets it held out
    assert!(
        text.contains("on the runs of sets it was not fitted on: "),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert!(
        report["calibration_held_out"]["flagperf"]["runs"].as_u64() > Some(0),
        "{report}"
    );
    let rows = report["rows"].as_array().unwrap();
    let predicted: Vec<&serde_json::Value> =
        rows.iter().filter(|r| r["status"] == "predicted").collect();
    assert_eq!(
        predicted.len() as u64,
        report["predicted"].as_u64().unwrap()
    );
    let pruned: u64 = report["pruned"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        report["enumerated"].as_u64().unwrap(),
        pruned + rows.len() as u64
    );
    let steps: Vec<f64> = predicted
        .iter()
        .map(|r| r["step_time_s"].as_f64().unwrap())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]));
    // the best three carry their 80 % interval
    for r in &predicted[..3] {
        let i = r["interval_s"].as_array().unwrap();
        assert!(i[0].as_f64().unwrap() <= r["step_time_s"].as_f64().unwrap());
    }
    csv_holds_the_rows(&csv_path, rows);
    html_page_shows_the_report(
        &std::fs::read_to_string(&html_path).unwrap(),
        &report,
        &text,
    );
    best_command_predicts(&text, steps[0]);
}

/// Each line of a search's `--csv` is its JSON row, in rank order: status, layout, step time and
/// memory — memory-pruned rows too, with their status and no step.
fn csv_holds_the_rows(csv_path: &std::path::Path, rows: &[serde_json::Value]) {
    let mut csv = csv::Reader::from_path(csv_path).unwrap();
    let lines: Vec<csv::StringRecord> = csv.records().map(|r| r.unwrap()).collect();
    let header = csv.headers().unwrap().clone();
    assert_eq!(lines.len(), rows.len());
    let mut statuses = std::collections::BTreeSet::new();
    for (i, (line, row)) in lines.iter().zip(rows).enumerate() {
        let cell = |name: &str| {
            line.get(header.iter().position(|h| h == name).unwrap())
                .unwrap()
        };
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        };
        assert_eq!(cell("rank"), (i + 1).to_string());
        assert_eq!(cell("status"), text(&row["status"]), "{row}");
        statuses.insert(cell("status").to_string());
        for key in [
            "tp",
            "cp",
            "ep",
            "etp",
            "pp",
            "dp",
            "micro_batch",
            "micro_batches",
            "vpp",
        ] {
            assert_eq!(cell(key), text(&row["layout"][key]), "{key}: {row}");
        }
        for key in ["schedule", "recompute", "sequence_parallel", "zero"] {
            assert_eq!(cell(key), text(&row["layout"][key]), "{key}: {row}");
        }
        assert_eq!(cell("step_s"), text(&row["step_time_s"]), "{row}");
        let peak: f64 = cell("memory_peak_gib").parse().unwrap();
        assert!((peak - row["memory_peak_gib"].as_f64().unwrap()).abs() < 1e-9);
    }
    // this search keeps memory-pruned rows beside the predicted ones
    assert!(
        statuses.contains("predicted") && statuses.len() > 1,
        "{statuses:?}"
    );
}

/// The best row's printed predict command gives the step time the search ranked it by.
fn best_command_predicts(printed: &str, step_s: f64) {
    let (best, predicted) = best_command_step(printed);
    let rel = predicted / step_s - 1.0;
    assert!(rel.abs() < 1e-9, "{best}: {rel}");
}

/// The step time of the best predicted row of a search's `--json` report.
fn best_predicted_step(json: &std::path::Path) -> f64 {
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let best = rows.iter().find(|r| r["status"] == "predicted").unwrap();
    best["step_time_s"].as_f64().unwrap()
}

/// The best row's printed predict command, and the step it predicts when run.
fn best_command_step(printed: &str) -> (String, f64) {
    let best = printed
        .lines()
        .find_map(|l| l.strip_prefix("best: stepcast "))
        .unwrap()
        .to_string();
    let mut args: Vec<&str> = best.split_whitespace().collect();
    args.push("--json");
    let p = stepcast(&args);
    assert!(p.status.success(), "{best}: {}", stderr(&p));
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    let step_s = p["step_time_s"].as_f64().unwrap();
    (best, step_s)
}

/// A mixture's search: the expert cell names an expert tensor-parallel degree other than tp,
/// and the best command carries the expert settings (ep, etp, imbalance) that give its step.
#[test]
fn a_mixtures_best_layout_carries_its_expert_settings() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let model = repo("tests/data/mixtral-8x7b.yaml");
    // the search's printed report and its best predicted row
    let search_with = |extra: &[&str]| {
        let job = ["--model", &model, "--gpus", "16", "--global-batch", "64"];
        let tail = ["--top", "3", "--json", json.to_str().unwrap()];
        let o = search(&[&job[..], extra, &tail].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let best = report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["status"] == "predicted")
            .unwrap()
            .clone();
        (stdout(&o), best)
    };
    let (text, best) = search_with(&["--moe-imbalance", "1.2"]);
    let layout = &best["layout"];
    let (ep, etp, tp) = (&layout["ep"], &layout["etp"], &layout["tp"]);
    assert!(ep.as_u64() > Some(1) && etp != tp, "{layout}");
    assert!(text.contains(&format!(" {ep} (etp {etp}) ")), "{text}");
    for flag in [
        format!(" --ep {ep} "),
        format!(" --etp {etp} "),
        " --moe-imbalance 1.2".into(),
    ] {
        assert!(text.contains(&flag), "{flag}: {text}");
    }
    best_command_predicts(&text, best["step_time_s"].as_f64().unwrap());

    // a run's router loads per layer, DeepEP's dispatcher and the all-to-all overlapped: the
    // table says so, the best command carries each and gives the ranked step
    let routing = dir.path().join("routing.csv");
    let loads: String = (0..32).map(|l| format!("{l},1.{}\n", l % 5)).collect();
    std::fs::write(&routing, format!("layer,imbalance\n{loads}")).unwrap();
    let (text, best) = search_with(&[
        "--moe-routing",
        routing.to_str().unwrap(),
        "--moe-dispatcher",
        "deepep",
        "--moe-a2a-overlap",
        "true",
        "--for",
        "megatron",
    ]);
    assert!(text.contains(", a2a overlap) "), "{text}");
    for flag in [
        " --moe-a2a-overlap".to_string(),
        " --moe-dispatcher deepep".into(),
        format!(" --moe-routing {}", routing.display()),
    ] {
        assert!(text.contains(&flag), "{flag}: {text}");
    }
    best_command_predicts(&text, best["step_time_s"].as_f64().unwrap());
    // its export rebuilds the row with the router loads and carries the dispatcher
    let e = stepcast(&[
        "export",
        "--format",
        "megatron",
        "--from-search",
        json.to_str().unwrap(),
    ]);
    assert!(e.status.success(), "{}", stderr(&e));
    // composed as the search composed it: no note that the steps differ
    assert!(!stderr(&e).contains("the search costed"), "{}", stderr(&e));
    let launch = stdout(&e);
    assert!(
        launch.contains("--moe-token-dispatcher-type flex")
            && launch.contains("--moe-flex-dispatcher-backend deepep"),
        "{launch}"
    );
}

/// The HTML page of a search shows what its JSON holds: the counts, the best `--top` layouts
/// in order with their step times, every rule's pruned count, and the best layout's command.
fn html_page_shows_the_report(html: &str, report: &serde_json::Value, printed: &str) {
    let count = |key: &str| report[key].as_u64().unwrap();
    let pruned = report["pruned"].as_object().unwrap();
    let by_rules: u64 = pruned.values().map(|v| v.as_u64().unwrap()).sum();
    let counts = format!(
        "<p>{} layouts enumerated, {by_rules} pruned by the rules, {} by memory, {} predicted in",
        count("enumerated"),
        count("pruned_memory"),
        count("predicted")
    );
    assert!(html.contains(&counts), "{counts}");
    let best = html
        .split("<h2>Best configurations</h2>")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap();
    let cells: Vec<Vec<&str>> = best
        .split("<tr><td>")
        .skip(1)
        .map(|row| {
            row.split("</td>")
                .map(|c| {
                    c.trim_start_matches("<td>")
                        .trim_start_matches("<td class=\"l\">")
                })
                .collect()
        })
        .collect();
    let predicted: Vec<&serde_json::Value> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "predicted")
        .collect();
    assert_eq!(cells.len(), 3, "{best}");
    for (i, (row, r)) in cells.iter().zip(&predicted).enumerate() {
        let layout = &r["layout"];
        let want: Vec<String> = ["tp", "cp", "pp", "dp"]
            .iter()
            .map(|k| layout[k].to_string())
            .collect();
        assert_eq!(row[0], (i + 1).to_string());
        assert_eq!(row[1..5], want, "{row:?}");
        let step: f64 = row[12].parse().unwrap();
        assert!(
            (step - r["step_time_s"].as_f64().unwrap()).abs() < 5e-4,
            "{row:?}"
        );
    }
    for (rule, n) in pruned {
        let line = format!("<tr><td class=\"l\">{rule}</td><td>{n}</td></tr>");
        assert!(html.contains(&line), "{line}");
    }
    let command = printed
        .lines()
        .find_map(|l| l.strip_prefix("best: "))
        .unwrap();
    assert!(html.contains(&format!(
        "<p class=\"note\">Best: <code>{command}</code></p>"
    )));
    assert!(html.contains("<h2>The best layout</h2>"));
}

#[test]
fn end_to_end_objective_reports_the_run() {
    let o = search(&[
        "--model",
        "llama2-7b",
        "--gpus",
        "16",
        "--global-batch",
        "32",
        "--objective",
        "e2e",
        "--tokens",
        "1e11",
        "--top",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("ETTR %") && text.contains("end to end") && text.contains("days"),
        "{text}"
    );
}

#[test]
fn a_search_for_a_framework_ends_in_its_launch() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("all.json");
    let html_path = dir.path().join("search.html");
    let o = search(
        &[
            &LLAMA2_13B_ON_32[..],
            &["--for", "megatron", "--json", json_path.to_str().unwrap()],
            &["--html", html_path.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("only layouts megatron runs as costed")
            && text.contains("megatron cannot run it: Megatron-Core's distributed optimizer"),
        "{text}"
    );
    // the report says so too
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(
        html.contains(
            "Only layouts megatron runs as costed (what <code>stepcast export --format \
             megatron</code> takes)"
        ),
        "{html}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(report["for"], "megatron");
    assert!(report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["layout"]["zero"].as_u64().unwrap() <= 1));
    // the printed export command launches the best layout
    let export = text
        .lines()
        .find_map(|l| l.strip_prefix("export: stepcast "))
        .unwrap()
        .to_string();
    let args: Vec<&str> = export.split_whitespace().collect();
    let e = stepcast(&args);
    assert!(e.status.success(), "{}", stderr(&e));
    assert!(stdout(&e).contains("pretrain_gpt.py"));
    // searched for torchtitan, the layouts are costed as it runs them, and the best line
    // reproduces the step
    let o = search(
        &[
            &LLAMA2_13B_ON_32[..],
            &["--for", "torchtitan", "--seq-len", "8192"],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("costed as torchtitan runs by default"),
        "{text}"
    );
    let best = text
        .lines()
        .find_map(|l| l.strip_prefix("best: stepcast "))
        .unwrap()
        .to_string();
    assert!(
        best.contains("--cross-entropy pytorch") && best.contains("--elementwise eager"),
        "{best}"
    );
    // a loss given to the search is every layout's, and its best line says so
    let fused = search(&[&LLAMA2_13B_ON_32[..], &["--cross-entropy", "fused"]].concat());
    assert!(fused.status.success(), "{}", stderr(&fused));
    let fused_best = stdout(&fused)
        .lines()
        .find_map(|l| l.strip_prefix("best: stepcast "))
        .unwrap()
        .to_string();
    assert!(fused_best.contains("--cross-entropy fused"), "{fused_best}");
    let mut args: Vec<&str> = best.split_whitespace().collect();
    args.push("--json");
    let p = stepcast(&args);
    assert!(p.status.success(), "{}", stderr(&p));
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    let step = p["step_time_s"].as_f64().unwrap();
    let row = text.lines().find(|l| l.starts_with("│ 1 ")).unwrap();
    assert!(row.contains(&format!("{step:.3}")), "{row} vs {step}");
    // a framework whose every layout is refused says why, with exit 2
    assert_user_error(
        &search(
            &[
                &LLAMA2_7B_ON_8[..],
                &["--dtype", "fp16", "--for", "torchtitan"],
            ]
            .concat(),
        ),
        &[
            "passed the rules",
            "torchtitan trains in bf16 or fp32",
            "drop --for torchtitan",
        ],
    );
    assert_user_error(
        &search(&[&LLAMA2_7B_ON_8[..], &["--for", "composer"]].concat()),
        &["composer"],
    );
}

/// `--nodes N` lays the job out on all the GPUs of N nodes, as `--gpus` of their count does,
/// and like `predict --nodes` takes the cluster as that many nodes; one of the two is needed.
#[test]
fn a_search_on_nodes_is_a_search_on_their_gpus() {
    let ranked = |size: &[&str]| {
        let o = search(&[&["--model", "llama2-7b", "--global-batch", "16"][..], size].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        // the timing of the search aside
        stdout(&o)
            .lines()
            .map(|l| l.split(" predicted in ").next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let on_nodes = ranked(&["--nodes", "2"]);
    assert!(
        on_nodes[0].contains("llama2-7b on 16 × NVIDIA H100"),
        "{on_nodes:?}"
    );
    // the same layouts, steps and best layout; its command names the nodes searched
    let on_gpus: Vec<String> = ranked(&["--gpus", "16"])
        .into_iter()
        .map(|l| l.replace("dgx-h100.yaml --model", "dgx-h100.yaml --nodes 2 --model"))
        .collect();
    assert!(on_nodes
        .iter()
        .any(|l| l.contains("dgx-h100.yaml --nodes 2 --model")));
    assert_eq!(on_nodes, on_gpus);
    // beyond the file's 2048 nodes, as predict takes them: the best command runs there
    let o = search(&[
        "--model",
        "llama2-7b",
        "--global-batch",
        "4096",
        "--nodes",
        "4096",
    ]);
    let text = stdout(&o);
    assert!(text.contains("llama2-7b on 32768 ×"), "{text}");
    let best_s: f64 = text
        .lines()
        .find(|l| l.starts_with("│ 1 "))
        .and_then(|l| l.split('┆').nth(13))
        .and_then(|cell| cell.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no best row: {text}"));
    // the table's three decimals
    let (best, step_s) = best_command_step(&text);
    assert!(best.contains(" --nodes 4096 "), "{best}");
    assert!((step_s - best_s).abs() <= 5e-4, "{best}: {step_s} s");
    for (size, needle) in [
        (
            &["--nodes", "0"][..],
            "--nodes 0: give between 1 and 1000000 nodes",
        ),
        (&["--nodes", "2", "--gpus", "16"][..], "cannot be used with"),
        (&[][..], "<--gpus <GPUS>|--nodes <NODES>>"),
    ] {
        let o = search(&[&["--model", "llama2-7b", "--global-batch", "16"][..], size].concat());
        assert_user_error(&o, &[needle]);
    }
}

#[test]
fn search_inputs_that_cannot_work_say_why() {
    assert_user_error(
        &search(&[
            "--model",
            "llama3-405b",
            "--gpus",
            "8",
            "--global-batch",
            "8",
        ]),
        &["no layout of llama3-405b fits", "smallest needs"],
    );
    assert_user_error(
        &search(&[&LLAMA2_7B_ON_8[..], &["--objective", "e2e"]].concat()),
        &["--tokens"],
    );
    assert_user_error(
        &search(&[
            "--model",
            "llama2-7b",
            "--gpus",
            "100000",
            "--global-batch",
            "8",
        ]),
        &["100000 GPUs"],
    );
    assert_user_error(
        &search(
            &[
                &LLAMA2_7B_ON_8[..],
                &[
                    "--tokens",
                    "1e9",
                    "--checkpoint-write-gb-per-s-per-node",
                    "-5",
                ],
            ]
            .concat(),
        ),
        &["must be positive"],
    );
}

#[test]
fn ettr_reproduces_mofa_and_refuses_impossible_inputs() {
    // MoFa Table 5, LLaMA2-70B on 128 GPUs: ETTR 98.49 %, T_E2E 26,947,190.75 s
    let o = stepcast(&[
        "ettr",
        "--step-s",
        "27.83",
        "--steps",
        "953675",
        "--nodes",
        "16",
        "--failures-per-node-day",
        "0.005",
        "--recovery-s",
        "134.41",
        "--save-s",
        "4.19",
        "--checkpoint-interval",
        "10",
        "--first-start-s",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!((v["outcome"]["ettr"].as_f64().unwrap() - 0.9849).abs() < 1e-4);
    assert!((v["outcome"]["end_to_end_s"].as_f64().unwrap() - 26_947_190.75).abs() < 0.2);
    let base = [
        "ettr", "--step-s", "28", "--steps", "1000", "--nodes", "32", "--save-s", "2",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        stepcast(&a)
    };
    assert_user_error(&with(&["--failures-per-node-day", "0"]), &["positive rate"]);
    assert_user_error(&with(&["--recovery-s", "-3"]), &["zero or positive"]);
    assert_user_error(
        &with(&["--failures-per-node-day", "500"]),
        &["failures_per_node_per_day = 500", "physical range"],
    );
    let o = stepcast(&[
        "ettr",
        "--step-s",
        "28",
        "--steps",
        "1000",
        "--nodes",
        "10000",
        "--save-s",
        "2",
        "--failures-per-node-day",
        "10",
    ]);
    assert_user_error(&o, &["recovering"]);
}

/// `search --cuda-graphs` costs every layout with those parts captured; the best line and the
/// export command carry them, and the export sets Megatron-Core's graphs.
#[test]
fn search_with_cuda_graphs_carries_them_to_the_best_line_and_the_export() {
    let o = search(
        &[
            &LLAMA2_13B_ON_32[..],
            &["--cuda-graphs", "attn,mlp", "--for", "megatron"],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
            .to_string()
    };
    let best = line("best: stepcast ");
    assert!(best.contains("--cuda-graphs attn,mlp"), "{best}");
    let export = line("export: stepcast ");
    let e = stepcast(&export.split_whitespace().collect::<Vec<_>>());
    assert!(e.status.success(), "{}", stderr(&e));
    let script = stdout(&e);
    assert!(script.contains("--cuda-graph-scope attn mlp"), "{script}");
}

/// A search whose best layout waits on the host says what CUDA graphs would save it (one
/// short sequence a micro-batch); given `--cuda-graphs` it does not.
#[test]
fn a_host_bound_best_layout_gets_the_cuda_graph_advice() {
    // eight-way tensor parallelism over 256 tokens on the DGX A100, whose calibration (vTrain's
    // small models) issues each kernel in 58 µs: the host, not the GPU, sets the pace
    let search = |extra: &[&str]| search_on("dgx-a100", extra);
    let small: Vec<&str> = "--model llama2-7b --gpus 8 --tp 8 --micro-batch 1 --global-batch 64 \
                            --seq-len 256 --for megatron"
        .split_whitespace()
        .collect();
    let o = search(&small);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let line = text
        .lines()
        .find(|l| l.starts_with("cuda graphs"))
        .unwrap_or_else(|| panic!("no advice in {text}"));
    assert!(
        line.contains("the best layout's kernels") && line.contains("--cuda-graphs"),
        "{line}"
    );
    let o = search(&[&small[..], &["--cuda-graphs", "layer"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("cuda graphs "), "{}", stdout(&o));
}

/// Long fp8 sequences over a context-parallel pair, under torchtitan's defaults and under NeMo
/// with tensor-parallel overlap: the best command carries what the layout was costed with
/// (context parallelism and its exchange, fp8 and its library, the kernels, the overlap, the
/// framework) and predicts the step the search ranked it by.
#[test]
fn a_long_fp8_sequences_best_command_carries_what_it_was_costed_with() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let job = [
        "--model",
        "llama3-8b",
        "--gpus",
        "16",
        "--global-batch",
        "32",
        "--dtype",
        "fp8",
        "--seq-len",
        "16384",
        "--cp",
        "2",
        "--tp",
        "2,4",
        "--pp",
        "1",
        "--json",
    ];
    let cases: [(&[&str], &[&str]); 2] = [
        (
            &["--for", "torchtitan"],
            &[
                " --cp 2 ",
                " --dtype fp8",
                " --cp-comm all-gather",
                " --fp8-library torchao",
                " --attention-kernel flash-attention-2",
            ],
        ),
        (
            &["--tp-comm-overlap", "--framework", "nemo"],
            &[
                " --cp 2 ",
                " --dtype fp8",
                " --tp-comm-overlap",
                " --framework nemo",
            ],
        ),
    ];
    for (extra, flags) in cases {
        let o = search(&[&job[..], &[json.to_str().unwrap()], extra].concat());
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let text = stdout(&o);
        let best = text
            .lines()
            .find(|l| l.starts_with("best: stepcast "))
            .unwrap();
        for flag in flags {
            assert!(best.contains(flag), "{flag}: {best}");
        }
        best_command_predicts(&text, best_predicted_step(&json));
    }
}

/// A search on other models and the raw physics: its best command names both (`--models`,
/// `--no-calibration`), quoted where a path holds a space or a quote, and run by a shell it
/// predicts the step the search ranked it by; an export of the search's JSON costs its headline
/// as the search did, and names why where it cannot.
#[test]
fn the_best_command_keeps_the_models_and_the_raw_physics_and_survives_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("the team's models");
    std::fs::create_dir(&models).unwrap();
    for f in ["models.bin", "manifest.json", "calibration.yaml"] {
        std::fs::copy(repo(&format!("models/h100-sxm/{f}")), models.join(f)).unwrap();
    }
    let json = dir.path().join("s.json");
    let tail = [
        "--top",
        "1",
        "--zero",
        "1",
        "--json",
        json.to_str().unwrap(),
    ];
    let steps = |extra: &[&str]| {
        let o = search(&[&LLAMA2_7B_ON_8[..], extra, &tail].concat());
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        (stdout(&o), best_predicted_step(&json))
    };
    let (_, calibrated) = steps(&[]);
    let (text, raw) = steps(&["--models", models.to_str().unwrap(), "--no-calibration"]);
    assert!(
        (raw / calibrated - 1.0).abs() > 0.01,
        "{raw} vs {calibrated}"
    );
    let best = text
        .lines()
        .find_map(|l| l.strip_prefix("best: stepcast "))
        .unwrap();
    assert!(best.ends_with(" --no-calibration"), "{best}");
    let quoted = format!("--models '{}'", models.display()).replace("team's", r"team'\''s");
    assert!(best.contains(&quoted), "{best}");
    let line = format!("\"$STEPCAST\" {best} --json");
    let o = std::process::Command::new("sh")
        .args(["-c", &line])
        .env("STEPCAST", env!("CARGO_BIN_EXE_stepcast"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{line}: {}", stderr(&o));
    let predicted = common::json_of(&o)["step_time_s"].as_f64().unwrap();
    assert!(
        (predicted / raw - 1.0).abs() < 1e-9,
        "{line}: {predicted} vs {raw}"
    );
    // an export of that search's best row costs its headline as the search did (its models,
    // the raw physics) and says so
    let export = |extra: &[&str]| {
        let args = ["export", "--format", "megatron", "--from-search"];
        let o = stepcast(&[&args[..], &[json.to_str().unwrap()], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    let (script, notes) = export(&[]);
    assert!(
        script.contains(&format!("predicts {raw:.3} s per step")),
        "{raw}: {script}"
    );
    assert!(
        notes.contains(&format!(
            "costed as the search was: its models {}, the raw physics",
            models.display()
        )) && !notes.contains("the search costed"),
        "{notes}"
    );
    // of a calibrated search on those models: the export's own --no-calibration, then a
    // calibration removed since, each named where the headline parts from the search's step
    steps(&["--models", models.to_str().unwrap()]);
    let (_, notes) = export(&["--no-calibration"]);
    assert!(
        notes.contains("the search costed this layout at")
            && notes.contains("this export's --models, --no-calibration or --framework"),
        "{notes}"
    );
    std::fs::remove_file(models.join("calibration.yaml")).unwrap();
    let (_, notes) = export(&[]);
    assert!(
        notes.contains("the calibration changed since the search (calibrated")
            && notes.contains(", now none): run the search again"),
        "{notes}"
    );
}
