//! `stepcast calibrate RUNS.csv --cluster C`: fits the runtime of C's models to the measured
//! runs (every run whose cluster uses the same models), reports the error per source set raw
//! and grouped-cross-validated, and writes `calibration.yaml` next to the models.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use clap::Args;
use rayon::prelude::*;

use super::output::{align_numbers, table};
use stepcast::calibrate::{evaluate, runs, Current, Prepared, Report, RunResult, SetReport};
use stepcast::hardware::{Calibration, Calibrations, Cluster, FittedOn};
use stepcast::predict::cost::CostModel;
use stepcast::provenance::digest;
use stepcast::regress::ModelSet;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Measured runs (CSV; columns in the README, "Calibration").
    pub runs: PathBuf,
    /// The cluster calibrated: the runs on it (by its name, with its models) are used, and
    /// its entry in its models' calibration.yaml is written.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Where to write the calibration (default: calibration.yaml in the models directory).
    #[arg(long, value_name = "FILE.yaml")]
    pub out: Option<PathBuf>,
    /// Fit on these source sets only (comma-separated); the others are predicted with the
    /// result, held out whole (default: every set).
    #[arg(long, value_delimiter = ',')]
    pub fit_sets: Vec<String>,
    /// Fit this framework's runs alone (the runs CSV's framework column, e.g. composer) and
    /// write its own entry, which `predict --framework` picks; runs of other frameworks are
    /// left out.
    #[arg(long, value_parser = stepcast::hardware::framework_name)]
    pub framework: Option<String>,
    /// Report only; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Fit nothing: predict every run as `predict` would now (under its cluster's
    /// calibration, its framework's, or the one the cluster file borrows) and report the error
    /// per set beside the raw physics; writes no calibration.
    #[arg(long, conflicts_with_all = ["fit_sets", "out"])]
    pub check: bool,
    /// Also write the whole report (every run, raw and cross-validated) as JSON.
    #[arg(long, value_name = "FILE.json")]
    pub json: Option<PathBuf>,
}

