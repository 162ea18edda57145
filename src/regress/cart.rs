//! Regression trees grown on binned features (CART, squared-error splits), shared by the random
//! forest and the gradient boosting.
//!
//! Features are cut into at most 255 bins per column (exactly, one bin per value, when a column
//! has few distinct values, as shape grids do). A node's best split comes from a histogram of
//! its rows per bin, or from sorting its rows when it has fewer rows than bins. Trees are
//! written depth-first into the flat layout of `flat::FlatForest` (left child = next node).

use crate::rng::Rng;

use super::flat::{TreeBuilder, LEAF};

/// Most histogram bins a feature is quantized into.
pub const MAX_BINS: usize = 255;

/// Training features cut into bins, column-major.
#[derive(Debug, Clone)]
pub struct Binned {
    n_rows: usize,
    /// [feature][row] -> value as the flat format compares it
    values: Vec<Vec<f32>>,
    /// [feature][row] -> bin
    bins: Vec<Vec<u8>>,
    /// [feature][b] = threshold t with `x < t` for every value in bins 0..=b and `x >= t` for
    /// every value in bins above; compared in f32.
    thresholds: Vec<Vec<f32>>,
}

impl Binned {
    /// Bins the rows of `x` (each row one feature vector of equal length).
    pub fn new(x: &[Vec<f64>]) -> Binned {
        let n_rows = x.len();
        let n_features = x.first().map_or(0, Vec::len);
        let mut bins = Vec::with_capacity(n_features);
        let mut thresholds = Vec::with_capacity(n_features);
        let mut columns = Vec::with_capacity(n_features);
        for f in 0..n_features {
            let values: Vec<f32> = x.iter().map(|row| row[f] as f32).collect();
            let (b, t) = bin_column(&values);
            bins.push(b);
            thresholds.push(t);
            columns.push(values);
        }
        Binned {
            n_rows,
            values: columns,
            bins,
            thresholds,
        }
    }

    /// Rows of the data.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Features per row.
    pub fn n_features(&self) -> usize {
        self.bins.len()
    }

    /// Value of feature `f` in row `row`, as the flat format compares it.
    pub fn value(&self, row: usize, f: usize) -> f32 {
        self.values[f][row]
    }

    fn n_bins(&self, f: usize) -> usize {
        self.thresholds[f].len() + 1
    }
}

/// Cuts one column: distinct values get a bin each while there are at most `MAX_BINS` of them,
/// otherwise bins hold runs of distinct values of roughly equal row counts.
fn bin_column(values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut sorted: Vec<f32> = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let mut distinct: Vec<(f32, usize)> = Vec::new();
    for v in sorted {
        match distinct.last_mut() {
            Some((last, count)) if *last == v => *count += 1,
            _ => distinct.push((v, 1)),
        }
    }
    // upper[b] = largest distinct value in bin b
    let mut upper: Vec<f32> = Vec::new();
    let mut lower: Vec<f32> = Vec::new();
    if distinct.len() <= MAX_BINS {
        upper = distinct.iter().map(|d| d.0).collect();
        lower = upper.clone();
    } else {
        let target = values.len() as f64 / MAX_BINS as f64;
        let mut seen = 0usize;
        let mut start: Option<f32> = None;
        for (i, &(v, c)) in distinct.iter().enumerate() {
            start.get_or_insert(v);
            seen += c;
            let last = i + 1 == distinct.len();
            if last || seen as f64 >= target * (upper.len() + 1) as f64 {
                lower.push(start.take().unwrap());
                upper.push(v);
            }
        }
    }
    let thresholds = upper
        .iter()
        .zip(lower.iter().skip(1))
        .map(|(&hi, &next)| {
            let mid = ((hi as f64 + next as f64) / 2.0) as f32;
            if mid > hi {
                mid
            } else {
                next
            }
        })
        .collect();
    let bins = values
        .iter()
        .map(|v| upper.partition_point(|u| u < v) as u8)
        .collect();
    (bins, thresholds)
}

