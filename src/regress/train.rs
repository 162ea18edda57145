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

/// The candidate a group keeps: the lowest validation error or, within 1 % (relative) of it,
/// the smallest model.
fn near_best<'a>(mine: &[&'a Candidate]) -> &'a Candidate {
    let lowest = mine
        .iter()
        .map(|c| c.mape_percent)
        .fold(f64::INFINITY, f64::min);
    mine.iter()
        .filter(|c| c.mape_percent <= lowest * 1.01)
        .min_by_key(|c| c.nodes)
        .expect("grid is not empty")
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

    let per_group: Vec<Vec<&Candidate>> = (0..usable.len())
        .map(|gi| candidates.iter().filter(|c| c.group == gi).collect())
        .collect();
    let mut best: Vec<&Candidate> = per_group.iter().map(|mine| near_best(mine)).collect();

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
    let dataset_ref = DatasetRef::of(dataset);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::testing::{self, dataset, measured};
    use super::*;
    use crate::analytic::roofline::device_time_us;
    use crate::hardware::GpuSpec;
    use crate::ops::{Dtype, OpKind, OpQuery, Phase, Shape};

    fn gpu() -> GpuSpec {
        GpuSpec::builtin("a100").unwrap()
    }

    fn gemm(role: Role, m: u64) -> OpQuery {
        testing::gemm(Some(role), m, 4096, 4096)
    }

    fn norm(batch: u64, seq: u64, width: u64) -> OpQuery {
        testing::tokens(OpKind::LayerNorm, batch, seq, width)
    }

    /// 48 LayerNorms at 1.54–1.8× their roofline, 12 QKV GEMMs at 1.25×, 3 MLP GEMMs (too few
    /// for a model of their own).
    fn rows() -> Vec<crate::dataset::Measurement> {
        let gpu = gpu();
        let at =
            |q: OpQuery, slowdown: f64| measured(q, device_time_us(&q, &gpu).unwrap() * slowdown);
        let mut out = Vec::new();
        for batch in [1, 2, 4] {
            for seq in [512, 1024, 2048, 4096] {
                for width in [1024, 2048, 4096, 8192] {
                    out.push(at(norm(batch, seq, width), 1.5 + 0.3 * seq as f64 / 4096.0));
                }
            }
        }
        out.extend((1..=12).map(|i| at(gemm(Role::Qkv, 512 * i), 1.25)));
        out.extend((1..=3).map(|i| at(gemm(Role::MlpUp, 512 * i), 1.25)));
        out
    }

    fn small_grid() -> Vec<Recipe> {
        let forest = |trees, min_samples_leaf| Recipe {
            algorithm: Algorithm::RandomForest(ForestParams {
                trees,
                max_features: 1.0,
                min_samples_leaf,
                max_depth: 8,
                max_leaves: 1000,
            }),
            target: TargetTransform::LogOverRoofline,
        };
        vec![forest(4, 1), forest(12, 2), forest(2, 8)]
    }

    fn options(node_budget: usize) -> TrainOptions {
        TrainOptions {
            seed: 3,
            grid: small_grid(),
            large_grid: Vec::new(),
            node_budget,
            ..TrainOptions::default()
        }
    }

    #[test]
    fn the_grids_try_forests_and_boosting_on_the_roofline_target() {
        let grid = default_grid();
        let large = large_grid();
        assert!(grid.len() >= 6 && !large.is_empty());
        for r in grid.iter().chain(&large) {
            assert_eq!(r.target, TargetTransform::LogOverRoofline);
        }
        let boosts = |g: &[Recipe]| {
            g.iter()
                .filter(|r| matches!(r.algorithm, Algorithm::GradientBoosting(_)))
                .count()
        };
        assert_eq!(boosts(&grid), 6);
        assert!(boosts(&grid) < grid.len());
        assert!(boosts(&large) > 0);
    }

    /// A group counts as large from `large_rows` training rows (its rows less the validation
    /// share), and then tries the large grid too; groups under `MIN_ROWS` are not fitted.
    #[test]
    fn the_task_count_is_each_trainable_groups_grid_and_its_refit() {
        let ds = dataset(&gpu(), rows());
        let mut o = options(usize::MAX);
        // layernorm (48), pooled GEMM (15), QKV (12); MLP up (3) too small
        assert_eq!(task_count(&ds, &o), 3 * (3 + 1));
        o.large_grid = large_grid();
        o.large_rows = 38; // 48 × 0.8 = 38.4: the norms only
        assert_eq!(task_count(&ds, &o), 3 * 4 + large_grid().len());
        o.large_rows = 39;
        assert_eq!(task_count(&ds, &o), 3 * 4);
        assert!(is_large(100, &o) && !is_large(48, &o));
        // training tries the large grid where the count says, and ticks once a task
        for (large_rows, large_fits) in [(38, 1), (39, 0)] {
            let o = TrainOptions {
                large_grid: small_grid()[..1].to_vec(),
                large_rows,
                ..options(usize::MAX)
            };
            let ticks = AtomicUsize::new(0);
            let outcome = train(&ds, &o, &|| {
                ticks.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(outcome.grid.len(), 9 + large_fits);
            assert_eq!(ticks.load(Ordering::Relaxed), task_count(&ds, &o));
        }
    }

    /// Each group keeps the candidate with the lowest validation error or, within 1 % of it,
    /// the smallest; the model is refitted on every row of its group with that recipe, its
    /// ranges and validation are its group's; the pooled model serves a role where it is at
    /// least as good on the role's rows; a group too small is skipped with its reason.
    #[test]
    fn training_keeps_the_best_or_smallest_near_best_candidate_per_group() {
        let ds = dataset(&gpu(), rows());
        let ticks = AtomicUsize::new(0);
        let o = options(usize::MAX);
        let outcome = train(&ds, &o, &|| {
            ticks.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ticks.load(Ordering::Relaxed), task_count(&ds, &o));
        let mlp = ModelKey::of(&gemm(Role::MlpUp, 512));
        assert_eq!(
            outcome.skipped,
            vec![(mlp, "only 3 rows (at least 5 needed)".to_string())]
        );
        assert_eq!(outcome.grid.len(), 9);
        let prepared = Prepared::new(&ds);
        for key in [
            ModelKey::of(&norm(1, 1, 1)),
            ModelKey::of(&gemm(Role::Qkv, 1)),
        ] {
            let mine: Vec<_> = outcome.grid.iter().filter(|g| g.0 == key).collect();
            assert_eq!(mine.len(), 3);
            let lowest = mine.iter().map(|g| g.2).fold(f64::INFINITY, f64::min);
            let smallest_near = mine
                .iter()
                .filter(|g| g.2 <= lowest * 1.01)
                .map(|g| g.3)
                .min()
                .unwrap();
            let chosen: Vec<_> = mine.iter().filter(|g| g.4).collect();
            assert_eq!(chosen.len(), 1, "{key}");
            assert_eq!(chosen[0].3, smallest_near, "{key}");
            let served = outcome.pooled_roles.iter().any(|p| p.0 == key);
            let model = outcome.models.iter().find(|m| m.key == key);
            assert_eq!(model.is_none(), served, "{key}");
            let Some(model) = model else { continue };
            assert_eq!(model.recipe, chosen[0].1);
            let rows: Vec<usize> = (0..prepared.rows.len())
                .filter(|&i| ModelKey::of(&prepared.rows[i].query) == key)
                .collect();
            assert_eq!(model.training_rows, rows.len());
            for (f, [lo, hi]) in model.feature_ranges.iter().enumerate() {
                let values = rows.iter().map(|&i| prepared.x[i][f]);
                assert_eq!(*lo, values.clone().fold(f64::INFINITY, f64::min));
                assert_eq!(*hi, values.fold(f64::NEG_INFINITY, f64::max));
            }
            assert_eq!(model.validation.rows, rows.len().div_ceil(5));
            assert!(model.validation.mape_percent < 15.0, "{key}");
            assert!(model.probes_us.is_empty() && model.layouts.is_empty());
            // the refit learned its rows' times (through the roofline target)
            let ape: Vec<f64> = rows
                .iter()
                .map(|&i| {
                    let m = prepared.rows[i];
                    (model.predict(&m.query).time_us / m.time_us - 1.0).abs()
                })
                .collect();
            assert!(stats::mean(&ape) < 0.1, "{key}: {ape:?}");
        }
        // the QKV rows are all the pooled GEMM model has: it serves the role or the role keeps
        // its own model, never both
        let pooled = outcome
            .models
            .iter()
            .find(|m| m.key == ModelKey::of(&gemm(Role::Qkv, 1)).pooled())
            .unwrap();
        let served = outcome
            .pooled_roles
            .iter()
            .any(|p| p.0.role == Some(Role::Qkv));
        assert_eq!(pooled.serves_roles.contains(&Role::Qkv), served);
        for (role, own, pooled) in &outcome.pooled_roles {
            assert!(
                pooled <= own,
                "{role}: pooled {pooled} % against its own {own} %"
            );
        }
        assert_eq!(pooled.training_rows, 15);

        // a budget of one node: every group drops to its smallest candidate
        let tight = train(&ds, &options(1), &|| {});
        for (key, _, _, nodes, chosen) in &tight.grid {
            let smallest = tight
                .grid
                .iter()
                .filter(|g| g.0 == *key)
                .map(|g| g.3)
                .min()
                .unwrap();
            if *chosen {
                assert_eq!(*nodes, smallest, "{key}");
            }
        }
    }

    /// Two roles of one shape running at different speeds: the pooled model (which cannot tell
    /// them apart) is worse on each, so each keeps its own.
    #[test]
    fn roles_the_pooled_model_predicts_worse_keep_their_own_models() {
        let gpu = gpu();
        let mut rows = Vec::new();
        for (role, slowdown) in [(Role::Qkv, 1.25), (Role::MlpUp, 2.5)] {
            for i in 1..=12 {
                let q = gemm(role, 512 * i);
                rows.push(measured(q, device_time_us(&q, &gpu).unwrap() * slowdown));
            }
        }
        let outcome = train(&dataset(&gpu, rows), &options(usize::MAX), &|| {});
        assert!(
            outcome.pooled_roles.is_empty(),
            "{:?}",
            outcome.pooled_roles
        );
        let keys: Vec<Option<Role>> = outcome.models.iter().map(|m| m.key.role).collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
        assert!(keys.contains(&Some(Role::Qkv)) && keys.contains(&Some(Role::MlpUp)));
        assert!(outcome.models.iter().all(|m| m.serves_roles.is_empty()));
    }

    /// A collective model keeps the layouts it was measured on and the table of its probes.
    #[test]
    fn a_collective_model_keeps_its_layouts_and_probe_table() {
        let mut rows = Vec::new();
        for (nodes, gpus_per_node) in [(2, 4), (1, 8), (1, 4)] {
            for shift in 16..26 {
                let q = OpQuery {
                    op: OpKind::AllReduce,
                    phase: Phase::None,
                    dtype: Dtype::Fp16,
                    role: None,
                    shape: Shape::Collective(crate::ops::CollectiveShape {
                        bytes: 1 << shift,
                        nodes,
                        gpus_per_node,
                    }),
                };
                rows.push(measured(
                    q,
                    10.0 + (1u64 << shift) as f64 / 1e5 * nodes as f64,
                ));
            }
        }
        let outcome = train(&dataset(&gpu(), rows), &options(usize::MAX), &|| {});
        let [model] = outcome.models.as_slice() else {
            panic!("{} models", outcome.models.len())
        };
        assert_eq!(model.layouts, vec![[1, 4], [1, 8], [2, 4]]);
        assert_eq!(
            model.probes_us.len(),
            3 * super::super::model::PROBES_PER_LAYOUT
        );
        assert_eq!(
            model.probes_us,
            model.evaluate_probes(&model.probe_shapes())
        );
    }

    fn candidate(group: usize, mape_percent: f64, nodes: usize) -> Candidate {
        Candidate {
            group,
            recipe: small_grid()[0],
            ln_pred: Vec::new(),
            mape_percent,
            nodes,
        }
    }

    /// The nodes of the candidates two groups keep, from their first, under `budget`.
    fn downgraded(a: &[Candidate], b: &[Candidate], keep: [bool; 2], budget: usize) -> [usize; 2] {
        let per_group = vec![a.iter().collect::<Vec<_>>(), b.iter().collect()];
        let mut best = vec![&a[0], &b[0]];
        fit_budget(&mut best, &per_group, &keep, budget);
        [best[0].nodes, best[1].nodes]
    }

    /// Over budget, the swap that loses the least error per node saved goes first, until the
    /// kept groups fit: (1 %, 100) + (2 %, 80) over 130 nodes takes (2.1 %, 40) first (0.0025
    /// a node, against 0.01 for (1.5 %, 50) and 0.022 for (3 %, 10)), then (1.5 %, 50).
    /// Lost error is weighed per node saved, not in all.
    #[test]
    fn over_budget_the_cheapest_downgrades_are_made_first() {
        let a = [
            candidate(0, 1.0, 100),
            candidate(0, 1.5, 50),
            candidate(0, 3.0, 10),
        ];
        let b = [candidate(1, 2.0, 80), candidate(1, 2.1, 40)];
        let both = [true, true];
        assert_eq!(downgraded(&a, &b, both, 180), [100, 80]);
        assert_eq!(downgraded(&a, &b, both, 179), [100, 40]);
        assert_eq!(downgraded(&a, &b, both, 130), [50, 40]);
        assert_eq!(downgraded(&a, &b, both, 0), [10, 40]);
        // a group served by another model does not count
        assert_eq!(downgraded(&a, &b, [true, false], 100), [100, 80]);
        assert_eq!(downgraded(&a, &b, [true, false], 99), [50, 80]);
        // lost points, not the ratio of errors: 1 → 1.5 % before 10 → 11 %
        let c = [candidate(0, 1.0, 100), candidate(0, 1.5, 50)];
        let d = [candidate(1, 10.0, 100), candidate(1, 11.0, 50)];
        assert_eq!(downgraded(&c, &d, both, 199), [50, 100]);
        // per node saved, not in all: 0.2 % for 100 nodes before 0.1 % for 10
        let c = [candidate(0, 1.0, 110), candidate(0, 1.2, 10)];
        let d = [candidate(1, 2.0, 50), candidate(1, 2.1, 40)];
        assert_eq!(downgraded(&c, &d, both, 159), [10, 50]);
    }

    #[test]
    fn a_group_keeps_its_best_candidate_or_a_smaller_one_within_one_percent() {
        let c = [
            candidate(0, 10.0, 100),
            candidate(0, 10.05, 50),
            candidate(0, 10.5, 20),
        ];
        let mine: Vec<&Candidate> = c.iter().collect();
        assert_eq!(near_best(&mine).nodes, 50);
        assert_eq!(near_best(&mine[2..]).nodes, 20);
        assert_eq!(near_best(&[&c[2], &c[0]]).nodes, 100);
    }

    /// The validation figures of predictions worked by hand: measured 100 µs each, predicted
    /// 90, 100, 110 and 125 µs.
    #[test]
    fn validation_figures_are_the_errors_and_log_residuals_of_the_held_out_rows() {
        let q = norm(1, 1024, 1024);
        let ds = dataset(&gpu(), (0..4).map(|_| measured(q, 100.0)).collect());
        let prepared = Prepared::new(&ds);
        let predicted = [90.0f64, 100.0, 110.0, 125.0];
        let ln: Vec<f64> = predicted.iter().map(|p| p.ln()).collect();
        let v = validation_of(&prepared, &[0, 1, 2, 3], &ln);
        assert_eq!(v.rows, 4);
        assert!((v.mape_percent - 11.25).abs() < 1e-9);
        // errors 0, 10, 10, 25 %: the 90th percentile interpolates 10 and 25 at 0.7
        assert!((v.p90_ape_percent - 20.5).abs() < 1e-9);
        let r: Vec<f64> = predicted.iter().map(|p| (100.0 / p).ln()).collect();
        let mean = r.iter().sum::<f64>() / 4.0;
        let sigma = (r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0).sqrt();
        assert!((v.sigma_log - sigma).abs() < 1e-12);
        // residuals ascending: ln(100/125), ln(100/110), 0, ln(100/90)
        assert!((v.log_residual_p10 - (r[3] + 0.3 * (r[2] - r[3]))).abs() < 1e-12);
        assert!((v.log_residual_p90 - (r[1] + 0.7 * (r[0] - r[1]))).abs() < 1e-12);
    }
}