/// A cluster and its models, loaded once per cluster name the runs use.
struct Loaded {
    cluster: Cluster,
    models: Option<ModelSet>,
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    let all_runs = runs::load(&args.runs)?;
    let target = Cluster::load(&args.cluster)?;
    // a cluster without models (predict composes it from the roofline) can be checked and a
    // fit shown, but has no models directory a calibration could be read from
    let target_models = super::layout::open_models(None, &target)?;
    if target_models.is_none() && !args.check && !args.dry_run {
        anyhow::bail!(stepcast::Error::Invalid(format!(
            "{} names no models, and predict reads a calibration from next to a cluster's \
             models: check the roofline against the runs with --check, or see a fit with \
             --dry-run",
            target.path.display()
        )));
    }
    let fingerprint = target_models.as_ref().map(|m| m.fingerprint().to_string());
    // every cluster the runs name, with its models
    let mut loaded: HashMap<PathBuf, Result<Loaded, String>> = HashMap::new();
    for r in all_runs.iter().filter(|r| r.not_expressible.is_none()) {
        loaded.entry(r.cluster.clone()).or_insert_with(|| {
            let cluster = Cluster::load(&r.cluster).map_err(|e| e.to_string())?;
            let models =
                super::layout::open_models(None, &cluster).map_err(|e| format!("{e:#}"))?;
            Ok(Loaded { cluster, models })
        });
    }
    for (path, l) in &loaded {
        if let Err(e) = l {
            eprintln!("warning: runs on {} left out: {e}", path.display());
        }
    }
    // the runs of this calibration: those on this cluster, with these models (the
    // inexpressible ones too, so each set's row count is honest)
    let name = target.spec.name.clone();
    let runs: Vec<runs::Run> = all_runs
        .iter()
        .filter(|r| !r.cluster.as_os_str().is_empty())
        .filter(|r| same_cluster(&r.cluster, &loaded, &name, fingerprint.as_deref()))
        .filter(|r| args.framework.is_none() || r.framework == args.framework)
        .cloned()
        .collect();
    if let Some(f) = &args.framework {
        if runs.is_empty() {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "--framework {f}: no run of {} on {name} names that framework; give one from \
                 its framework column",
                args.runs.display()
            )));
        }
    }
    // each cluster's cost model, composed under its raw (default) runtime
    let mut clusters: HashMap<PathBuf, Cluster> = HashMap::new();
    let mut models: HashMap<PathBuf, Option<ModelSet>> = HashMap::new();
    for (path, l) in loaded {
        if let Ok(l) = l {
            clusters.insert(path.clone(), l.cluster);
            models.insert(path, l.models);
        }
    }
    let costs: HashMap<&PathBuf, CostModel> = clusters
        .iter()
        .map(|(p, c)| {
            let m = models.remove(p).flatten();
            let cost = CostModel::new(c, m)
                .with_transfer(super::layout::open_transfer(c)?)
                .with_collectives(super::layout::open_collectives(c)?)
                .with_runtime(c.spec.runtime);
            Ok((p, cost))
        })
        .collect::<anyhow::Result<_>>()?;
    let prepared: Vec<Result<Prepared, String>> = runs
        .par_iter()
        .enumerate()
        .filter(|(_, r)| r.not_expressible.is_none())
        .map(|(i, r)| {
            let cluster = clusters.get(&r.cluster).ok_or("cluster not loaded")?;
            Prepared::new(i, r, cluster, &costs[&r.cluster]).map_err(|e| e.to_string())
        })
        .collect();
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    let expressible: Vec<usize> = (0..runs.len())
        .filter(|&i| runs[i].not_expressible.is_none())
        .collect();
    for (p, &i) in prepared.into_iter().zip(&expressible) {
        match p {
            Ok(p) => ok.push(p),
            Err(e) => failed.push((i, e)),
        }
    }
    if ok.is_empty() {
        // why the first run that could not be predicted was not
        let first = failed
            .first()
            .map(|(i, e)| format!(" (line {}: {e})", runs[*i].line))
            .unwrap_or_default();
        anyhow::bail!(stepcast::Error::Empty(format!(
            "{}: no run on a cluster with the models of {} could be predicted{first}; check \
             the runs' cluster column and layouts",
            args.runs.display(),
            args.cluster.display()
        )));
    }
    let inputs = || {
        let mut inputs = vec![
            super::stamp::file("runs", &args.runs),
            super::stamp::cluster(&target),
        ];
        inputs.extend(target_models.as_ref().map(super::stamp::models));
        inputs
    };
    if args.check {
        let check = check_runs(&runs, &ok, &failed, &clusters)?;
        print_check(&check);
        if let Some(path) = &args.json {
            let inputs = inputs();
            stepcast::fsutil::write_atomic(
                path,
                super::stamp::document(&check, inputs)?.as_bytes(),
            )?;
            println!("report written to {}", path.display());
        }
        return Ok(());
    }
    for set in &args.fit_sets {
        if !runs.iter().any(|r| &r.set == set) {
            anyhow::bail!(stepcast::Error::Invalid(format!(
                "--fit-sets names '{set}', which no run of {} on these models has: give sets \
                 from its set column",
                args.runs.display()
            )));
        }
    }
    let report = evaluate(&runs, &mut ok, &failed, &args.fit_sets);
    print_report(&report);
    let fitted: Vec<&Prepared> = ok
        .iter()
        .filter(|p| args.fit_sets.is_empty() || args.fit_sets.contains(&runs[p.index].set))
        .collect();
    let calibration = calibration_of(
        &name,
        args.framework.clone(),
        &report,
        &args.runs,
        &runs,
        &fitted,
    )?;
    if let Some(path) = &args.json {
        stepcast::fsutil::write_atomic(
            path,
            super::stamp::document(&report, inputs())?.as_bytes(),
        )?;
        println!("report written to {}", path.display());
    }
    if args.dry_run {
        println!("--dry-run: nothing written");
        return Ok(());
    }
    let out = match (&args.out, target.models_dir.as_ref()) {
        (Some(o), _) => o.clone(),
        (None, Some(dir)) => dir.join(stepcast::regress::modelset::CALIBRATION_FILE),
        (None, None) => anyhow::bail!(stepcast::Error::Invalid(format!(
            "{}'s models are built in: give --out FILE.yaml (or calibrate a cluster file whose \
             models are a directory)",
            args.cluster.display()
        ))),
    };
    // the other clusters' calibrations in the file stay as they are, and so the directory is
    // locked from reading them to the rename: two calibrations into one file at once would
    // each keep only its own entry (and a training of the models directory is not disturbed)
    let _writing = stepcast::fsutil::DirLock::exclusive(stepcast::fsutil::dir_of(&out))?;
    let existing = if out.is_file() {
        Calibrations::parse(&out, &stepcast::fsutil::read_to_string(&out)?)?
    } else {
        Calibrations::default()
    };
    let text = format!(
        "# fitted by `stepcast calibrate`, one entry per cluster — do not edit; calibrate \
         again instead\n{}",
        serde_norway::to_string(&existing.with(calibration))?
    );
    stepcast::fsutil::write_atomic(&out, text.as_bytes())?;
    let under = args
        .framework
        .as_ref()
        .map(|f| format!(" under {f}"))
        .unwrap_or_default();
    println!("calibration of {name}{under} written to {}", out.display());
    Ok(())
}

