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
