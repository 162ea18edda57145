//! Gradient-boosted regression trees with squared or absolute loss (absolute: trees fit the
//! sign of the residuals and each leaf takes the median residual of its rows, LAD-TreeBoost).
//! On log times the absolute loss shrugs off the occasional slow or fast sample (a clock
//! change during a measurement) that the squared loss chases.

use serde::{Deserialize, Serialize};

use super::cart::{grow, Binned, TreeParams};
use super::flat::{FlatForest, TreeBuilder};
use crate::rng::Rng;

/// What each boosting step fits: the squared error's or the absolute error's gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Squared error (fits residuals).
    Squared,
    /// Absolute error (fits residual signs, leaves at the median): robust to clock-change outliers.
    Absolute,
}

/// Gradient-boosting hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoostParams {
    /// Boosting rounds.
    pub trees: usize,
    /// Shrinkage of each tree's leaves.
    pub learning_rate: f64,
    /// Deepest a tree may grow.
    pub max_depth: usize,
    /// Fewest rows in a leaf.
    pub min_samples_leaf: usize,
    /// Fraction of the rows each tree is grown on (without replacement).
    pub subsample: f64,
    /// The loss each round's gradient comes from.
    pub loss: Loss,
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Fits a boosted ensemble on binned features, seeded.
pub fn fit_boost(data: &Binned, y: &[f64], params: &BoostParams, seed: u64) -> FlatForest {
    let n = data.n_rows();
    let mut rng = Rng::new(seed);
    let base = match params.loss {
        Loss::Squared => y.iter().sum::<f64>() / n.max(1) as f64,
        Loss::Absolute => median(&mut y.to_vec()),
    };
    let mut prediction = vec![base; n];
    let mut residual = vec![0.0; n];
    let mut gradient = vec![0.0; n];
    let mut out = TreeBuilder::default();
    let tree = TreeParams {
        max_depth: params.max_depth,
        min_samples_leaf: params.min_samples_leaf,
        max_features: 1.0,
    };
    let sample_size = ((params.subsample.clamp(0.0, 1.0) * n as f64).round() as usize).clamp(1, n);
    let mut all: Vec<u32> = (0..n as u32).collect();
    for _ in 0..params.trees {
        for i in 0..n {
            residual[i] = y[i] - prediction[i];
            gradient[i] = match params.loss {
                Loss::Squared => residual[i],
                Loss::Absolute => residual[i].signum(),
            };
        }
        // partial shuffle: the first `sample_size` rows are this tree's sample
        for i in 0..sample_size.min(n - 1) {
            let j = i + rng.below(n - i);
            all.swap(i, j);
        }
        let rows = &mut all[..sample_size];
        let residual_ref = &residual;
        let lr = params.learning_rate;
        let leaf = |leaf_rows: &[u32]| -> f64 {
            match params.loss {
                Loss::Squared => {
                    lr * leaf_rows
                        .iter()
                        .map(|&r| residual_ref[r as usize])
                        .sum::<f64>()
                        / leaf_rows.len() as f64
                }
                Loss::Absolute => {
                    let mut v: Vec<f64> = leaf_rows
                        .iter()
                        .map(|&r| residual_ref[r as usize])
                        .collect();
                    lr * median(&mut v)
                }
            }
        };
        grow(data, &gradient, rows, &tree, &mut rng, &leaf, &mut out);
        for (i, p) in prediction.iter_mut().enumerate() {
            *p += out.eval_last(|f| data.value(i, f)) as f64;
        }
    }
    out.finish(1.0, base, data.n_features())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> (Vec<Vec<f64>>, Vec<f64>) {
        let x: Vec<Vec<f64>> = (0..300)
            .map(|i| vec![(i % 30) as f64, (i / 30) as f64])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| 0.1 * r[0] + (r[1] * 0.7).cos()).collect();
        (x, y)
    }

    #[test]
    fn squared_loss_fits_and_is_reproducible() {
        let (x, y) = data();
        let p = BoostParams {
            trees: 200,
            learning_rate: 0.1,
            max_depth: 4,
            min_samples_leaf: 1,
            subsample: 0.8,
            loss: Loss::Squared,
        };
        let b = Binned::new(&x);
        let f = fit_boost(&b, &y, &p, 3);
        let err = x
            .iter()
            .zip(&y)
            .map(|(r, t)| (f.predict(r) - t).abs())
            .fold(0.0, f64::max);
        assert!(err < 0.05, "{err}");
        assert_eq!(fit_boost(&b, &y, &p, 3), f);
    }

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0]), 7.0);
        assert_eq!(median(&mut []), 0.0);
    }

    fn params(trees: usize, learning_rate: f64, max_depth: usize, loss: Loss) -> BoostParams {
        BoostParams {
            trees,
            learning_rate,
            max_depth,
            min_samples_leaf: 1,
            subsample: 1.0,
            loss,
        }
    }

    /// Without trees the ensemble is its base: the mean under the squared loss, the median
    /// under the absolute one.
    #[test]
    fn the_base_is_the_mean_or_the_median() {
        let x = vec![vec![0.0], vec![1.0], vec![2.0]];
        let y = [1.0, 2.0, 10.0];
        let b = Binned::new(&x);
        let squared = fit_boost(&b, &y, &params(0, 0.1, 3, Loss::Squared), 0);
        assert_eq!(squared.predict(&[0.0]), 13.0 / 3.0);
        let absolute = fit_boost(&b, &y, &params(0, 0.1, 3, Loss::Absolute), 0);
        assert_eq!(absolute.predict(&[0.0]), 2.0);
    }

    /// One stump on a step from 0 to 1 at x = 15 (fifteen rows each side): from the base of
    /// 0.5 the residuals are ∓0.5, and each leaf moves by the learning rate times their mean
    /// (squared) or median (absolute): 0.25 and 0.75 at a rate of 0.5, under either loss.
    #[test]
    fn one_stump_moves_each_side_by_the_rate_times_its_residual() {
        let x: Vec<Vec<f64>> = (0..30).map(|i| vec![i as f64]).collect();
        let y: Vec<f64> = (0..30).map(|i| f64::from(u8::from(i >= 15))).collect();
        let b = Binned::new(&x);
        for loss in [Loss::Squared, Loss::Absolute] {
            let f = fit_boost(&b, &y, &params(1, 0.5, 1, loss), 0);
            assert_eq!(
                (f.predict(&[3.0]), f.predict(&[20.0])),
                (0.25, 0.75),
                "{loss:?}"
            );
        }
    }

    #[test]
    fn absolute_loss_ignores_an_outlier() {
        let (x, mut y) = data();
        let clean = y.clone();
        y[45] += 50.0;
        let p = BoostParams {
            trees: 300,
            learning_rate: 0.1,
            max_depth: 3,
            min_samples_leaf: 3,
            subsample: 1.0,
            loss: Loss::Absolute,
        };
        let f = fit_boost(&Binned::new(&x), &y, &p, 0);
        let row = &x[45];
        assert!(
            (f.predict(row) - clean[45]).abs() < 1.0,
            "{}",
            f.predict(row)
        );
        // and fits the other rows, typically within 0.05
        let mut errors: Vec<f64> = (0..x.len())
            .filter(|&i| i != 45)
            .map(|i| (f.predict(&x[i]) - clean[i]).abs())
            .collect();
        let typical = median(&mut errors);
        assert!(typical < 0.05, "{typical}");
    }
}