/// The runs judged under the runtime `predict` composes each under now: per cluster file and
/// framework, the calibration the cluster's cost model finds (its own, its framework's, or the
/// one its file borrows), else the cluster's defaults.
fn check_runs(
    runs: &[runs::Run],
    prepared: &[Prepared],
    failed: &[(usize, String)],
    clusters: &HashMap<PathBuf, Cluster>,
) -> anyhow::Result<stepcast::calibrate::Check> {
    let mut current: HashMap<(PathBuf, Option<String>), Current> = HashMap::new();
    for p in prepared {
        let run = &runs[p.index];
        let key = (run.cluster.clone(), run.framework.clone());
        if current.contains_key(&key) {
            continue;
        }
        let cluster = &clusters[&run.cluster];
        let cost = CostModel::new(cluster, super::layout::open_models(None, cluster)?)
            .with_framework(run.framework.as_deref());
        current.insert(
            key,
            Current {
                runtime: cost.runtime(),
                sigma_log: cost.runtime_sigma_log(),
                sigma_log_by_dtype: cost.runtime_sigma_by_dtype().clone(),
                summary: cost.calibration_summary().map(str::to_string),
                fitted_sets: cost.calibration_sets().to_vec(),
                range: cost.calibration_range().cloned(),
            },
        );
    }
    let of = |p: &Prepared| {
        let run = &runs[p.index];
        &current[&(run.cluster.clone(), run.framework.clone())]
    };
    Ok(stepcast::calibrate::check(runs, prepared, failed, &of))
}

