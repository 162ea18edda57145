//! A trained per-(operator, phase, dtype[, role]) model as saved under `models/<cluster>/`:
//! the flat forest plus everything needed to trust it — feature-schema version, the dataset's
//! fingerprint and software stamp, validation error, the training range of every feature, the
//! data's source.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::boost::{fit_boost, BoostParams};
use super::cart::Binned;
use super::flat::FlatForest;
use super::forest::{fit_forest, ForestParams};
use crate::analytic::roofline::work_scale_us;
use crate::dataset::{Dataset, Provenance, SoftwareStamp};
use crate::error::{Error, Result};
use crate::hardware::GpuSpec;
use crate::ops::features::{features, COLLECTIVE_LOG2_BYTES, FEATURE_SCHEMA_VERSION};
use crate::ops::{CollectiveShape, Dtype, OpKind, OpQuery, Phase, Role, Shape, ShapeFamily};

/// Version of the models directory layout (`manifest.json` + `models.bin`).
pub const MODEL_FORMAT_VERSION: u32 = 3;

/// Which calls a model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModelKey {
    /// Operator kind.
    pub op: OpKind,
    /// Phase.
    pub phase: Phase,
    /// Data type.
    pub dtype: Dtype,
    /// `None`: the pooled model over all roles (and role-less rows) of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

impl ModelKey {
    /// The model a query would be answered by first.
    pub fn of(q: &OpQuery) -> ModelKey {
        ModelKey {
            op: q.op,
            phase: q.phase,
            dtype: q.dtype,
            role: q.role,
        }
    }

    /// The same key without a role: the model pooled over every role of the kind.
    pub fn pooled(self) -> ModelKey {
        ModelKey { role: None, ..self }
    }

    /// A name for files and messages.
    pub fn file_name(&self) -> String {
        match self.role {
            Some(r) => format!("{}.{}.{}.{}.json", self.op, self.phase, self.dtype, r),
            None => format!("{}.{}.{}.json", self.op, self.phase, self.dtype),
        }
    }
}

impl fmt::Display for ModelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.op, self.phase, self.dtype)?;
        if let Some(r) = self.role {
            write!(f, " {r}")?;
        }
        Ok(())
    }
}

/// What the trees predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetTransform {
    /// ln(time / µs).
    LogTime,
    /// ln(time / roofline time): the trees learn the inefficiency, the roofline carries the
    /// scale, so fewer splits are spent on the obvious growth with size.
    LogOverRoofline,
}

/// The learner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    /// Bagged CART trees.
    RandomForest(ForestParams),
    /// Gradient-boosted CART trees.
    GradientBoosting(BoostParams),
}

/// An algorithm, its hyper-parameters and the target: everything needed to fit a model again.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// Learner and hyper-parameters.
    #[serde(flatten)]
    pub algorithm: Algorithm,
    /// What the trees predict.
    pub target: TargetTransform,
}

impl Recipe {
    /// Fits the recipe on features `x` and targets `y`, seeded.
    pub fn fit(&self, x: &[Vec<f64>], y: &[f64], seed: u64) -> FlatForest {
        let data = Binned::new(x);
        match &self.algorithm {
            Algorithm::RandomForest(p) => fit_forest(&data, y, p, seed),
            Algorithm::GradientBoosting(p) => fit_boost(&data, y, p, seed),
        }
    }

    /// The regression target of one row: ln(time) or ln(time / roofline).
    pub fn target(&self, q: &OpQuery, time_us: f64, gpu: &GpuSpec) -> f64 {
        time_us.ln() - self.offset(q, gpu)
    }

    /// What the target subtracts from ln(time): 0, or ln(roofline time).
    pub fn offset(&self, q: &OpQuery, gpu: &GpuSpec) -> f64 {
        match self.target {
            TargetTransform::LogTime => 0.0,
            TargetTransform::LogOverRoofline => work_scale_us(q, gpu).ln(),
        }
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match self.target {
            TargetTransform::LogTime => "log t",
            TargetTransform::LogOverRoofline => "log t/roofline",
        };
        match &self.algorithm {
            Algorithm::RandomForest(p) => write!(
                f,
                "forest {}×, features {:.0}%, leaf ≥{}, {target}",
                p.trees,
                p.max_features * 100.0,
                p.min_samples_leaf
            ),
            Algorithm::GradientBoosting(p) => write!(
                f,
                "boosting {}× depth {} lr {} {:?}, {target}",
                p.trees, p.max_depth, p.learning_rate, p.loss
            ),
        }
    }
}

