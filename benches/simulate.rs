//! How long simulating one step takes: `cargo bench --bench simulate`. For 1,024-GPU layouts
//! with 64 micro-batches on the shipped DGX H100 cluster file, times the event simulation alone
//! (one pipeline of pp ranks; the data-parallel replicas share its timeline) and a whole
//! `predict` (decomposition, costs, simulation, the interval's re-simulations, memory), and
//! prints the medians.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use stepcast::hardware::Cluster;
use stepcast::plan::Plan;
use stepcast::predict::cost::CostModel;
use stepcast::predict::pipeline::pipeline_work;
use stepcast::predict::{estimate, predict, PredictOptions};
use stepcast::regress::ModelSet;
use stepcast::schedule::simulate;
use stepcast::workload::{Arch, Layout, ParallelSpec, Schedule};

fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster::load(&root.join("hardware-profiles/dgx-h100.yaml")).expect("cluster");
    let models = cluster
        .models_dir
        .as_ref()
        .and_then(|d| ModelSet::open(d).ok());
    let cost = CostModel::new(&cluster, models);
    println!(
        "{:<52} {:>12} {:>12} {:>8}",
        "layout (1,024 GPUs, 64 micro-batches)", "simulate ms", "predict ms", "passes"
    );
    for (model, tp, pp, dp, schedule, vpp) in [
        ("gpt3-175b", 8, 16, 8, Schedule::OneFOneB, 1),
        ("gpt3-175b", 8, 16, 8, Schedule::Interleaved, 3),
        ("gpt3-175b", 8, 16, 8, Schedule::ZbH1, 1),
        ("llama2-70b", 4, 16, 16, Schedule::Interleaved, 5),
        ("llama3-405b", 8, 32, 4, Schedule::OneFOneB, 1),
    ] {
        let arch = Arch::resolve(model).expect("preset");
        let spec = ParallelSpec {
            tp: Some(tp),
            pp: Some(pp),
            dp: Some(dp),
            micro_batch: Some(1),
            micro_batches: Some(64),
            sequence_parallel: Some(true),
            schedule: Some(schedule),
            vpp: Some(vpp),
            ..Default::default()
        };
        let layout = Layout::new(&spec, &arch, &cluster).expect("layout");
        let plan = Plan::new(&arch, &layout, &cluster);
        let runtime = stepcast::predict::runtime_for(layout.rules, &cost);
        let costed = estimate(&plan, &cost, false, runtime).expect("estimates");
        let work = pipeline_work(&plan, &layout, &costed.times);
        let passes: usize =
            work.chunks.len() * work.micro_batches * if schedule.splits_backward() { 3 } else { 2 };
        let sim = median_ms(21, || {
            black_box(simulate(black_box(&work)).expect("simulates"));
        });
        let whole = median_ms(5, || {
            black_box(
                predict(&arch, &layout, &cluster, &cost, PredictOptions::default())
                    .expect("predicts"),
            );
        });
        let name = format!(
            "{model} tp {tp} pp {pp} dp {dp} {}{}",
            schedule.name(),
            if vpp > 1 {
                format!(" vpp {vpp}")
            } else {
                String::new()
            }
        );
        println!("{name:<52} {sim:>12.3} {whole:>12.1} {passes:>8}");
    }
}
