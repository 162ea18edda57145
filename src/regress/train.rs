//! `stepcast train`: one model per (operator, phase, dtype) — and per role where a role's own
//! model beats the pooled one on the role's validation rows — chosen from a small grid of
//! forests and boosted ensembles by validation MAPE on a seeded 80/20 split, then refitted on
//! every row.

use rayon::prelude::*;

use super::boost::{BoostParams, Loss};
use super::forest::ForestParams;
use super::model::{
    Algorithm, DatasetRef, ModelKey, Recipe, TargetTransform, TrainedModel, Validation,
};
use super::split::{groups, split_groups, SplitKind, MIN_ROWS};
use crate::dataset::{Dataset, Measurement};
use crate::ops::features::{feature_names, features};
use crate::ops::Role;
use crate::stats;

/// How `train` chooses and fits recipes.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Seed of the validation split and the trees.
    pub seed: u64,
    /// Share of each group's rows held out to choose the recipe.
    pub validation_fraction: f64,
    /// Recipes every group tries.
    pub grid: Vec<Recipe>,
    /// Extra candidates for groups with at least `large_rows` training rows, where a model with
    /// more capacity pays off.
    pub large_grid: Vec<Recipe>,
    /// Rows from which a group counts as large.
    pub large_rows: usize,
    /// Tree nodes (7 bytes each on disk) all models of a cluster may hold; the cheapest
    /// downgrades (validation MAPE lost per node saved) are made until they fit.
    pub node_budget: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            seed: 0,
            validation_fraction: 0.2,
            grid: default_grid(),
            large_grid: large_grid(),
            large_rows: 5_000,
            // ≈ 6.3 MB of node arrays: under the 10 MB a cluster may ship, with its metadata
            node_budget: 900_000,
        }
    }
}

/// Deeper, longer boosting for large groups (tens of thousands of GEMM shapes).
pub fn large_grid() -> Vec<Recipe> {
    vec![Recipe {
        algorithm: Algorithm::GradientBoosting(BoostParams {
            trees: 500,
            learning_rate: 0.1,
            max_depth: 7,
            min_samples_leaf: 2,
            subsample: 0.8,
            loss: Loss::Squared,
        }),
        target: TargetTransform::LogOverRoofline,
    }]
}

/// The hyper-parameter grid: two forests and four boosted ensembles (squared and absolute loss,
/// shallow-and-many and deeper-and-fewer trees), all learning log(time / roofline time) — the
/// efficiency — so that outside the training range time keeps scaling with the work instead of
/// freezing at the edge's value (a tree is constant beyond its last split). Sized so a
/// cluster's models stay a few MB.
pub fn default_grid() -> Vec<Recipe> {
    let forests = [
        ForestParams {
            trees: 60,
            max_features: 0.5,
            min_samples_leaf: 1,
            max_depth: 30,
            max_leaves: 1024,
        },
        ForestParams {
            trees: 60,
            max_features: 1.0,
            min_samples_leaf: 2,
            max_depth: 30,
            max_leaves: 1024,
        },
    ];
    let boost = |trees, learning_rate, max_depth, loss| BoostParams {
        trees,
        learning_rate,
        max_depth,
        min_samples_leaf: 2,
        subsample: 0.8,
        loss,
    };
    let boosts = [
        boost(300, 0.1, 5, Loss::Squared),
        boost(500, 0.05, 4, Loss::Squared),
        boost(300, 0.1, 5, Loss::Absolute),
        boost(600, 0.1, 3, Loss::Absolute),
        boost(1000, 0.05, 3, Loss::Absolute),
        boost(800, 0.05, 5, Loss::Squared),
    ];
    let algorithms: Vec<Algorithm> = forests
        .into_iter()
        .map(Algorithm::RandomForest)
        .chain(boosts.into_iter().map(Algorithm::GradientBoosting))
        .collect();
    algorithms
        .into_iter()
        .map(|algorithm| Recipe {
            algorithm,
            target: TargetTransform::LogOverRoofline,
        })
        .collect()
}

