//! Learned per-operator models: grown with our own CART code (random forests and gradient
//! boosting on binned features), stored in our own flat-tree format, predicted in microseconds.

#![warn(missing_docs)]

pub mod boost;
pub mod bundle;
pub mod cart;
pub mod eval;
pub mod flat;
pub mod forest;
pub mod model;
pub mod modelset;
pub mod split;
#[cfg(test)]
mod testing;
pub mod train;

pub use model::{ModelKey, Prediction, Recipe, TrainedModel};
pub use modelset::{Manifest, Match, ModelSet};
