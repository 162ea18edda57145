//! `stepcast eval`: the error of a models directory on a dataset, per (operator, phase, role)
//! and, for collectives, per layout — beside the roofline baseline and any published error.
//!
//! With a split, each saved model's recipe is refitted on the split's training rows and judged
//! on its held-out rows (the saved models were refitted on all rows, so judging them on their
//! own data would be in-sample). `SplitKind::None` judges the saved models as they are, for a
//! dataset they were not trained on.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use super::model::ModelKey;
use super::modelset::ModelSet;
use super::split::{groups, split_groups, SplitKind};
use super::train::Prepared;
use crate::analytic::roofline::ideal_time_us;
use crate::dataset::{Dataset, ReferenceError};
use crate::error::{Error, Result};
use crate::ops::{Dtype, OpKind, Phase, Role};
use crate::stats;

/// How `evaluate` judges a models directory.
#[derive(Debug, Clone, Copy)]
pub struct EvalOptions {
    /// Which rows are held out (and the recipes refitted without them).
    pub split: SplitKind,
    /// Seed of the random split.
    pub seed: u64,
    /// Share of rows held out by the random split.
    pub fraction: f64,
}

/// A published error quoted beside ours.
#[derive(Debug, Clone, Serialize)]
pub struct Reference {
    /// The published operator name.
    pub label: String,
    /// The published regressor.
    pub regressor: String,
    /// The published mean absolute percentage error.
    pub mape_percent: f64,
}

/// The error on one operator (and phase, data type, role, collective layout).
#[derive(Debug, Clone, Serialize)]
pub struct EvalRow {
    /// Operator kind.
    pub op: OpKind,
    /// Phase.
    pub phase: Phase,
    /// Data type.
    pub dtype: Dtype,
    /// Role, where the rows have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Collectives: [nodes, GPUs per node]; absent = all layouts together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<[u64; 2]>,
    /// Collectives: the message sizes (bytes) this row covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_range: Option<[u64; 2]>,
    /// The model that answered.
    pub model: String,
    /// Rows judged.
    pub rows: usize,
    /// Mean absolute percentage error, %.
    pub mape_percent: f64,
    /// 90th percentile of the absolute percentage error, %.
    pub p90_ape_percent: f64,
    /// The same for the roofline (analytic) time.
    pub roofline_mape_percent: Option<f64>,
    /// The 90th percentile for the roofline time.
    pub roofline_p90_ape_percent: Option<f64>,
    /// The published error of the paper's tool, where there is one.
    pub reference: Option<Reference>,
    /// Share of predictions with a feature outside the model's training range.
    pub out_of_coverage_percent: f64,
}

/// Every row's error.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// The split used.
    pub split: String,
    /// The dataset judged on.
    pub dataset: String,
    /// The models directory judged.
    pub models: String,
    /// One row per operator group.
    pub rows: Vec<EvalRow>,
    /// Operator groups of the dataset no model could be evaluated on, and why.
    pub not_evaluated: Vec<String>,
}

/// One prediction of a held-out row.
#[derive(Debug, Clone)]
struct Predicted {
    ln_time: f64,
    out_of_coverage: bool,
    model: ModelKey,
}

/// Judges `set` on `dataset` (see the module docs for the splits).
pub fn evaluate(set: &ModelSet, dataset: &Dataset, options: &EvalOptions) -> Result<EvalReport> {
    evaluate_watched(set, dataset, options, &crate::progress::Unwatched)
}