/// Features and targets of every usable row, computed once.
pub struct Prepared<'a> {
    /// The dataset's usable rows.
    pub rows: Vec<&'a Measurement>,
    /// Their feature rows.
    pub x: Vec<Vec<f64>>,
    /// Their ln(time).
    pub ln_time: Vec<f64>,
    dataset: &'a Dataset,
}

impl<'a> Prepared<'a> {
    /// Features and targets of every usable row of `dataset`.
    pub fn new(dataset: &'a Dataset) -> Prepared<'a> {
        let rows: Vec<&Measurement> = dataset.ok_rows().collect();
        let gpu = &dataset.meta.gpu;
        let x = rows
            .iter()
            .map(|m| features(m.query.op, &m.query.shape, m.query.dtype, gpu.sm_count))
            .collect();
        let ln_time = rows.iter().map(|m| m.time_us.ln()).collect();
        Prepared {
            rows,
            x,
            ln_time,
            dataset,
        }
    }

    /// Fits `recipe` on `train` and returns ln(predicted time) for `predict`.
    pub fn fit_predict(
        &self,
        recipe: &Recipe,
        train: &[usize],
        predict: &[usize],
        seed: u64,
    ) -> (Vec<f64>, usize) {
        let gpu = &self.dataset.meta.gpu;
        let x: Vec<Vec<f64>> = train.iter().map(|&i| self.x[i].clone()).collect();
        let y: Vec<f64> = train
            .iter()
            .map(|&i| self.ln_time[i] - recipe.offset(&self.rows[i].query, gpu))
            .collect();
        let forest = recipe.fit(&x, &y, seed);
        let out = predict
            .iter()
            .map(|&i| forest.predict(&self.x[i]) + recipe.offset(&self.rows[i].query, gpu))
            .collect();
        (out, forest.node_count())
    }

    /// Measured µs of rows `idx`.
    pub fn times(&self, idx: &[usize]) -> Vec<f64> {
        idx.iter().map(|&i| self.rows[i].time_us).collect()
    }
}

/// The distinct collective layouts among `rows` (empty for other operators).
fn layouts_of<'a>(rows: impl Iterator<Item = &'a Measurement>) -> Vec<[u64; 2]> {
    let mut out: Vec<[u64; 2]> = rows
        .filter_map(|m| {
            m.query
                .shape
                .collective()
                .map(|c| [c.nodes, c.gpus_per_node])
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Validation metrics of ln-predictions against measured rows.
pub fn validation_of(prepared: &Prepared, rows: &[usize], ln_pred: &[f64]) -> Validation {
    let actual = prepared.times(rows);
    let predicted: Vec<f64> = ln_pred.iter().map(|p| p.exp()).collect();
    let ape = stats::ape(&actual, &predicted);
    let residuals: Vec<f64> = rows
        .iter()
        .zip(ln_pred)
        .map(|(&i, p)| prepared.ln_time[i] - p)
        .collect();
    let mean_r = stats::mean(&residuals);
    let sigma = (residuals.iter().map(|r| (r - mean_r).powi(2)).sum::<f64>()
        / residuals.len().max(1) as f64)
        .sqrt();
    Validation {
        rows: rows.len(),
        mape_percent: stats::mean(&ape),
        p90_ape_percent: stats::percentile(&ape, 90.0).unwrap_or(f64::NAN),
        log_residual_p10: stats::percentile(&residuals, 10.0).unwrap_or(0.0),
        log_residual_p90: stats::percentile(&residuals, 90.0).unwrap_or(0.0),
        sigma_log: sigma,
    }
}

/// One grid candidate's result on its group's validation rows.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Index of the group.
    pub group: usize,
    /// The recipe tried.
    pub recipe: Recipe,
    /// Its ln(time) predictions on the group's validation rows.
    pub ln_pred: Vec<f64>,
    /// Its validation error, %.
    pub mape_percent: f64,
    /// Nodes of its trees (what it costs on disk).
    pub nodes: usize,
}

/// What training produced.
pub struct Outcome {
    /// One model per group trained.
    pub models: Vec<TrainedModel>,
    /// Groups that could not be trained, and why.
    pub skipped: Vec<(ModelKey, String)>,
    /// Per-role groups served by the pooled model: (role key, its own best MAPE, pooled MAPE).
    pub pooled_roles: Vec<(ModelKey, f64, f64)>,
    /// Every grid candidate: (group key, recipe, validation MAPE, tree nodes, chosen).
    pub grid: Vec<(ModelKey, Recipe, f64, usize, bool)>,
}

/// Swaps kept groups to smaller candidates until their nodes fit `budget`, each time making
/// the swap that loses the least validation MAPE per node saved.
fn fit_budget<'a>(
    best: &mut [&'a Candidate],
    per_group: &[Vec<&'a Candidate>],
    keep: &[bool],
    budget: usize,
) {
    loop {
        let total: usize = (0..best.len())
            .filter(|&g| keep[g])
            .map(|g| best[g].nodes)
            .sum();
        if total <= budget {
            return;
        }
        let swap = (0..best.len())
            .filter(|&g| keep[g])
            .flat_map(|g| {
                let current = best[g];
                per_group[g]
                    .iter()
                    .filter(move |c| c.nodes < current.nodes)
                    .map(move |c| {
                        let cost = (c.mape_percent - current.mape_percent).max(0.0)
                            / (current.nodes - c.nodes) as f64;
                        (cost, g, *c)
                    })
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match swap {
            Some((_, g, c)) => best[g] = c,
            None => return, // every group is at its smallest candidate
        }
    }
}

/// Number of fits `train` runs (for a progress bar): grid candidates plus refits.
pub fn task_count(dataset: &Dataset, options: &TrainOptions) -> usize {
    let rows: Vec<&Measurement> = dataset.ok_rows().collect();
    groups(&rows)
        .iter()
        .filter(|g| g.rows.len() >= MIN_ROWS)
        .map(|g| {
            options.grid.len()
                + 1
                + options.large_grid.len() * is_large(g.rows.len(), options) as usize
        })
        .sum()
}

fn is_large(rows: usize, options: &TrainOptions) -> bool {
    (rows as f64 * (1.0 - options.validation_fraction)) as usize >= options.large_rows
}

/// Trains one model per (operator, phase, data type, role) group of `dataset`; `tick` is called after each fit.
pub fn train(dataset: &Dataset, options: &TrainOptions, tick: &(dyn Fn() + Sync)) -> Outcome {
    let prepared = Prepared::new(dataset);
    let mut skipped = Vec::new();
    let (usable, too_small) = split_groups(
        groups(&prepared.rows),
        SplitKind::Random,
        &prepared.rows,
        options.validation_fraction,
        options.seed,
    );
    for g in too_small {
        skipped.push((
            g.key,
            format!("only {} rows (at least {MIN_ROWS} needed)", g.rows.len()),
        ));
    }

    let tasks: Vec<(usize, Recipe)> = usable
        .iter()
        .enumerate()
        .flat_map(|(gi, (_, train, _))| {
            let large = train.len() >= options.large_rows;
            options
                .grid
                .iter()
                .chain(options.large_grid.iter().filter(move |_| large))
                .map(move |r| (gi, *r))
        })
        .collect();
    let candidates: Vec<Candidate> = tasks
        .par_iter()
        .map(|&(gi, recipe)| {
            let (_, train, val) = &usable[gi];
            let (ln_pred, nodes) = prepared.fit_predict(&recipe, train, val, options.seed);
            let actual = prepared.times(val);
            let predicted: Vec<f64> = ln_pred.iter().map(|p| p.exp()).collect();
            tick();
            Candidate {
                group: gi,
                recipe,
                mape_percent: stats::mape(&actual, &predicted),
                ln_pred,
                nodes,
            }
        })
        .collect();

    // best per group: lowest MAPE; within 1 % (relative) of it, the smallest model
    let per_group: Vec<Vec<&Candidate>> = (0..usable.len())
        .map(|gi| candidates.iter().filter(|c| c.group == gi).collect())
        .collect();
    let mut best: Vec<&Candidate> = per_group
        .iter()
        .map(|mine| {
            let lowest = mine
                .iter()
                .map(|c| c.mape_percent)
                .fold(f64::INFINITY, f64::min);
            *mine
                .iter()
                .filter(|c| c.mape_percent <= lowest * 1.01)
                .min_by_key(|c| c.nodes)
                .expect("grid is not empty")
        })
        .collect();

    // roles served by the pooled model where it is at least as good on the role's rows
    let mut keep = vec![true; usable.len()];
    let mut serves: Vec<Vec<Role>> = vec![Vec::new(); usable.len()];
    let mut pooled_roles = Vec::new();
    for (ri, (g, _, rval)) in usable.iter().enumerate() {
        let Some(role) = g.key.role else { continue };
        if role.is_another_kernel() {
            continue;
        }
        let Some(pi) = usable.iter().position(|(p, _, _)| p.key == g.key.pooled()) else {
            continue;
        };
        let (_, _, pval) = &usable[pi];
        let pos: Vec<usize> = rval
            .iter()
            .map(|r| {
                pval.binary_search(r)
                    .expect("role rows are in the pooled split")
            })
            .collect();
        let pooled_pred: Vec<f64> = pos.iter().map(|&p| best[pi].ln_pred[p].exp()).collect();
        let pooled_mape = stats::mape(&prepared.times(rval), &pooled_pred);
        if pooled_mape <= best[ri].mape_percent {
            keep[ri] = false;
            serves[pi].push(role);
            pooled_roles.push((g.key, best[ri].mape_percent, pooled_mape));
        }
    }

    fit_budget(&mut best, &per_group, &keep, options.node_budget);

    let gpu = &dataset.meta.gpu;
    let dataset_ref = DatasetRef {
        name: dataset.meta.name.clone(),
        fingerprint: dataset.fingerprint.clone(),
        collected_at: dataset.meta.collected_at.clone(),
        source: dataset.meta.source.clone(),
        software: dataset.meta.software.clone(),
    };
    let models: Vec<TrainedModel> = (0..usable.len())
        .into_par_iter()
        .filter(|&gi| {
            if !keep[gi] {
                tick();
            }
            keep[gi]
        })
        .map(|gi| {
            let (g, _, val) = &usable[gi];
            let chosen = best[gi];
            let x: Vec<Vec<f64>> = g.rows.iter().map(|&i| prepared.x[i].clone()).collect();
            let y: Vec<f64> = g
                .rows
                .iter()
                .map(|&i| prepared.ln_time[i] - chosen.recipe.offset(&prepared.rows[i].query, gpu))
                .collect();
            let forest = chosen.recipe.fit(&x, &y, options.seed);
            let names = feature_names(g.key.op.family());
            let ranges = (0..names.len())
                .map(|f| {
                    let (lo, hi) = x
                        .iter()
                        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
                            (lo.min(r[f]), hi.max(r[f]))
                        });
                    [lo, hi]
                })
                .collect();
            tick();
            let mut model = TrainedModel {
                key: g.key,
                recipe: chosen.recipe,
                serves_roles: serves[gi].clone(),
                feature_names: names.iter().map(|s| s.to_string()).collect(),
                feature_ranges: ranges,
                training_rows: g.rows.len(),
                layouts: layouts_of(g.rows.iter().map(|&i| prepared.rows[i])),
                validation: validation_of(&prepared, val, &chosen.ln_pred),
                gpu: gpu.clone(),
                dataset: dataset_ref.clone(),
                forest,
                probes_us: Vec::new(),
            };
            model.probes_us = model.evaluate_probes(&model.probe_shapes());
            model
        })
        .collect();
    let grid = candidates
        .iter()
        .map(|c| {
            let chosen = std::ptr::eq(c, best[c.group]);
            (
                usable[c.group].0.key,
                c.recipe,
                c.mape_percent,
                c.nodes,
                chosen,
            )
        })
        .collect();
    Outcome {
        models,
        skipped,
        pooled_roles,
        grid,
    }
}