/// How a tree is grown.
#[derive(Debug, Clone, Copy)]
pub struct TreeParams {
    /// Deepest a tree may grow.
    pub max_depth: usize,
    /// Fewest rows in a leaf.
    pub min_samples_leaf: usize,
    /// Fraction of features tried at each node (random forest's `max_features`); 1.0 = all.
    pub max_features: f64,
}

struct Split {
    feature: usize,
    bin: usize,
    gain: f64,
}

/// Grows one tree on `rows` (indices into the binned data, repeats allowed) fitting `target`;
/// `leaf_value` decides the value of each leaf from its rows.
pub fn grow(
    data: &Binned,
    target: &[f64],
    rows: &mut [u32],
    params: &TreeParams,
    rng: &mut Rng,
    leaf_value: &dyn Fn(&[u32]) -> f64,
    out: &mut TreeBuilder,
) {
    // keep every tree under 2^16 nodes so child offsets fit the flat format's u16
    let mut params = *params;
    params.min_samples_leaf = params
        .min_samples_leaf
        .max(rows.len().div_ceil(super::flat::MAX_LEAVES_PER_TREE));
    out.start_tree();
    let mut grower = Grower {
        data,
        target,
        params: &params,
        rng,
        leaf_value,
        out,
        features: (0..data.n_features()).collect(),
        sums: vec![0.0; MAX_BINS + 1],
        counts: vec![0; MAX_BINS + 1],
        pairs: Vec::new(),
    };
    grower.node(rows, 0);
}

struct Grower<'a> {
    data: &'a Binned,
    target: &'a [f64],
    params: &'a TreeParams,
    rng: &'a mut Rng,
    leaf_value: &'a dyn Fn(&[u32]) -> f64,
    out: &'a mut TreeBuilder,
    features: Vec<usize>,
    sums: Vec<f64>,
    counts: Vec<u32>,
    pairs: Vec<(u8, f64)>,
}