/// `evaluate`, telling `progress` how many models it refits on the split and each one done.
pub fn evaluate_watched(
    set: &ModelSet,
    dataset: &Dataset,
    options: &EvalOptions,
    progress: &dyn crate::progress::Progress,
) -> Result<EvalReport> {
    let prepared = Prepared::new(dataset);
    let n = prepared.rows.len();
    let mut predicted: Vec<Option<Predicted>> = vec![None; n];
    let mut not_evaluated = Vec::new();

    if options.split == SplitKind::None {
        // models of another GPU predict this one's rows scaled by the ratio of the rooflines
        let here = &dataset.meta.gpu;
        let transfer = set.gpu().name != here.name;
        for (i, m) in prepared.rows.iter().enumerate() {
            if let Some((model, _)) = set.lookup(&m.query)? {
                let p = model.predict(&m.query);
                let scale = if transfer {
                    let roofline = |g| crate::analytic::roofline::device_time_us(&m.query, g);
                    match (roofline(here), roofline(set.gpu())) {
                        (Some(a), Some(b)) if b > 0.0 => a / b,
                        _ => 1.0,
                    }
                } else {
                    1.0
                };
                predicted[i] = Some(Predicted {
                    ln_time: (p.time_us * scale).ln(),
                    out_of_coverage: !p.out_of_coverage.is_empty(),
                    model: model.key,
                });
            }
        }
    } else {
        let (split, too_small) = split_groups(
            groups(&prepared.rows),
            options.split,
            &prepared.rows,
            options.fraction,
            options.seed,
        );
        let jobs: Vec<_> = set
            .models()
            .filter_map(|model| {
                let found = split.iter().find(|(g, _, _)| g.key == model.key);
                if found.is_none() {
                    let why = if too_small.iter().any(|g| g.key == model.key) {
                        "this split leaves nothing to train on or to hold out"
                    } else {
                        "no rows of it in this dataset"
                    };
                    not_evaluated.push(format!("{}: {why}", model.key));
                }
                found.map(|s| (model, s))
            })
            .collect();
        progress.start("refits", jobs.len() as u64);
        let results: Vec<Vec<(usize, Predicted)>> = jobs
            .par_iter()
            .map(|(model, (_, train, held))| {
                // a pooled model answers the held-out rows of roles that have no model of their own
                let answered: Vec<usize> = held
                    .iter()
                    .copied()
                    .filter(|&i| match (model.key.role, prepared.rows[i].query.role) {
                        (Some(_), _) | (None, None) => true,
                        (None, Some(role)) => set
                            .get(&ModelKey {
                                role: Some(role),
                                ..model.key
                            })
                            .is_none(),
                    })
                    .collect();
                let (ln_pred, _) =
                    prepared.fit_predict(&model.recipe, train, &answered, options.seed);
                let ranges = ranges(train.iter().map(|&i| &prepared.x[i]));
                progress.advance();
                answered
                    .iter()
                    .zip(ln_pred)
                    .map(|(&i, ln_time)| {
                        let ooc = prepared.x[i]
                            .iter()
                            .zip(&ranges)
                            .any(|(v, [lo, hi])| v < lo || v > hi);
                        (
                            i,
                            Predicted {
                                ln_time,
                                out_of_coverage: ooc,
                                model: model.key,
                            },
                        )
                    })
                    .collect()
            })
            .collect();
        for (i, p) in results.into_iter().flatten() {
            predicted[i] = Some(p);
        }
    }

    let rows = report_rows(&prepared, &predicted, dataset);
    if rows.is_empty() {
        return Err(Error::Empty(format!(
            "no row of {} could be predicted by the models in {} (different operators or dtypes?)",
            dataset.dir.display(),
            set.dir.display()
        )));
    }
    Ok(EvalReport {
        split: format!("{:?}", options.split),
        dataset: dataset.dir.display().to_string(),
        models: set.dir.display().to_string(),
        rows,
        not_evaluated,
    })
}

fn ranges<'a>(rows: impl Iterator<Item = &'a Vec<f64>>) -> Vec<[f64; 2]> {
    let mut out: Vec<[f64; 2]> = Vec::new();
    for r in rows {
        if out.is_empty() {
            out = r.iter().map(|&v| [v, v]).collect();
        }
        for (slot, &v) in out.iter_mut().zip(r) {
            slot[0] = slot[0].min(v);
            slot[1] = slot[1].max(v);
        }
    }
    out
}

/// What one report row covers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RowKey {
    op: OpKind,
    phase: Phase,
    dtype: Dtype,
    role: Option<Role>,
    layout: Option<[u64; 2]>,
}