/// A check's report: the runtimes used, the error per set raw and as `predict` composes the
/// runs now, the interval's coverage and the memory projection.
fn print_check(c: &stepcast::calibrate::Check) {
    println!("nothing fitted: each run predicted under the runtime predict composes it under now");
    for r in &c.runtimes {
        let now = &r.current;
        // without a calibration the summary, if any, says which one is missing
        let name = match (now.sigma_log, &now.summary) {
            (Some(_), Some(summary)) => summary.clone(),
            (_, Some(why)) => format!("the cluster's defaults ({why})"),
            (_, None) => "the cluster's defaults (no calibration)".to_string(),
        };
        println!("  {} runs: {name}", r.runs);
    }
    let label = |name: &str, fitted: bool| {
        if fitted {
            format!("{name} (in sample)")
        } else {
            name.to_string()
        }
    };
    println!("{}", sets_table(&c.sets, "", &label));
    let inside: Vec<String> = c
        .sets
        .iter()
        .filter_map(|(name, s)| Some(format!("{name} {:.0} %", s.inside_interval_percent?)))
        .collect();
    if !inside.is_empty() {
        let (low, high) = stepcast::predict::EXTRAPOLATION_BAND;
        println!(
            "runs inside predict's 80 % interval (its calibration part, widened to ×{low:.2}–\
             ×{high:.2} for runs beyond the runs fitted on; about 80 % where it is honest): {}",
            inside.join(", ")
        );
    }
    print_beyond(&c.sets, &c.runs, "");
    let [raw, now] = c.overall;
    println!(
        "all {} runs: raw {:.1} % mean |error| (bias {:+.1} %), as predict composes them now \
         {:.1} % ({:+.1} %)",
        raw.runs, raw.mean_abs_percent, raw.bias_percent, now.mean_abs_percent, now.bias_percent
    );
    print_memory(&c.sets);
    print_unpredicted(&c.runs);
}

/// Whether a run's cluster is the one being calibrated: the same name and the same models
/// (or, for a cluster without models, none either).
fn same_cluster(
    cluster: &Path,
    loaded: &HashMap<PathBuf, Result<Loaded, String>>,
    name: &str,
    fingerprint: Option<&str>,
) -> bool {
    let matches = |c: &Cluster, m: Option<&ModelSet>| {
        c.spec.name == name && m.map(|m| m.fingerprint()) == fingerprint
    };
    match loaded.get(cluster) {
        Some(Ok(l)) => matches(&l.cluster, l.models.as_ref()),
        Some(Err(_)) => false,
        None => Cluster::load(cluster).ok().is_some_and(|c| {
            let m = super::layout::open_models(None, &c).ok().flatten();
            matches(&c, m.as_ref())
        }),
    }
}

fn calibration_of(
    cluster: &str,
    framework: Option<String>,
    report: &Report,
    file: &Path,
    runs: &[runs::Run],
    ok: &[&Prepared],
) -> anyhow::Result<Calibration> {
    let bytes = std::fs::read(file)?;
    let mut sets: BTreeMap<String, usize> = BTreeMap::new();
    let mut families: Vec<String> = Vec::new();
    for p in ok {
        *sets.entry(runs[p.index].set.clone()).or_default() += 1;
        families.push(runs[p.index].family.clone());
    }
    families.sort();
    families.dedup();
    let cv = report.overall[2];
    Ok(Calibration {
        cluster: cluster.to_string(),
        framework,
        runtime: report.fitted.runtime,
        fitted_on: FittedOn {
            file: file.display().to_string(),
            fingerprint: digest(&bytes),
            runs: ok.len(),
            sets,
            families,
            range: report.fitted_range.clone(),
        },
        raw: report.overall[0],
        in_sample: report.overall[1],
        cross_validated: (cv.runs > 0).then_some(cv),
        // per type only where there was a cross-validation at all
        cross_validated_by_dtype: if cv.runs > 0 {
            report.cross_validated_by_dtype.clone()
        } else {
            BTreeMap::new()
        },
        held_out: report
            .sets
            .iter()
            .filter(|(_, s)| !s.fitted && s.cross_validated.runs > 0)
            .map(|(name, s)| (name.clone(), s.cross_validated))
            .collect(),
        at_bound: report
            .fitted
            .at_bound
            .iter()
            .map(|s| s.to_string())
            .collect(),
        stepcast: format!(
            "{} (commit {})",
            stepcast::provenance::VERSION,
            stepcast::provenance::COMMIT
        ),
        created_at: stepcast::fsutil::today_utc(),
    })
}