/// Error of the model's recipe on the held-out 20 % before the refit on all rows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Held-out rows.
    pub rows: usize,
    /// Mean absolute percentage error on them, %.
    pub mape_percent: f64,
    /// 90th percentile of the absolute percentage error, %.
    pub p90_ape_percent: f64,
    /// 10th and 90th percentiles of ln(actual / predicted): the 80 % interval of a prediction.
    pub log_residual_p10: f64,
    /// 90th percentile of ln(actual / predicted).
    pub log_residual_p90: f64,
    /// Standard deviation of ln(actual / predicted).
    pub sigma_log: f64,
}

/// Where the training data came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetRef {
    /// The dataset's name.
    pub name: String,
    /// Its fingerprint (a hash of its rows).
    pub fingerprint: String,
    /// When it was collected.
    pub collected_at: String,
    /// Where it came from.
    pub source: Provenance,
    /// The software it was measured under.
    pub software: SoftwareStamp,
}

impl DatasetRef {
    /// What a model trained from `dataset` records of it.
    pub fn of(dataset: &Dataset) -> DatasetRef {
        DatasetRef {
            name: dataset.meta.name.clone(),
            fingerprint: dataset.fingerprint.clone(),
            collected_at: dataset.meta.collected_at.clone(),
            source: dataset.meta.source.clone(),
            software: dataset.meta.software.clone(),
        }
    }
}

/// A trained model with everything needed to trust its answers.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedModel {
    /// Which calls it answers.
    pub key: ModelKey,
    /// How it was fitted.
    pub recipe: Recipe,
    /// Roles this model answers because no per-role model measured better.
    pub serves_roles: Vec<Role>,
    /// Names of its features (the schema's).
    pub feature_names: Vec<String>,
    /// [min, max] of every feature over the training rows.
    pub feature_ranges: Vec<[f64; 2]>,
    /// Rows it was trained on.
    pub training_rows: usize,
    /// Collectives: the (nodes, GPUs per node) layouts the rows were measured on.
    pub layouts: Vec<[u64; 2]>,
    /// Its validation error.
    pub validation: Validation,
    /// The GPU the features and roofline scale were computed for.
    pub gpu: GpuSpec,
    /// The dataset it was trained from.
    pub dataset: DatasetRef,
    /// The trees.
    pub forest: FlatForest,
    /// Collectives: the model's time at each of `probe_shapes`, µs, stored with the model when
    /// it was written (empty: evaluated when needed; see `probe_times_us`).
    pub probes_us: Vec<f64>,
}

/// Message sizes per measured layout at which a collective model is sampled to calibrate the
/// analytic network model on it (`predict::cost`).
pub const PROBES_PER_LAYOUT: usize = 8;

/// A predicted time with its 80 % interval and whether the query lies inside the training data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Predicted µs.
    pub time_us: f64,
    /// 10th percentile of the validation error applied, µs.
    pub low_us: f64,
    /// 90th percentile of the validation error applied, µs.
    pub high_us: f64,
    /// Standard deviation of ln(actual / predicted) on validation.
    pub sigma_log: f64,
    /// Features outside their training range (empty when covered).
    pub out_of_coverage: Vec<String>,
}

/// Refuses a model or manifest file written with another file-format or feature-schema version.
pub fn check_versions(path: &Path, text: &str) -> Result<()> {
    #[derive(Deserialize)]
    struct Versions {
        format_version: u32,
        feature_schema_version: u32,
    }
    let v: Versions = serde_json::from_str(text)
        .map_err(|e| Error::bad_file(path, format!("not a stepcast model file: {e}")))?;
    let check = |what, found, expected| {
        if found == expected {
            Ok(())
        } else {
            Err(Error::SchemaVersion {
                path: path.to_path_buf(),
                what,
                found,
                expected,
            })
        }
    };
    check("model format", v.format_version, MODEL_FORMAT_VERSION)?;
    check(
        "feature schema",
        v.feature_schema_version,
        FEATURE_SCHEMA_VERSION,
    )
}