fn report_rows(prepared: &Prepared, predicted: &[Option<Predicted>], ds: &Dataset) -> Vec<EvalRow> {
    let mut by_key: BTreeMap<RowKey, Vec<usize>> = BTreeMap::new();
    for (i, p) in predicted.iter().enumerate() {
        if p.is_none() {
            continue;
        }
        let q = &prepared.rows[i].query;
        let layout = q.shape.collective().map(|c| [c.nodes, c.gpus_per_node]);
        by_key
            .entry(RowKey {
                op: q.op,
                phase: q.phase,
                dtype: q.dtype,
                role: q.role,
                layout,
            })
            .or_default()
            .push(i);
    }
    let refs = &ds.meta.reference_errors;
    let mut out = Vec::new();
    for (key, idx) in &by_key {
        let matching: Vec<&ReferenceError> = refs
            .iter()
            .filter(|r| {
                r.op == key.op
                    && r.phase == key.phase
                    && r.role == key.role
                    && match key.layout {
                        None => r.nodes.is_none(),
                        Some([n, g]) => r.nodes == Some(n) && r.gpus_per_node == Some(g),
                    }
            })
            .collect();
        if key.layout.is_some() && !matching.is_empty() {
            // one row per published size range (e.g. the paper's allreduce and allreduce_large)
            for r in matching {
                let within = in_range(prepared, idx, r.bytes_range);
                if let Some(row) = metrics(prepared, predicted, ds, key, &within, Some(r)) {
                    out.push(row);
                }
            }
        } else {
            out.extend(metrics(
                prepared,
                predicted,
                ds,
                key,
                idx,
                matching.first().copied(),
            ));
        }
    }
    // the paper's models over all layouts, where it published one
    for r in refs
        .iter()
        .filter(|r| r.op.is_collective() && r.nodes.unwrap_or(0) == 0)
    {
        let idx: Vec<usize> = by_key
            .iter()
            .filter(|(k, _)| k.op == r.op)
            .flat_map(|(_, v)| v.iter().copied())
            .collect();
        let within = in_range(prepared, &idx, r.bytes_range);
        if let Some(first) = within.first() {
            let q = &prepared.rows[*first].query;
            let key = RowKey {
                op: q.op,
                phase: q.phase,
                dtype: q.dtype,
                role: None,
                layout: None,
            };
            out.extend(metrics(prepared, predicted, ds, &key, &within, Some(r)));
        }
    }
    out
}

fn in_range(prepared: &Prepared, idx: &[usize], range: Option<[u64; 2]>) -> Vec<usize> {
    idx.iter()
        .copied()
        .filter(
            |&i| match (range, prepared.rows[i].query.shape.collective()) {
                (Some([lo, hi]), Some(c)) => c.bytes >= lo && c.bytes <= hi,
                _ => true,
            },
        )
        .collect()
}

