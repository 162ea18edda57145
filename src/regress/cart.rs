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
    Grower::new(data, target, &params, rng, leaf_value, out).node(rows, 0);
}

/// One tree being grown: its inputs, where it is written, and scratch buffers each node's split
/// search reuses (feature order, per-bin sums and counts, sorted pairs).
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

impl<'a> Grower<'a> {
    fn new(
        data: &'a Binned,
        target: &'a [f64],
        params: &'a TreeParams,
        rng: &'a mut Rng,
        leaf_value: &'a dyn Fn(&[u32]) -> f64,
        out: &'a mut TreeBuilder,
    ) -> Grower<'a> {
        Grower {
            data,
            target,
            params,
            rng,
            leaf_value,
            out,
            features: (0..data.n_features()).collect(),
            sums: vec![0.0; MAX_BINS + 1],
            counts: vec![0; MAX_BINS + 1],
            pairs: Vec::new(),
        }
    }

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
    use super::super::flat::FlatForest;
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

    /// Quantile bins count rows, not distinct values: a value repeated past a bin's share of the
    /// rows closes its bin alone; the largest values always close the last bin.
    #[test]
    fn quantile_bins_weigh_repeated_values_and_close_the_last_bin() {
        // 5,000 zeros, then 1,000 distinct values: about 23 rows a bin
        let mut values = vec![0.0f32; 5000];
        values.extend((1..=1000).map(|i| i as f32));
        let (bins, thr) = bin_column(&values);
        assert_eq!(bins[0], 0);
        assert_eq!(
            bins[5000], 1,
            "the first value after the zeros opens a bin of its own"
        );
        let last = *bins.iter().max().unwrap() as usize;
        assert_eq!(last, thr.len());
        assert_eq!(bins[values.len() - 1] as usize, last);
        // 8,161 rows: 8,161 / 255 × 255 rounds above 8,161, so only the rule that the largest
        // value closes a bin keeps the last rows from a bin past the thresholds
        assert!(8161.0 / MAX_BINS as f64 * MAX_BINS as f64 > 8161.0);
        let values: Vec<f32> = (0..8161).map(|i| i as f32).collect();
        let (bins, thr) = bin_column(&values);
        assert_eq!(*bins.last().unwrap() as usize, thr.len());
        assert!(thr.len() < MAX_BINS);
    }

    /// A tree of leaf means grown on one feature `x`.
    fn tree(x: &[f64], y: &[f64], max_depth: usize, min_samples_leaf: usize) -> FlatForest {
        let data = Binned::new(&column(x.iter().copied()));
        let mut rows: Vec<u32> = (0..y.len() as u32).collect();
        let mut b = TreeBuilder::default();
        let params = TreeParams {
            max_depth,
            min_samples_leaf,
            max_features: 1.0,
        };
        let mean =
            |rows: &[u32]| rows.iter().map(|&r| y[r as usize]).sum::<f64>() / rows.len() as f64;
        grow(
            &data,
            y,
            &mut rows,
            &params,
            &mut Rng::new(0),
            &mean,
            &mut b,
        );
        b.finish(1.0, 0.0, 1)
    }

    fn grown(x: &[f64], y: &[f64], max_depth: usize, min_samples_leaf: usize) -> usize {
        tree(x, y, max_depth, min_samples_leaf).node_count()
    }

    /// The split `best_split` picks for `rows` of (`x`, `y`): (feature, bin, gain).
    fn best(
        x: &[Vec<f64>],
        y: &[f64],
        rows: &[u32],
        min_samples_leaf: usize,
        max_features: f64,
        rng: &mut Rng,
    ) -> Option<(usize, usize, f64)> {
        let data = Binned::new(x);
        let params = TreeParams {
            max_depth: 1,
            min_samples_leaf,
            max_features,
        };
        let mut out = TreeBuilder::default();
        let leaf = |_: &[u32]| 0.0;
        let mut grower = Grower::new(&data, y, &params, rng, &leaf, &mut out);
        grower.best_split(rows).map(|s| (s.feature, s.bin, s.gain))
    }

    fn column(values: impl IntoIterator<Item = f64>) -> Vec<Vec<f64>> {
        values.into_iter().map(|v| vec![v]).collect()
    }

    /// The gain of a split is the fall in squared error, Σ_side sum² / n − total² / n: on
    /// targets 0, 0, 0, 10 the cut before the 10 removes 100 − 25 = 75 (the others 8⅓ and
    /// 25). The same from the histogram sweep (every row at the node) and from sorting a node
    /// with fewer rows than bins; a tie goes to the first cut.
    #[test]
    fn the_best_split_has_the_gain_worked_by_hand_and_ties_go_first() {
        let rng = &mut Rng::new(0);
        let x = column((0..8).map(f64::from));
        let y = [0.0, 0.0, 0.0, 10.0, 5.0, 5.0, 5.0, 5.0];
        // rows 0–3 of eight bins: the sorted path
        assert_eq!(best(&x, &y, &[0, 1, 2, 3], 1, 1.0, rng), Some((0, 2, 75.0)));
        // the same four rows as a whole column: the histogram
        let y4 = &y[..4];
        assert_eq!(
            best(&x[..4], y4, &[0, 1, 2, 3], 1, 1.0, rng),
            Some((0, 2, 75.0))
        );
        // 0, 1, 1, 0: cutting after the first or before the last both remove 1/3
        let tie = [0.0, 1.0, 1.0, 0.0];
        let (f, bin, gain) = best(&x[..4], &tie, &[0, 1, 2, 3], 1, 1.0, rng).unwrap();
        assert_eq!((f, bin), (0, 0));
        assert!((gain - 1.0 / 3.0).abs() < 1e-12);
        let (_, bin, _) = best(
            &x,
            &[tie.as_slice(); 2].concat(),
            &[0, 1, 2, 3],
            1,
            1.0,
            rng,
        )
        .unwrap();
        assert_eq!(bin, 0);
        // of two features that cut alike, the first
        let twice: Vec<Vec<f64>> = (0..4).map(|i| vec![i as f64, i as f64]).collect();
        assert_eq!(
            best(&twice, y4, &[0, 1, 2, 3], 1, 1.0, rng),
            Some((0, 2, 75.0))
        );
    }

    /// Leaves of at least `min_samples_leaf` rows on both sides: five outliers at the end of
    /// 200 rows are cut off with 55 ordinary rows when a leaf needs 60 (the leaf's mean 500/60),
    /// and likewise at the start.
    #[test]
    fn a_split_leaves_at_least_the_smallest_leaf_on_either_side() {
        let x: Vec<f64> = (0..200).map(f64::from).collect();
        let mut y = vec![0.0; 200];
        y[195..].fill(100.0);
        let t = tree(&x, &y, 1, 60);
        assert!((t.predict(&[199.0]) - 500.0 / 60.0).abs() < 1e-4);
        assert_eq!(t.predict(&[0.0]), 0.0);
        y.reverse();
        let t = tree(&x, &y, 1, 60);
        assert!((t.predict(&[0.0]) - 500.0 / 60.0).abs() < 1e-4);
        assert_eq!(t.predict(&[199.0]), 0.0);
    }

    /// A split must remove more than 1e-9 of the node's squared error: two pairs whose means
    /// differ by δ/2 gain δ²/4 out of a squared error of about 4 (a limit of 4e-9); δ = 1.79e-4
    /// (a gain of 8e-9) splits, δ = 8.9e-5 (2e-9) does not. Targets near 10, so the node's sum
    /// of squares (about 480) is not its squared error.
    #[test]
    fn a_split_must_remove_a_meaningful_share_of_the_spread() {
        let x = [0.0, 0.0, 1.0, 1.0];
        for (delta, nodes) in [(1.79e-4, 3), (8.9e-5, 1)] {
            let y = [10.0, 12.0, 10.0, 12.0 + delta];
            assert_eq!(grown(&x, &y, 1, 1), nodes, "δ {delta}");
        }
        // a constant target (not exact in binary) is not split on rounding noise: summed over
        // 50 rows, 1000.1's sum of squares exceeds sum² / n by 8e-8 (12.34's by 4e-12)
        let x: Vec<f64> = (0..50).map(f64::from).collect();
        assert_eq!(grown(&x, &[1000.1; 50], 5, 1), 1);
        assert_eq!(grown(&x, &[12.34; 50], 5, 1), 1);
    }

    /// A random forest's node tries ⌈max_features · features⌉ of them, a fresh random subset
    /// each time: with half of four features, the one informative feature is among them about
    /// half the time. Trying every feature draws nothing from the random stream.
    #[test]
    fn a_node_tries_a_random_subset_of_the_features() {
        // feature 3 separates the targets; 1 and 2 carry a little of it (0 none)
        let x: Vec<Vec<f64>> = (0..40)
            .map(|i| {
                let f = i as f64;
                vec![(i % 5) as f64, (i % 7) as f64, (i % 3) as f64, f]
            })
            .collect();
        let y: Vec<f64> = (0..40).map(|i| if i < 20 { 0.0 } else { 1.0 }).collect();
        let rows: Vec<u32> = (0..40).collect();
        let rng = &mut Rng::new(11);
        let picks: Vec<usize> = (0..400)
            .map(|_| best(&x, &y, &rows, 1, 0.5, rng).unwrap().0)
            .collect();
        let informative = picks.iter().filter(|&&f| f == 3).count();
        assert!((160..=240).contains(&informative), "{informative} of 400");
        // without it, a weaker feature takes the split
        assert!(picks.contains(&1) && picks.contains(&2));
        // a quarter: one feature a node
        let one = (0..400)
            .filter(|_| best(&x, &y, &rows, 1, 0.25, rng).map(|b| b.0) == Some(3))
            .count();
        assert!((60..=140).contains(&one), "{one} of 400");

        let mut rng = Rng::new(5);
        assert_eq!(best(&x, &y, &rows, 1, 1.0, &mut rng).unwrap().0, 3);
        assert_eq!(rng.below(1 << 30), Rng::new(5).below(1 << 30));
    }

    /// A tree on y = x (every row its own value) splits as deep as it is allowed to and no
    /// deeper: 2^(d+1) − 1 nodes at depth d; two rows split when a leaf may hold one.
    #[test]
    fn a_tree_grows_to_its_depth_and_leaf_size_and_no_further() {
        let x: Vec<f64> = (0..200).map(f64::from).collect();
        for (depth, nodes) in [(0, 1), (1, 3), (2, 7), (3, 15)] {
            assert_eq!(grown(&x, &x, depth, 1), nodes, "depth {depth}");
        }
        // 200 rows, leaves of at least 40: halves of 100, quarters of 50, which cannot split
        assert_eq!(grown(&x, &x, 10, 40), 7);
        assert_eq!(grown(&x, &x, 10, 60), 3);
        assert_eq!(grown(&[0.0, 1.0], &[0.0, 1.0], 5, 1), 3);
        assert_eq!(grown(&[0.0, 1.0], &[0.0, 1.0], 5, 2), 1);
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