impl TrainedModel {
    /// The calls a collective model is sampled at: for each layout it measured,
    /// `PROBES_PER_LAYOUT` message sizes spread evenly in log₂ over the sizes it measured
    /// (empty for other kinds).
    pub fn probe_shapes(&self) -> Vec<CollectiveShape> {
        if self.probe_count() == 0 {
            return Vec::new();
        }
        let Some(&[lo, hi]) = self.feature_ranges.get(COLLECTIVE_LOG2_BYTES) else {
            return Vec::new();
        };
        let last = (PROBES_PER_LAYOUT - 1) as f64;
        self.layouts
            .iter()
            .flat_map(|&[nodes, gpus_per_node]| {
                (0..PROBES_PER_LAYOUT).map(move |k| CollectiveShape {
                    bytes: ((lo + (hi - lo) * k as f64 / last).exp2() as u64).max(1),
                    nodes,
                    gpus_per_node,
                })
            })
            .collect()
    }

    /// How many calls `probe_shapes` lists.
    pub fn probe_count(&self) -> usize {
        let collective = self.key.op.family() == ShapeFamily::Collective
            && self.feature_ranges.len() > COLLECTIVE_LOG2_BYTES;
        if collective {
            self.layouts.len() * PROBES_PER_LAYOUT
        } else {
            0
        }
    }