impl Grower<'_> {
    fn node(&mut self, rows: &mut [u32], depth: usize) -> usize {
        let split = if depth < self.params.max_depth
            && rows.len() >= 2 * self.params.min_samples_leaf.max(1)
        {
            self.best_split(rows)
        } else {
            None
        };
        let Some(split) = split else {
            let value = (self.leaf_value)(rows);
            return self.out.push(LEAF, value as f32);
        };
        let bins = &self.data.bins[split.feature];
        let mut left = 0;
        for i in 0..rows.len() {
            if (bins[rows[i] as usize] as usize) <= split.bin {
                rows.swap(i, left);
                left += 1;
            }
        }
        let threshold = self.data.thresholds[split.feature][split.bin];
        let idx = self.out.push(split.feature as u8, threshold);
        let (l, r) = rows.split_at_mut(left);
        self.node(l, depth + 1);
        let right = self.node(r, depth + 1);
        self.out.set_right(idx, right);
        idx
    }

    fn best_split(&mut self, rows: &[u32]) -> Option<Split> {
        let n = rows.len();
        let (mut total, mut squares) = (0.0, 0.0);
        for &r in rows {
            let g = self.target[r as usize];
            total += g;
            squares += g * g;
        }
        let parent = total * total / n as f64;
        // a split must remove a meaningful part of the node's spread, not rounding noise
        let min_gain = 1e-9 * (squares - parent).max(0.0) + 1e-300;
        if squares - parent <= 1e-14 * squares {
            return None;
        }
        let n_features = self.features.len();
        let tried =
            ((self.params.max_features * n_features as f64).ceil() as usize).clamp(1, n_features);
        if tried < n_features {
            // partial Fisher–Yates: the first `tried` entries are a random subset
            for i in 0..tried {
                let j = i + self.rng.below(n_features - i);
                self.features.swap(i, j);
            }
        }
        let min_leaf = self.params.min_samples_leaf.max(1);
        let mut best: Option<Split> = None;
        for fi in 0..tried {
            let f = self.features[fi];
            let nb = self.data.n_bins(f);
            if nb < 2 {
                continue;
            }
            let bins = &self.data.bins[f];
            let mut consider = |bin: usize, left_n: usize, left_sum: f64| {
                let right_n = n - left_n;
                if left_n < min_leaf || right_n < min_leaf {
                    return;
                }
                let right_sum = total - left_sum;
                let gain = left_sum * left_sum / left_n as f64
                    + right_sum * right_sum / right_n as f64
                    - parent;
                if gain > best.as_ref().map_or(min_gain, |b| b.gain) {
                    best = Some(Split {
                        feature: f,
                        bin,
                        gain,
                    });
                }
            };
            if n < nb {
                // few rows: sort them by bin instead of sweeping every bin
                self.pairs.clear();
                self.pairs.extend(
                    rows.iter()
                        .map(|&r| (bins[r as usize], self.target[r as usize])),
                );
                self.pairs.sort_unstable_by_key(|p| p.0);
                let (mut left_n, mut left_sum) = (0usize, 0.0);
                for i in 0..n - 1 {
                    left_n += 1;
                    left_sum += self.pairs[i].1;
                    if self.pairs[i].0 != self.pairs[i + 1].0 {
                        consider(self.pairs[i].0 as usize, left_n, left_sum);
                    }
                }
            } else {
                self.sums[..nb].fill(0.0);
                self.counts[..nb].fill(0);
                for &r in rows {
                    let b = bins[r as usize] as usize;
                    self.sums[b] += self.target[r as usize];
                    self.counts[b] += 1;
                }
                let (mut left_n, mut left_sum) = (0usize, 0.0);
                for b in 0..nb - 1 {
                    if self.counts[b] == 0 {
                        continue;
                    }
                    left_n += self.counts[b] as usize;
                    left_sum += self.sums[b];
                    if left_n == n {
                        break;
                    }
                    consider(b, left_n, left_sum);
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_distinct_values_get_exact_bins_and_separating_thresholds() {
        let (bins, thr) = bin_column(&[3.0, 1.0, 2.0, 3.0, 1.0]);
        assert_eq!(bins, vec![2, 0, 1, 2, 0]);
        assert_eq!(thr, vec![1.5, 2.5]);
    }

    #[test]
    fn many_distinct_values_are_quantile_binned_consistently() {
        let values: Vec<f32> = (0..10_000).map(|i| (i as f32).sqrt()).collect();
        let (bins, thr) = bin_column(&values);
        assert!(thr.len() < MAX_BINS);
        for (v, b) in values.iter().zip(&bins) {
            let b = *b as usize;
            // x < thr[b] for its own bin, x >= thr[b-1] for the one below
            if b < thr.len() {
                assert!(*v < thr[b]);
            }
            if b > 0 {
                assert!(*v >= thr[b - 1]);
            }
        }
    }

    #[test]
    fn adjacent_floats_stay_separable() {
        let a = 1.0f32;
        let b = f32::from_bits(a.to_bits() + 1);
        let (bins, thr) = bin_column(&[a, b]);
        assert_eq!(bins, vec![0, 1]);
        assert!(a < thr[0] && b >= thr[0]);
    }

    #[test]
    fn a_tree_recovers_a_step_function() {
        let x: Vec<Vec<f64>> = (0..200).map(|i| vec![i as f64, (i % 7) as f64]).collect();
        let y: Vec<f64> = (0..200).map(|i| if i < 120 { 1.0 } else { 5.0 }).collect();
        let data = Binned::new(&x);
        let mut rows: Vec<u32> = (0..200).collect();
        let mut b = TreeBuilder::default();
        let params = TreeParams {
            max_depth: 3,
            min_samples_leaf: 1,
            max_features: 1.0,
        };
        let mean =
            |rows: &[u32]| rows.iter().map(|&r| y[r as usize]).sum::<f64>() / rows.len() as f64;
        grow(
            &data,
            &y,
            &mut rows,
            &params,
            &mut Rng::new(0),
            &mean,
            &mut b,
        );
        let forest = b.finish(1.0, 0.0, 2);
        assert_eq!(forest.predict(&[10.0, 0.0]), 1.0);
        assert_eq!(forest.predict(&[119.0, 3.0]), 1.0);
        assert_eq!(forest.predict(&[120.0, 3.0]), 5.0);
        assert_eq!(forest.predict(&[1e6, 3.0]), 5.0);
        // one split suffices: root + 2 leaves
        assert_eq!(forest.node_count(), 3);
    }
}