fn print_report(r: &Report) {
    let label = |name: &str, fitted: bool| {
        if fitted {
            name.to_string()
        } else {
            format!("{name} (held out)")
        }
    };
    println!("{}", sets_table(&r.sets, "CV ", &label));
    print_beyond(&r.sets, &r.runs, " (held out)");
    // whether predict's interval, widened by this fit's error, holds what it claims
    let inside: Vec<String> = r
        .sets
        .iter()
        .filter_map(|(name, s)| {
            let held_out = if s.fitted { "" } else { " (held out)" };
            Some(format!(
                "{name}{held_out} {:.0} %",
                s.inside_interval_percent?
            ))
        })
        .collect();
    if !inside.is_empty() {
        let (low, high) = stepcast::predict::EXTRAPOLATION_BAND;
        println!(
            "runs inside predict's 80 % interval (its calibration part, σ {:.1} %, widened to \
             ×{low:.2}–×{high:.2} for runs beyond the runs fitted on; about 80 % where it is \
             honest): {}",
            100.0 * r.interval_sigma_log,
            inside.join(", ")
        );
    }
    let [raw, fit, cv] = r.overall;
    let cv = if cv.runs > 0 {
        format!(
            "grouped cross-validation {:.1} % ({:+.1} %)",
            cv.mean_abs_percent, cv.bias_percent
        )
    } else {
        "no grouped cross-validation (one model family: each family is predicted by a fit \
         without it, so it needs runs of two or more)"
            .to_string()
    };
    println!(
        "all {} runs: raw {:.1} % mean |error| (bias {:+.1} %), fitted {:.1} % ({:+.1} %), {cv}",
        raw.runs, raw.mean_abs_percent, raw.bias_percent, fit.mean_abs_percent, fit.bias_percent,
    );
    let f = &r.fitted.runtime;
    let d = &r.raw_runtime;
    println!(
        "fitted: launch {:.1} µs (default {:.1}), collective launch {:.0} µs ({:.0}), in-situ \
         efficiency {:.3} ({:.3}), contention {:.2} ({:.2}), per-step overhead {:.1} ms ({:.1}), \
         FlashAttention-2 efficiency {:.3} ({:.3})",
        f.launch_us,
        d.launch_us,
        f.collective_launch_us,
        d.collective_launch_us,
        f.in_situ_efficiency,
        d.in_situ_efficiency,
        f.contention,
        d.contention,
        f.step_overhead_ms,
        d.step_overhead_ms,
        f.flash_attention_2_efficiency,
        d.flash_attention_2_efficiency
    );
    if !r.fitted.kept_at_default.is_empty() {
        println!(
            "kept at the default (the runs drift it to a bound but do not pay for that, loss \
             within 1 %): {}",
            r.fitted.kept_at_default.join(", ")
        );
    }
    if !r.fitted.at_bound.is_empty() {
        println!(
            "at a bound (the runs push it beyond physics; read with care): {}",
            r.fitted.at_bound.join(", ")
        );
        // whether the runs need the bound value: the same fit with it at its default
        for h in &r.held_at_default {
            println!(
                "  {} at its default {} instead of {}, the others refitted: in-sample {:.1} % \
                 mean |error| ({:+.1} %) against {:.1} % ({:+.1} %)",
                h.parameter,
                short(h.default),
                short(h.fitted),
                h.in_sample.mean_abs_percent,
                h.in_sample.bias_percent,
                fit.mean_abs_percent,
                fit.bias_percent
            );
        }
    }
    print_memory(&r.sets);
    print_unpredicted(&r.runs);
}

