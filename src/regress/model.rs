//! A trained per-(operator, phase, dtype[, role]) model as saved under `models/<cluster>/`:
//! the flat forest plus everything needed to trust it — feature-schema version, the dataset's
//! fingerprint and software stamp, validation error, the training range of every feature, the
//! data's source.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::boost::{fit_boost, BoostParams};
use super::cart::Binned;
use super::flat::FlatForest;
use super::forest::{fit_forest, ForestParams};
use crate::analytic::roofline::work_scale_us;
use crate::dataset::{Provenance, SoftwareStamp};
use crate::error::{Error, Result};
use crate::hardware::GpuSpec;
use crate::ops::features::{features, FEATURE_SCHEMA_VERSION};
use crate::ops::{Dtype, OpKind, OpQuery, Phase, Role};

/// Version of the models directory layout (`manifest.json` + `models.bin`).
pub const MODEL_FORMAT_VERSION: u32 = 3;

/// Which calls a model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModelKey {
    pub op: OpKind,
    pub phase: Phase,
    pub dtype: Dtype,
    /// `None`: the pooled model over all roles (and role-less rows) of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

impl ModelKey {
    pub fn of(q: &OpQuery) -> ModelKey {
        ModelKey {
            op: q.op,
            phase: q.phase,
            dtype: q.dtype,
            role: q.role,
        }
    }

    pub fn pooled(self) -> ModelKey {
        ModelKey { role: None, ..self }
    }

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

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    RandomForest(ForestParams),
    GradientBoosting(BoostParams),
}

/// An algorithm, its hyper-parameters and the target: everything needed to fit a model again.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    #[serde(flatten)]
    pub algorithm: Algorithm,
    pub target: TargetTransform,
}

impl Recipe {
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
    pub rows: usize,
    pub mape_percent: f64,
    pub p90_ape_percent: f64,
    /// 10th and 90th percentiles of ln(actual / predicted): the 80 % interval of a prediction.
    pub log_residual_p10: f64,
    pub log_residual_p90: f64,
    /// Standard deviation of ln(actual / predicted).
    pub sigma_log: f64,
}

/// Where the training data came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetRef {
    pub name: String,
    pub fingerprint: String,
    pub collected_at: String,
    pub source: Provenance,
    pub software: SoftwareStamp,
}

/// A trained model with everything needed to trust its answers.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedModel {
    pub key: ModelKey,
    pub recipe: Recipe,
    /// Roles this model answers because no per-role model measured better.
    pub serves_roles: Vec<Role>,
    pub feature_names: Vec<String>,
    /// [min, max] of every feature over the training rows.
    pub feature_ranges: Vec<[f64; 2]>,
    pub training_rows: usize,
    /// Collectives: the (nodes, GPUs per node) layouts the rows were measured on.
    pub layouts: Vec<[u64; 2]>,
    pub validation: Validation,
    /// The GPU the features and roofline scale were computed for.
    pub gpu: GpuSpec,
    pub dataset: DatasetRef,
    pub forest: FlatForest,
}

/// A predicted time with its 80 % interval and whether the query lies inside the training data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub time_us: f64,
    pub low_us: f64,
    pub high_us: f64,
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
    pub fn features(&self, q: &OpQuery) -> Vec<f64> {
        features(q.op, &q.shape, q.dtype, self.gpu.sm_count)
    }

    pub fn predict(&self, q: &OpQuery) -> Prediction {
        let x = self.features(q);
        let time_us = (self.forest.predict(&x) + self.recipe.offset(q, &self.gpu)).exp();
        let v = &self.validation;
        let out_of_coverage = x
            .iter()
            .zip(&self.feature_ranges)
            .zip(&self.feature_names)
            .filter(|((value, [lo, hi]), _)| {
                let slack = 1e-9 * (hi - lo).abs().max(1.0);
                **value < lo - slack || **value > hi + slack
            })
            .map(|(_, name)| name.clone())
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
