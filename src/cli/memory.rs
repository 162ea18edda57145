//! `stepcast memory`: what each GPU of a layout holds at its peak, and whether it fits.

use clap::Args;

use super::layout::{describe, JobArgs};
use super::output::{align_numbers, table};
use stepcast::memory::project;
use stepcast::plan::Plan;

#[derive(Debug, Args)]
pub struct MemoryArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Print the projection as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: MemoryArgs) -> anyhow::Result<()> {
    let job = args.job.resolve()?;
    let plan = Plan::new(&job.arch, &job.layout, &job.cluster);
    let report = project(&job.arch, &job.layout, &job.cluster, &plan);
    if args.json {
        return super::stamp::print(&report, job.inputs);
    }
    println!(
        "{} on {} ({}, {:.0} GiB per GPU)",
        job.arch.name, job.cluster.spec.name, job.cluster.spec.gpu.name, report.capacity_gib
    );
    println!("{}", describe(&job));
    println!();
    let mut t = table(&[
        "rank",
        "params/GPU",
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "in flight",
        "transient",
        "overhead",
        "total GiB",
        "verdict",
    ]);
    for r in &report.ranks {
        t.add_row(vec![
            r.rank.to_string(),
            format!("{:.1} M", r.params as f64 / 1e6),
            format!("{:.2}", r.weights_gib),
            format!("{:.2}", r.gradients_gib),
            format!("{:.2}", r.optimizer_gib),
            format!("{:.2}", r.activations_gib),
            format!("{:.2}", r.in_flight),
            format!("{:.2}", r.transient_gib),
            format!("{:.2}", r.overhead_gib),
            format!("{:.2}", r.total_gib),
            r.verdict.name().to_string(),
        ]);
    }
    align_numbers(&mut t, 1);
    let hidden = super::output::fit(&mut t, &[8, 7, 6, 1]);
    println!("{t}");
    if let Some(h) = hidden {
        println!("{h}");
    }
    let peak = report.peak();
    println!(
        "peak {:.1} GiB on rank {} of {:.0} GiB: {}",
        peak.total_gib,
        peak.rank,
        report.capacity_gib,
        report.verdict.name()
    );
    let (low, high) = stepcast::memory::REPORTED_PEAK_BAND;
    println!(
        "a run would likely show {:.1}–{:.1} GiB there: published runs reported ×{low:.2}–×{high:.2} \
         of such projections (PyTorch's reserved or the device's used memory)",
        report.reported_peak_gib[0], report.reported_peak_gib[1]
    );
    if let Some(r) = report
        .ranks
        .iter()
        .filter(|r| r.step_gradients_gib > 0.0)
        .max_by(|a, b| a.step_gradients_gib.total_cmp(&b.step_gradients_gib))
    {
        println!(
            "the optimizer step makes fp32 copies of the 16-bit gradients ({:.2} GiB on rank {}), \
             after the last backward freed the activations: a total counts the larger of the two",
            r.step_gradients_gib, r.rank
        );
    }
    println!(
        "one layer stores {:.1} MiB per micro-batch and GPU:",
        report.layer_activations_gib * 1024.0
    );
    for s in &report.layer.stored {
        println!(
            "  {:<42} {:>9.1} MiB",
            s.what,
            s.bytes / (1u64 << 20) as f64
        );
    }
    println!(
        "(in flight: micro-batches of the rank's layers whose activations the schedule holds at \
         its peak; AT-RISK above 90 % of the GPU's memory)"
    );
    Ok(())
}
