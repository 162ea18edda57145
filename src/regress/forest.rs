//! Random forest regression: bootstrap samples, a random subset of features tried at each
//! split, leaves holding the mean target of their rows; the forest averages its trees.

use serde::{Deserialize, Serialize};

use super::cart::{grow, Binned, TreeParams};
use super::flat::{FlatForest, TreeBuilder};
use crate::rng::Rng;

/// Random-forest hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForestParams {
    /// Trees in the forest (each grown on a bootstrap sample).
    pub trees: usize,
    /// Fraction of the features tried at each split.
    pub max_features: f64,
    /// Fewest rows in a leaf.
    pub min_samples_leaf: usize,
    /// Deepest a tree may grow.
    pub max_depth: usize,
    /// Upper bound on leaves per tree, enforced by raising the leaf size to rows / max_leaves;
    /// keeps forests on large datasets to a few MB.
    pub max_leaves: usize,
}

/// Fits a bagged forest on binned features, seeded.
pub fn fit_forest(data: &Binned, y: &[f64], params: &ForestParams, seed: u64) -> FlatForest {
    let n = data.n_rows();
    let mut rng = Rng::new(seed);
    let mut out = TreeBuilder::default();
    let tree = TreeParams {
        max_depth: params.max_depth,
        min_samples_leaf: params
            .min_samples_leaf
            .max(n.div_ceil(params.max_leaves.max(1))),
        max_features: params.max_features,
    };
    let mean = |rows: &[u32]| rows.iter().map(|&r| y[r as usize]).sum::<f64>() / rows.len() as f64;
    let mut rows = vec![0u32; n];
    for _ in 0..params.trees {
        for slot in rows.iter_mut() {
            *slot = rng.below(n) as u32;
        }
        grow(data, y, &mut rows, &tree, &mut rng, &mean, &mut out);
    }
    out.finish(1.0 / params.trees.max(1) as f64, 0.0, data.n_features())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forest_fits_a_smooth_function() {
        let x: Vec<Vec<f64>> = (0..400).map(|i| vec![i as f64 / 40.0]).collect();
        let y: Vec<f64> = x.iter().map(|r| r[0].sin()).collect();
        let data = Binned::new(&x);
        let p = ForestParams {
            trees: 30,
            max_features: 1.0,
            min_samples_leaf: 2,
            max_depth: 12,
            max_leaves: 1000,
        };
        let f = fit_forest(&data, &y, &p, 1);
        let err: f64 = x
            .iter()
            .zip(&y)
            .map(|(r, t)| (f.predict(r) - t).abs())
            .sum::<f64>()
            / 400.0;
        assert!(err < 0.03, "{err}");
        assert_eq!(f.tree_count(), 30);
        // same seed, same forest; another seed, other bootstrap samples
        assert_eq!(fit_forest(&data, &y, &p, 1), f);
        assert_ne!(fit_forest(&data, &y, &p, 2), f);
    }

    /// `max_leaves` caps a tree's leaves by raising the smallest leaf to rows / max_leaves:
    /// 400 rows, at most 10 leaves, so 40 rows a leaf and at most 10 leaves (19 nodes) a tree.
    #[test]
    fn max_leaves_bounds_every_tree() {
        let x: Vec<Vec<f64>> = (0..400).map(|i| vec![i as f64]).collect();
        let y: Vec<f64> = x.iter().map(|r| r[0]).collect();
        let data = Binned::new(&x);
        let p = |max_leaves| ForestParams {
            trees: 5,
            max_features: 1.0,
            min_samples_leaf: 1,
            max_depth: 20,
            max_leaves,
        };
        let capped = fit_forest(&data, &y, &p(10), 3);
        assert!(capped.node_count() <= 5 * 19, "{}", capped.node_count());
        // uncapped, a tree of a strictly increasing target grows far more
        assert!(fit_forest(&data, &y, &p(1000), 3).node_count() > 5 * 100);
    }
}
