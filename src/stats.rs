//! Pure statistics used by the measurement protocol and by model evaluation. No GPU code here:
//! the harness and the trainer share these functions and their edge cases are tested once.

/// The paper's "sorted median": sort the timed samples and average the middle `keep` of them
/// (mean of the middle 5 of 10 by default). With fewer than `keep` samples all are averaged;
/// when the count and `keep` differ in parity the window leans to the faster side.
pub fn sorted_median(samples: &[f64], keep: usize) -> Option<f64> {
    if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let keep = keep.clamp(1, sorted.len());
    let start = (sorted.len() - keep) / 2;
    let window = &sorted[start..start + keep];
    Some(window.iter().sum::<f64>() / keep as f64)
}

/// Linear-interpolated percentile (`q` in 0..=100) of unsorted values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(percentile_sorted(&sorted, q))
}

/// Percentile of already sorted values.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    let rank = (q / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    sorted[lo] * (1.0 - frac) + sorted[hi] * frac
}

/// Absolute percentage errors (in percent) of predictions against positive actual values.
pub fn ape(actual: &[f64], predicted: &[f64]) -> Vec<f64> {
    actual
        .iter()
        .zip(predicted)
        .map(|(a, p)| ((p - a) / a).abs() * 100.0)
        .collect()
}

/// Mean absolute percentage error, in percent.
pub fn mape(actual: &[f64], predicted: &[f64]) -> f64 {
    mean(&ape(actual, predicted))
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Error statistics of predictions against measurements (error = predicted / measured − 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorStats {
    /// Runs compared.
    pub runs: usize,
    /// Mean |error|, percent.
    pub mean_abs_percent: f64,
    /// Largest |error|, percent.
    pub max_abs_percent: f64,
    /// Mean signed error, percent: negative = predictions too fast.
    pub bias_percent: f64,
}

impl ErrorStats {
    /// Statistics of (predicted, measured) pairs.
    pub fn of(pairs: impl Iterator<Item = (f64, f64)>) -> ErrorStats {
        let errors: Vec<f64> = pairs
            .filter(|(p, m)| p.is_finite() && *m > 0.0)
            .map(|(p, m)| 100.0 * (p / m - 1.0))
            .collect();
        let n = errors.len();
        if n == 0 {
            return ErrorStats::default();
        }
        ErrorStats {
            runs: n,
            mean_abs_percent: errors.iter().map(|e| e.abs()).sum::<f64>() / n as f64,
            max_abs_percent: errors.iter().fold(0.0, |a, e| a.max(e.abs())),
            bias_percent: errors.iter().sum::<f64>() / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_median_of_ten_averages_middle_five() {
        // sorted: 1..=10 -> middle five are 3,4,5,6,7 -> mean 5
        let s = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0];
        assert_eq!(sorted_median(&s, 5), Some(5.0));
    }

    #[test]
    fn sorted_median_ignores_outliers() {
        let mut s = vec![100.0; 10];
        s[0] = 1e9;
        s[1] = 1e-9;
        assert_eq!(sorted_median(&s, 5), Some(100.0));
    }

    #[test]
    fn sorted_median_edge_cases() {
        assert_eq!(sorted_median(&[], 5), None);
        assert_eq!(sorted_median(&[3.0], 5), Some(3.0));
        assert_eq!(sorted_median(&[1.0, 2.0, 3.0], 5), Some(2.0));
        assert_eq!(sorted_median(&[1.0, f64::NAN], 5), None);
        // keep = 1 is the plain (lower) median
        assert_eq!(sorted_median(&[4.0, 1.0, 3.0, 2.0], 1), Some(2.0));
    }

    #[test]
    fn percentile_interpolates() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 50.0), Some(3.0));
        assert_eq!(percentile(&v, 90.0), Some(4.6));
        assert_eq!(percentile(&v, 100.0), Some(5.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    /// Errors are predicted / measured − 1 in percent; a pair without a finite prediction or a
    /// positive measurement is left out; no pairs: all zero.
    #[test]
    fn error_stats_of_pairs() {
        let pairs = [
            (110.0, 100.0),
            (90.0, 100.0),
            (150.0, 100.0),
            (f64::NAN, 100.0),
            (5.0, 0.0),
        ];
        let e = ErrorStats::of(pairs.into_iter());
        assert_eq!(e.runs, 3);
        assert!((e.mean_abs_percent - 70.0 / 3.0).abs() < 1e-9, "{e:?}");
        assert!((e.max_abs_percent - 50.0).abs() < 1e-9, "{e:?}");
        assert!((e.bias_percent - 50.0 / 3.0).abs() < 1e-9, "{e:?}");
        // too fast is negative; the largest |error| may be a negative one
        let e = ErrorStats::of([(60.0, 100.0), (105.0, 100.0)].into_iter());
        assert!((e.max_abs_percent - 40.0).abs() < 1e-9, "{e:?}");
        assert!((e.bias_percent + 17.5).abs() < 1e-9, "{e:?}");
        assert_eq!(ErrorStats::of(std::iter::empty()), ErrorStats::default());
    }

    #[test]
    fn mape_in_percent() {
        assert!((mape(&[100.0, 200.0], &[110.0, 180.0]) - 10.0).abs() < 1e-12);
    }
}