    /// The model's time at each of `probe_shapes`, µs: the table stored with the model (so a
    /// prediction does not walk a thousand-tree forest 8 × layouts times to calibrate one
    /// collective), or evaluated now for a file written without it.
    pub fn probe_times_us(&self) -> Cow<'_, [f64]> {
        if self.probes_us.len() == self.probe_count() {
            return Cow::Borrowed(&self.probes_us);
        }
        Cow::Owned(self.evaluate_probes(&self.probe_shapes()))
    }

    /// The model's time at each shape, evaluated from its trees (collective features and the
    /// bus-bytes scale depend on the kind and the shape only, not on the data type or role).
    pub fn evaluate_probes(&self, shapes: &[CollectiveShape]) -> Vec<f64> {
        shapes
            .iter()
            .map(|&c| {
                self.predict(&OpQuery {
                    op: self.key.op,
                    phase: self.key.phase,
                    dtype: self.key.dtype,
                    role: None,
                    shape: Shape::Collective(c),
                })
                .time_us
            })
            .collect()
    }

    /// How many of a query's features lie outside this model's training range.
    pub fn features_outside(&self, q: &OpQuery) -> usize {
        self.outside_range(&self.features(q)).count()
    }

    /// The indices of the features of `x` outside their training range.
    fn outside_range<'a>(&'a self, x: &'a [f64]) -> impl Iterator<Item = usize> + 'a {
        x.iter()
            .zip(&self.feature_ranges)
            .enumerate()
            .filter(|(_, (value, [lo, hi]))| {
                let slack = 1e-9 * (hi - lo).abs().max(1.0);
                **value < lo - slack || **value > hi + slack
            })
            .map(|(i, _)| i)
    }

    /// The feature row of a query, for this model's GPU.
    pub fn features(&self, q: &OpQuery) -> Vec<f64> {
        features(q.op, &q.shape, q.dtype, self.gpu.sm_count)
    }

    /// Predicts one call, with its interval and coverage.
    pub fn predict(&self, q: &OpQuery) -> Prediction {
        let x = self.features(q);
        let time_us = (self.forest.predict(&x) + self.recipe.offset(q, &self.gpu)).exp();
        let v = &self.validation;
        let out_of_coverage = self
            .outside_range(&x)
            .map(|i| self.feature_names[i].clone())
            .collect();
        Prediction {
            time_us,
            low_us: time_us * v.log_residual_p10.min(0.0).exp(),
            high_us: time_us * v.log_residual_p90.max(0.0).exp(),
            sigma_log: v.sigma_log,
            out_of_coverage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regress::modelset::ModelSet;

    fn a100_model(key: ModelKey) -> TrainedModel {
        ModelSet::builtin("perlmutter")
            .unwrap()
            .get(&key)
            .unwrap()
            .clone()
    }

    fn key(op: OpKind, phase: Phase, role: Option<Role>) -> ModelKey {
        ModelKey {
            op,
            phase,
            dtype: Dtype::Fp16,
            role,
        }
    }

    /// A LayerNorm inside what the paper measured.
    fn layer_norm() -> OpQuery {
        super::super::testing::tokens(OpKind::LayerNorm, 4, 2048, 4096)
    }

    #[test]
    fn keys_name_their_files_with_and_without_a_role() {
        let qkv = key(OpKind::Gemm, Phase::Bwd, Some(Role::Qkv));
        assert_eq!(qkv.file_name(), "gemm.bwd.fp16.qkv.json");
        assert_eq!(qkv.pooled().file_name(), "gemm.bwd.fp16.json");
        assert_eq!(qkv.to_string(), "gemm bwd fp16 qkv");
    }

    /// The target a tree learns: ln(time), or ln(time / roofline scale) — the model's efficiency.
    #[test]
    fn recipes_learn_log_time_or_log_time_over_the_roofline_and_say_so() {
        let gpu = GpuSpec::builtin("a100").unwrap();
        let q = layer_norm();
        let forest = Recipe {
            algorithm: Algorithm::RandomForest(ForestParams {
                trees: 60,
                max_features: 0.5,
                min_samples_leaf: 2,
                max_depth: 12,
                max_leaves: 1000,
            }),
            target: TargetTransform::LogTime,
        };
        let boost = Recipe {
            algorithm: Algorithm::GradientBoosting(BoostParams {
                trees: 300,
                learning_rate: 0.1,
                max_depth: 5,
                min_samples_leaf: 2,
                subsample: 0.8,
                loss: super::super::boost::Loss::Absolute,
            }),
            target: TargetTransform::LogOverRoofline,
        };
        assert_eq!(forest.target(&q, 50.0, &gpu), 50f64.ln());
        let scale = work_scale_us(&q, &gpu);
        assert!(scale > 1.0);
        assert!((boost.target(&q, 50.0, &gpu) - (50.0 / scale).ln()).abs() < 1e-12);
        assert_eq!(
            forest.to_string(),
            "forest 60×, features 50%, leaf ≥2, log t"
        );
        assert_eq!(
            boost.to_string(),
            "boosting 300× depth 5 lr 0.1 Absolute, log t/roofline"
        );
    }

    #[test]
    fn files_of_another_format_or_feature_schema_are_refused_by_name() {
        let path = Path::new("models/x/manifest.json");
        let text = |format: u32, schema: u32| {
            format!(r#"{{"format_version": {format}, "feature_schema_version": {schema}}}"#)
        };
        check_versions(path, &text(MODEL_FORMAT_VERSION, FEATURE_SCHEMA_VERSION)).unwrap();
        for (t, what, found) in [
            (
                text(MODEL_FORMAT_VERSION + 1, FEATURE_SCHEMA_VERSION),
                "model format",
                1,
            ),
            (
                text(MODEL_FORMAT_VERSION, FEATURE_SCHEMA_VERSION + 7),
                "feature schema",
                7,
            ),
        ] {
            match check_versions(path, &t) {
                Err(Error::SchemaVersion {
                    what: w,
                    found: f,
                    expected,
                    ..
                }) => {
                    assert_eq!(w, what);
                    assert_eq!(f - expected, found);
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        let err = check_versions(path, "format_version: 3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a stepcast model file"), "{err}");
    }

    /// A collective model is probed at 8 sizes a layout, evenly in log₂ bytes from the smallest
    /// to the largest it measured; its stored table answers when it has one entry a probe, else
    /// the trees do. Other kinds have no probes.
    #[test]
    fn collective_models_are_probed_evenly_in_log_bytes_per_layout() {
        let mut ar = a100_model(key(OpKind::AllReduce, Phase::None, None));
        let [lo, hi] = ar.feature_ranges[COLLECTIVE_LOG2_BYTES];
        let shapes = ar.probe_shapes();
        assert!(ar.layouts.len() > 1);
        assert_eq!(shapes.len(), ar.layouts.len() * PROBES_PER_LAYOUT);
        assert_eq!(ar.probe_count(), shapes.len());
        for (layout, probes) in ar.layouts.iter().zip(shapes.chunks(PROBES_PER_LAYOUT)) {
            assert!(probes.iter().all(|c| [c.nodes, c.gpus_per_node] == *layout));
            assert_eq!(probes[0].bytes, lo.exp2() as u64);
            assert_eq!(probes[7].bytes, hi.exp2() as u64);
            assert_eq!(probes[3].bytes, (lo + (hi - lo) * 3.0 / 7.0).exp2() as u64);
        }
        let by_trees: Vec<f64> = shapes
            .iter()
            .map(|&c| {
                let q = OpQuery {
                    op: OpKind::AllReduce,
                    phase: Phase::None,
                    dtype: Dtype::Fp16,
                    role: None,
                    shape: Shape::Collective(c),
                };
                ar.predict(&q).time_us
            })
            .collect();
        assert_eq!(ar.evaluate_probes(&shapes), by_trees);
        ar.probes_us = vec![1.0; shapes.len()];
        assert_eq!(*ar.probe_times_us(), vec![1.0; shapes.len()]);
        ar.probes_us = vec![1.0; 3];
        assert_eq!(*ar.probe_times_us(), by_trees);
        // a collective model without the bytes feature, and any other kind: none
        ar.feature_ranges.truncate(COLLECTIVE_LOG2_BYTES);
        assert_eq!((ar.probe_count(), ar.probe_shapes().len()), (0, 0));
        let norm = a100_model(key(OpKind::LayerNorm, Phase::Fwd, None));
        assert_eq!((norm.probe_count(), norm.probe_shapes().len()), (0, 0));
        assert!(norm.probe_times_us().is_empty());
    }

    /// A prediction's 80 % interval is its validation's 10th and 90th percentile of
    /// ln(actual / predicted) applied to it, always holding the prediction itself.
    #[test]
    fn predictions_carry_the_validation_interval() {
        let mut m = a100_model(key(OpKind::LayerNorm, Phase::Fwd, None));
        let q = layer_norm();
        for (p10, p90, low, high) in [
            (-0.1f64, 0.2f64, (-0.1f64).exp(), 0.2f64.exp()),
            (0.05, -0.05, 1.0, 1.0),
        ] {
            m.validation.log_residual_p10 = p10;
            m.validation.log_residual_p90 = p90;
            m.validation.sigma_log = 0.3;
            let p = m.predict(&q);
            assert!((p.low_us / p.time_us - low).abs() < 1e-12, "{p10}");
            assert!((p.high_us / p.time_us - high).abs() < 1e-12, "{p90}");
            assert_eq!(p.sigma_log, 0.3);
            assert!(p.out_of_coverage.is_empty());
        }
    }

    /// A feature is outside its training range beyond a slack of 1e-9 of the range (at least
    /// 1e-9): on [1000, 1100] a value 1e-7 past either end is still inside, anything beyond out.
    #[test]
    fn coverage_allows_a_relative_slack_at_each_end() {
        let mut m = a100_model(key(OpKind::LayerNorm, Phase::Fwd, None));
        m.feature_ranges = vec![[1000.0, 1100.0], [0.0, 0.5]];
        let slack = 1e-9 * 100.0;
        let outside = |x: [f64; 2]| m.outside_range(&x).collect::<Vec<usize>>();
        for inside in [
            1000.0,
            1100.0,
            1000.0 - slack,
            1100.0 + slack,
            1100.0 + 5e-8,
        ] {
            assert!(outside([inside, 0.25]).is_empty(), "{inside}");
        }
        for beyond in [1000.0 - 2e-7, 1100.0 + 2e-7, 1100.0 + 1e-6] {
            assert_eq!(outside([beyond, 0.25]), vec![0], "{beyond}");
        }
        // a range narrower than 1: a slack of 1e-9
        assert!(outside([1050.0, 0.5 + 5e-10]).is_empty());
        assert_eq!(outside([1050.0, 0.5 + 2e-9]), vec![1]);
        assert_eq!(outside([900.0, -1.0]), vec![0, 1]);
    }
}