/// The error per set: rows, expressible, predicted, the raw physics' mean, max and bias, the
/// judged prediction's (its columns headed `judged`: "CV " for a fit's cross-validation) and
/// the highest MFU of each; `label` names a set by whether the runtime was fitted on it.
fn sets_table(
    sets: &BTreeMap<String, SetReport>,
    judged: &str,
    label: &dyn Fn(&str, bool) -> String,
) -> comfy_table::Table {
    let judged = [
        format!("{judged}mean"),
        format!("{judged}max"),
        format!("{judged}bias"),
    ];
    let mut t = table(&[
        "set",
        "rows",
        "expressible",
        "predicted",
        "raw mean",
        "raw max",
        "raw bias",
        &judged[0],
        &judged[1],
        &judged[2],
        "max MFU",
    ]);
    let pct = |v: f64| format!("{v:.1} %");
    let signed = |v: f64| format!("{v:+.1} %");
    for (name, s) in sets {
        // a set with no cross-validated run (one model family) shows none, not a zero
        let judged = s.cross_validated.runs > 0;
        let cv = |cell: String| if judged { cell } else { "–".to_string() };
        t.add_row(vec![
            label(name, s.fitted),
            s.rows.to_string(),
            s.expressible.to_string(),
            s.predicted.to_string(),
            pct(s.raw.mean_abs_percent),
            pct(s.raw.max_abs_percent),
            signed(s.raw.bias_percent),
            cv(pct(s.cross_validated.mean_abs_percent)),
            cv(pct(s.cross_validated.max_abs_percent)),
            cv(signed(s.cross_validated.bias_percent)),
            if judged {
                format!(
                    "{:.0} / {:.0} %",
                    s.max_mfu_percent[0], s.max_mfu_percent[1]
                )
            } else {
                format!("{:.0} / – %", s.max_mfu_percent[0])
            },
        ]);
    }
    align_numbers(&mut t, 1);
    t
}

/// Per set, how many runs lie outside the range of the runs the runtime was fitted on, with
/// an example: its error there is an extrapolation's.
fn print_beyond(sets: &BTreeMap<String, SetReport>, runs: &[RunResult], tag: &str) {
    for (name, s) in sets.iter().filter(|(_, s)| s.beyond_fitted_runs > 0) {
        let example = runs
            .iter()
            .find(|run| &run.set == name && !run.beyond_fitted_runs.is_empty())
            .map(|run| run.beyond_fitted_runs.join(", "))
            .unwrap_or_default();
        println!(
            "{name}{tag}: {} of {} runs lie outside the fitted runs' range (e.g. {example})",
            s.beyond_fitted_runs, s.predicted
        );
    }
}

/// How many runs could not be planned, with the first one's reason.
fn print_unpredicted(runs: &[RunResult]) {
    let not: Vec<_> = runs.iter().filter(|x| x.not_predicted.is_some()).collect();
    if !not.is_empty() {
        println!(
            "not predicted: {} runs, e.g. line {}: {}",
            not.len(),
            not[0].line,
            not[0].not_predicted.as_deref().unwrap_or("")
        );
    }
}

/// The memory projection on the runs: per set, how many it says do not fit (they ran), and
/// its error on the peaks the runs reported. Silent where no set has either.
fn print_memory(sets: &BTreeMap<String, SetReport>) {
    let sets: Vec<_> = sets
        .iter()
        .filter(|(_, s)| s.projected_oom > 0 || s.memory.runs > 0)
        .collect();
    if sets.is_empty() {
        return;
    }
    println!("memory projection on the runs (each ran; a reported peak compared in its scope):");
    for (name, s) in sets {
        let measured = if s.memory.runs > 0 {
            format!(
                "{} reported a peak: {:.1} % mean |error|, max {:.1} %, bias {:+.1} %",
                s.memory.runs,
                s.memory.mean_abs_percent,
                s.memory.max_abs_percent,
                s.memory.bias_percent
            )
        } else {
            "none reported a peak".to_string()
        };
        println!(
            "  {name}: {} of {} projected not to fit (OOM); {measured}",
            s.projected_oom, s.predicted
        );
    }
}

/// A parameter value as printed: whole from 100, one decimal from 10, three below.
fn short(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