fn metrics(
    prepared: &Prepared,
    predicted: &[Option<Predicted>],
    ds: &Dataset,
    key: &RowKey,
    idx: &[usize],
    reference: Option<&ReferenceError>,
) -> Option<EvalRow> {
    if idx.is_empty() {
        return None;
    }
    let actual = prepared.times(idx);
    let preds: Vec<&Predicted> = idx
        .iter()
        .map(|&i| predicted[i].as_ref().unwrap())
        .collect();
    let ours: Vec<f64> = preds.iter().map(|p| p.ln_time.exp()).collect();
    let ape = stats::ape(&actual, &ours);
    let roof: Option<Vec<f64>> = idx
        .iter()
        .map(|&i| {
            ideal_time_us(
                &prepared.rows[i].query,
                &ds.meta.gpu,
                ds.meta.network.as_ref(),
            )
        })
        .collect();
    let roof_ape = roof.map(|r| stats::ape(&actual, &r));
    let mut models: Vec<String> = preds.iter().map(|p| p.model.to_string()).collect();
    models.sort();
    models.dedup();
    let ooc = preds.iter().filter(|p| p.out_of_coverage).count();
    Some(EvalRow {
        op: key.op,
        phase: key.phase,
        dtype: key.dtype,
        role: key.role,
        layout: key.layout,
        bytes_range: reference.and_then(|r| r.bytes_range),
        model: models.join(", "),
        rows: idx.len(),
        mape_percent: stats::mean(&ape),
        p90_ape_percent: stats::percentile(&ape, 90.0).unwrap_or(f64::NAN),
        roofline_mape_percent: roof_ape.as_ref().map(|a| stats::mean(a)),
        roofline_p90_ape_percent: roof_ape.as_ref().and_then(|a| stats::percentile(a, 90.0)),
        reference: reference.map(|r| Reference {
            label: r.label.clone(),
            regressor: r.regressor.clone(),
            mape_percent: r.mape_percent,
        }),
        out_of_coverage_percent: 100.0 * ooc as f64 / idx.len() as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{self, dataset, measured, tokens};
    use super::*;
    use crate::analytic::roofline::device_time_us;
    use crate::dataset::Measurement;
    use crate::hardware::GpuSpec;
    use crate::ops::{CollectiveShape, OpQuery, Shape};

    /// The paper's A100 models: per-role GEMM models beside a pooled one (which also answers
    /// the context GEMM), LayerNorm and collective models.
    fn a100_models() -> ModelSet {
        ModelSet::builtin("perlmutter").unwrap()
    }

    fn gemm(role: Role, m: u64, n: u64, k: u64) -> OpQuery {
        testing::gemm(Some(role), m, n, k)
    }

    fn all_reduce(bytes: u64, nodes: u64, gpus_per_node: u64) -> OpQuery {
        OpQuery {
            op: OpKind::AllReduce,
            phase: Phase::None,
            dtype: Dtype::Fp16,
            role: None,
            shape: Shape::Collective(CollectiveShape {
                bytes,
                nodes,
                gpus_per_node,
            }),
        }
    }

    /// 48 LayerNorm shapes (widths 1,024–8,192), each measured at 1.66–1.8× its roofline on
    /// `gpu`, rising with the width (a smooth efficiency a refit can learn).
    fn layernorms(gpu: &GpuSpec) -> Vec<Measurement> {
        let mut out = Vec::new();
        for batch in [1, 2, 4] {
            for seq in [512, 1024, 2048, 4096] {
                for width in [1024, 2048, 4096, 8192] {
                    let q = tokens(OpKind::LayerNorm, batch, seq, width);
                    let slowdown = 1.2 + 0.6 * (width as f64).log2() / 13.0;
                    out.push(measured(q, device_time_us(&q, gpu).unwrap() * slowdown));
                }
            }
        }
        out
    }

    fn judge(set: &ModelSet, ds: &Dataset, split: SplitKind) -> EvalReport {
        let options = EvalOptions {
            split,
            seed: 7,
            fraction: 0.25,
        };
        evaluate(set, ds, &options).unwrap()
    }

    fn row(report: &EvalReport, op: OpKind, role: Option<Role>) -> &EvalRow {
        let found: Vec<&EvalRow> = report
            .rows
            .iter()
            .filter(|r| r.op == op && r.role == role && r.layout.is_none())
            .collect();
        assert_eq!(found.len(), 1, "{op} {role:?}: {:?}", report.rows);
        found[0]
    }

    /// Mean and 90th percentile of |predicted − measured| / measured, in percent, by hand.
    fn errors(pairs: &[(f64, f64)]) -> (f64, f64) {
        let mut ape: Vec<f64> = pairs
            .iter()
            .map(|(p, a)| 100.0 * (p - a).abs() / a)
            .collect();
        let mean = ape.iter().sum::<f64>() / ape.len() as f64;
        ape.sort_by(f64::total_cmp);
        let rank = 0.9 * (ape.len() - 1) as f64;
        let (lo, frac) = (rank.floor() as usize, rank.fract());
        let p90 = ape[lo] * (1.0 - frac) + ape[(lo + 1).min(ape.len() - 1)] * frac;
        (mean, p90)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// Without a split the saved models answer every row as they are: each report row's error
    /// is that of the model `lookup` picks, its roofline error beside it, the model named, and
    /// its coverage counted.
    #[test]
    fn the_saved_models_judge_every_row_when_nothing_is_held_out() {
        let set = a100_models();
        let gpu = set.gpu().clone();
        let mut rows = layernorms(&gpu);
        for (m, factor) in [(1024, 1.3), (2048, 1.6), (4096, 1.1), (8192, 2.0)] {
            for role in [Role::Qkv, Role::AttnContext] {
                let q = gemm(role, m, 3 * 2048, 2048);
                rows.push(measured(q, device_time_us(&q, &gpu).unwrap() * factor));
            }
        }
        let ds = dataset(&gpu, rows.clone());
        let report = judge(&set, &ds, SplitKind::None);
        assert_eq!(report.rows.len(), 3, "{:?}", report.rows);
        assert_eq!(report.split, "None");
        assert!(report.not_evaluated.is_empty());

        for (op, role, model) in [
            (OpKind::LayerNorm, None, "layernorm fwd fp16"),
            // the QKV model answers inside its range, the pooled one the smallest shapes
            (
                OpKind::Gemm,
                Some(Role::Qkv),
                "gemm fwd fp16, gemm fwd fp16 qkv",
            ),
            // the context GEMM has no model of its own: the pooled one answers
            (OpKind::Gemm, Some(Role::AttnContext), "gemm fwd fp16"),
        ] {
            let mine: Vec<&Measurement> = rows
                .iter()
                .filter(|m| m.query.op == op && m.query.role == role)
                .collect();
            let predicted: Vec<_> = mine
                .iter()
                .map(|m| set.lookup(&m.query).unwrap().unwrap().0.predict(&m.query))
                .collect();
            let pairs: Vec<(f64, f64)> = predicted
                .iter()
                .zip(&mine)
                .map(|(p, m)| (p.time_us, m.time_us))
                .collect();
            let roofline: Vec<(f64, f64)> = mine
                .iter()
                .map(|m| (device_time_us(&m.query, &gpu).unwrap(), m.time_us))
                .collect();
            let outside = predicted
                .iter()
                .filter(|p| !p.out_of_coverage.is_empty())
                .count();
            let r = row(&report, op, role);
            let (mean, p90) = errors(&pairs);
            let (roof_mean, roof_p90) = errors(&roofline);
            assert_eq!((r.rows, r.model.as_str()), (mine.len(), model));
            assert!(close(r.mape_percent, mean), "{} {mean}", r.mape_percent);
            assert!(close(r.p90_ape_percent, p90), "{} {p90}", r.p90_ape_percent);
            assert!(close(r.roofline_mape_percent.unwrap(), roof_mean));
            assert!(close(r.roofline_p90_ape_percent.unwrap(), roof_p90));
            let share = 100.0 * outside as f64 / mine.len() as f64;
            assert!(close(r.out_of_coverage_percent, share), "{op}");
            assert!(r.reference.is_none() && r.bytes_range.is_none());
        }
        // the smallest LayerNorms lie below what the paper measured
        assert!(row(&report, OpKind::LayerNorm, None).out_of_coverage_percent > 0.0);
    }

    /// Models of another GPU scale each kernel's prediction by the ratio of the two GPUs'
    /// rooflines; a collective, which has no device roofline, is taken as it is.
    #[test]
    fn models_of_another_gpu_answer_scaled_by_the_roofline_ratio() {
        let set = a100_models();
        let h100 = GpuSpec::builtin("h100").unwrap();
        let queries: Vec<OpQuery> = [1024, 2048, 4096, 8192]
            .into_iter()
            .map(|w| tokens(OpKind::LayerNorm, 2, 1024, w))
            .chain([all_reduce(1 << 24, 1, 4), all_reduce(1 << 26, 1, 4)])
            .collect();
        let a100_time = |q: &OpQuery| set.lookup(q).unwrap().unwrap().0.predict(q).time_us;
        let ratio = |q: &OpQuery| {
            device_time_us(q, &h100).map_or(1.0, |h| h / device_time_us(q, set.gpu()).unwrap())
        };
        // measured at exactly what the transfer predicts: no error
        let exact = queries
            .iter()
            .map(|q| measured(*q, a100_time(q) * ratio(q)))
            .collect();
        let report = judge(&set, &dataset(&h100, exact), SplitKind::None);
        assert!(row(&report, OpKind::LayerNorm, None).mape_percent < 1e-9);
        let ar = report
            .rows
            .iter()
            .find(|r| r.op == OpKind::AllReduce)
            .unwrap();
        assert!(ar.mape_percent < 1e-9 && ar.layout == Some([1, 4]));

        // the same times judged as A100 rows: every LayerNorm off by the ratio, which is
        // HBM bandwidth's (2,039 over 3,350 GB/s) for a memory-bound kernel
        let scaled = queries
            .iter()
            .map(|q| measured(*q, a100_time(q) * ratio(q)))
            .collect();
        let report = judge(&set, &dataset(set.gpu(), scaled), SplitKind::None);
        let ln = row(&report, OpKind::LayerNorm, None);
        let r = ratio(&queries[3]);
        assert!((r - 2039.0 / 3350.0).abs() < 0.01, "{r}");
        assert!(
            (ln.mape_percent - 100.0 * (1.0 / r - 1.0)).abs() < 1.0,
            "{}",
            ln.mape_percent
        );
    }

    /// A random split refits each model's recipe on a group's kept rows and judges the rest:
    /// the report's error is that of an independent refit on the same split, on the held-out
    /// rows only; models with no rows here are listed as not evaluated.
    #[test]
    fn a_split_refits_the_recipes_and_judges_the_held_out_rows() {
        let set = a100_models();
        let ds = dataset(set.gpu(), layernorms(set.gpu()));
        let report = judge(&set, &ds, SplitKind::Random);
        assert_eq!(report.split, "Random");
        assert_eq!(report.rows.len(), 1, "{:?}", report.rows);

        let prepared = Prepared::new(&ds);
        let all: Vec<usize> = (0..prepared.rows.len()).collect();
        let (train, held) = super::super::split::random_split(&all, 0.25, 7);
        assert_eq!(held.len(), 12);
        let model = set
            .get(&ModelKey::of(&tokens(OpKind::LayerNorm, 1, 1, 1)))
            .unwrap();
        let (ln_pred, _) = prepared.fit_predict(&model.recipe, &train, &held, 7);
        let pairs: Vec<(f64, f64)> = ln_pred
            .iter()
            .zip(&held)
            .map(|(p, &i)| (p.exp(), prepared.rows[i].time_us))
            .collect();
        let (mean, p90) = errors(&pairs);
        let r = row(&report, OpKind::LayerNorm, None);
        assert_eq!(r.rows, held.len());
        assert!(close(r.mape_percent, mean), "{} {mean}", r.mape_percent);
        assert!(close(r.p90_ape_percent, p90));
        // out of coverage: a feature of the row beyond what the refit's rows span
        let outside = held
            .iter()
            .filter(|&&i| {
                prepared.x[i].iter().enumerate().any(|(f, v)| {
                    let seen = train.iter().map(|&t| prepared.x[t][f]);
                    seen.clone().all(|s| s > *v) || seen.into_iter().all(|s| s < *v)
                })
            })
            .count();
        assert!(outside > 0 && outside < held.len(), "{outside}");
        let share = 100.0 * outside as f64 / held.len() as f64;
        assert!(close(r.out_of_coverage_percent, share));
        // a refit on data this smooth: far better than the roofline, 40–44 % off
        assert!(r.mape_percent < 10.0 && r.roofline_mape_percent.unwrap() > 39.0);

        // every other model had nothing to refit on
        let others = set.models().count() - 1;
        assert_eq!(report.not_evaluated.len(), others);
        assert!(report
            .not_evaluated
            .contains(&"layernorm bwd fp16: no rows of it in this dataset".to_string()));
    }

    /// Holding out the largest width puts every held-out row outside what its refit saw; a
    /// group too small to split is named as such; a pooled model answers only the roles that
    /// have no model of their own.
    #[test]
    fn held_out_extremes_are_out_of_coverage_and_small_groups_are_named() {
        let set = a100_models();
        let gpu = set.gpu().clone();
        let mut rows = layernorms(&gpu);
        for width in [1024, 2048, 4096] {
            let q = tokens(OpKind::Gelu, 1, 1024, width);
            rows.push(measured(q, 2.0 * device_time_us(&q, &gpu).unwrap()));
        }
        let ds = dataset(&gpu, rows);
        let report = judge(&set, &ds, SplitKind::HoldoutLargestHidden);
        let r = row(&report, OpKind::LayerNorm, None);
        assert_eq!((r.rows, r.out_of_coverage_percent), (12, 100.0));
        assert!(report.not_evaluated.contains(
            &"gelu fwd fp16: this split leaves nothing to train on or to hold out".into()
        ));
        assert!(!report.rows.iter().any(|r| r.op == OpKind::Gelu));

        // the context GEMM's rows are held out of the pooled GEMM model's refit and answered by
        // it; the QKV rows by the QKV model's own refit
        let mut rows = Vec::new();
        for m in [512, 1024, 2048, 4096, 8192, 16384] {
            for (role, n) in [(Role::Qkv, 6144), (Role::AttnContext, 2048)] {
                let q = gemm(role, m, n, 2048);
                rows.push(measured(q, 1.5 * device_time_us(&q, &gpu).unwrap()));
            }
        }
        let report = judge(&set, &dataset(&gpu, rows), SplitKind::Random);
        let qkv = row(&report, OpKind::Gemm, Some(Role::Qkv));
        let context = row(&report, OpKind::Gemm, Some(Role::AttnContext));
        assert_eq!(qkv.model, "gemm fwd fp16 qkv");
        assert_eq!(context.model, "gemm fwd fp16");
        assert_eq!((qkv.rows, context.rows), (2, 2));
    }

    /// A published error is quoted on the row it describes: per size range for a collective
    /// layout (one row each, over the messages in that range), over every layout where the
    /// source fitted one model for all, and on an operator's row.
    #[test]
    fn published_errors_are_quoted_per_layout_size_range_and_operator() {
        let set = a100_models();
        let gpu = set.gpu().clone();
        let mut rows = layernorms(&gpu);
        for (nodes, gpn) in [(1, 4), (2, 4)] {
            for shift in 16..30 {
                let q = all_reduce(1 << shift, nodes, gpn);
                let t = set.lookup(&q).unwrap().unwrap().0.predict(&q).time_us;
                rows.push(measured(q, 1.1 * t));
            }
        }
        let mut ds = dataset(&gpu, rows);
        let reference = |label: &str, op, phase, layout: Option<[u64; 2]>, range| ReferenceError {
            label: label.into(),
            op,
            phase,
            role: None,
            nodes: layout.map(|[n, _]| n),
            gpus_per_node: layout.map(|[_, g]| g),
            bytes_range: range,
            regressor: "rforest".into(),
            mape_percent: 5.0,
        };
        ds.meta.reference_errors = vec![
            reference(
                "small",
                OpKind::AllReduce,
                Phase::None,
                Some([1, 4]),
                Some([0, 1 << 20]),
            ),
            reference(
                "large",
                OpKind::AllReduce,
                Phase::None,
                Some([1, 4]),
                Some([1 << 21, 1 << 40]),
            ),
            reference("every layout", OpKind::AllReduce, Phase::None, None, None),
            reference("layer_norm", OpKind::LayerNorm, Phase::Fwd, None, None),
        ];
        let report = judge(&set, &ds, SplitKind::None);
        let quoted = |label: &str| -> Vec<&EvalRow> {
            report
                .rows
                .iter()
                .filter(|r| r.reference.as_ref().is_some_and(|x| x.label == label))
                .collect()
        };
        let small = quoted("small");
        let large = quoted("large");
        // 2^16 … 2^20 and 2^21 … 2^29 bytes
        assert_eq!((small.len(), large.len()), (1, 1));
        assert_eq!((small[0].rows, large[0].rows), (5, 9));
        assert_eq!(small[0].layout, Some([1, 4]));
        assert_eq!(large[0].bytes_range, Some([1 << 21, 1 << 40]));
        assert!((small[0].mape_percent - 100.0 / 11.0).abs() < 1e-6);
        // the two-node layout has no published error: one row, nothing quoted
        let two: Vec<&EvalRow> = report
            .rows
            .iter()
            .filter(|r| r.layout == Some([2, 4]))
            .collect();
        assert_eq!(two.len(), 1);
        assert!(two[0].reference.is_none() && two[0].rows == 14);
        let every = quoted("every layout");
        assert_eq!(every.len(), 1);
        assert_eq!((every[0].layout, every[0].rows), (None, 28));
        let norm = quoted("layer_norm");
        assert_eq!(norm.len(), 1);
        assert_eq!((norm[0].op, norm[0].rows), (OpKind::LayerNorm, 48));
        assert_eq!(norm[0].reference.as_ref().unwrap().regressor, "rforest");
    }

    /// Rows no model answers are an error that says so, not an empty report.
    #[test]
    fn a_dataset_no_model_answers_is_refused() {
        let set = a100_models();
        let q = OpQuery {
            op: OpKind::AllToAll,
            ..all_reduce(1 << 20, 1, 4)
        };
        let ds = dataset(set.gpu(), vec![measured(q, 10.0)]);
        let options = EvalOptions {
            split: SplitKind::None,
            seed: 0,
            fraction: 0.2,
        };
        let err = evaluate(&set, &ds, &options).unwrap_err().to_string();
        assert!(
            err.contains("no row of unit-test could be predicted"),
            "{err}"
        );
    }

    #[test]
    fn ranges_span_every_row_per_feature() {
        let rows = [vec![1.0, 5.0], vec![3.0, -2.0], vec![2.0, 9.0]];
        assert_eq!(ranges(rows.iter()), vec![[1.0, 3.0], [-2.0, 9.0]]);
        assert!(ranges(std::iter::empty()).is_empty());
    }
}
