//! Two collections compared at the points both measured: what a driver update, a change of the
//! timing protocol or another GPU of the same kind did to the timings, per operator kind and per
//! length of call (a protocol that times the host moves the short calls; clocks move the long
//! ones).

use serde::Serialize;

use super::Measurement;
use crate::ops::OpQuery;

/// The ratios new / old of one group of common points.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RatioGroup {
    pub label: String,
    pub points: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Points measured (status ok) in both.
    pub common: usize,
    pub only_old: usize,
    pub only_new: usize,
    /// Per operator kind, phase and type (and role, where it names another kernel).
    pub by_kind: Vec<RatioGroup>,
    /// Per operator kind and length of the old call.
    pub by_old_time: Vec<RatioGroup>,
}

/// Upper bounds (µs) of the old-time bins; the last bin is open.
const TIME_BINS_US: [f64; 3] = [50.0, 200.0, 1000.0];

fn time_bin(us: f64) -> usize {
    TIME_BINS_US.iter().take_while(|b| us >= **b).count()
}

fn time_bin_label(i: usize) -> String {
    match i {
        0 => "< 50 µs".into(),
        1 => "50–200 µs".into(),
        2 => "200 µs–1 ms".into(),
        _ => "≥ 1 ms".into(),
    }
}

fn kind_label(q: &OpQuery) -> String {
    let role = q
        .role
        .filter(|r| r.is_another_kernel())
        .map(|r| format!(" {}", r.name()))
        .unwrap_or_default();
    format!("{} {} {}{role}", q.op, q.phase, q.dtype)
}

fn group(label: String, mut ratios: Vec<f64>) -> RatioGroup {
    ratios.sort_by(f64::total_cmp);
    RatioGroup {
        label,
        points: ratios.len(),
        median: crate::stats::percentile_sorted(&ratios, 50.0),
        p10: crate::stats::percentile_sorted(&ratios, 10.0),
        p90: crate::stats::percentile_sorted(&ratios, 90.0),
    }
}

/// Compares the rows of `new` with those of `old` at every point both measured; `None` when
/// they share none.
pub fn compare(old: &[Measurement], new: &[Measurement]) -> Option<Comparison> {
    let ok = |rows: &[Measurement]| -> std::collections::HashMap<OpQuery, f64> {
        rows.iter()
            .filter(|r| r.is_ok() && r.time_us > 0.0)
            .map(|r| (r.query, r.time_us))
            .collect()
    };
    let (old_t, new_t) = (ok(old), ok(new));
    let mut by_kind: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    let mut by_time: std::collections::BTreeMap<(&str, usize), Vec<f64>> = Default::default();
    let mut common = 0;
    for (q, &before) in &old_t {
        let Some(&after) = new_t.get(q) else {
            continue;
        };
        common += 1;
        let ratio = after / before;
        by_kind.entry(kind_label(q)).or_default().push(ratio);
        by_time
            .entry((q.op.name(), time_bin(before)))
            .or_default()
            .push(ratio);
    }
    if common == 0 {
        return None;
    }
    Some(Comparison {
        common,
        only_old: old_t.len() - common,
        only_new: new_t.len() - common,
        by_kind: by_kind.into_iter().map(|(l, r)| group(l, r)).collect(),
        by_old_time: by_time
            .into_iter()
            .map(|((op, i), r)| group(format!("{op} {}", time_bin_label(i)), r))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::tests::gemm;
    use crate::dataset::Status;

    #[test]
    fn short_and_long_calls_are_told_apart() {
        // the host's 10 µs left the short calls; the long ones got 3 % faster
        let old = [
            gemm(1, 30.0),
            gemm(2, 40.0),
            gemm(3, 2000.0),
            gemm(4, 3000.0),
            gemm(5, 7.0),
        ];
        let new = [
            gemm(1, 20.0),
            gemm(2, 30.0),
            gemm(3, 1940.0),
            gemm(4, 2910.0),
            gemm(6, 9.0),
        ];
        let c = compare(&old, &new).unwrap();
        assert_eq!((c.common, c.only_old, c.only_new), (4, 1, 1));
        assert_eq!(c.by_old_time.len(), 2);
        assert_eq!(c.by_old_time[0].label, "gemm < 50 µs");
        assert!((c.by_old_time[0].median - (20.0 / 30.0 + 0.75) / 2.0).abs() < 1e-12);
        assert_eq!(c.by_old_time[1].label, "gemm ≥ 1 ms");
        assert!((c.by_old_time[1].median - 0.97).abs() < 1e-12);
        assert_eq!(c.by_kind.len(), 1);
        assert_eq!(c.by_kind[0].points, 4);
        assert!(compare(&old, &[gemm(9, 1.0)]).is_none());
    }

    fn labels_and_points(groups: &[RatioGroup]) -> Vec<(&str, usize)> {
        groups
            .iter()
            .map(|g| (g.label.as_str(), g.points))
            .collect()
    }

    /// A call of exactly a bin's bound belongs to the bin above it; each bin has its label.
    #[test]
    fn the_time_bins_start_at_their_bounds() {
        let old: Vec<Measurement> = [49.9, 50.0, 199.9, 200.0, 999.9, 1000.0]
            .iter()
            .enumerate()
            .map(|(i, &us)| gemm(i as u64 + 1, us))
            .collect();
        let new = old.clone();
        let c = compare(&old, &new).unwrap();
        assert_eq!(
            labels_and_points(&c.by_old_time),
            [
                ("gemm < 50 µs", 1),
                ("gemm 50–200 µs", 2),
                ("gemm 200 µs–1 ms", 2),
                ("gemm ≥ 1 ms", 1)
            ]
        );
    }

    /// The spread is the 10th and 90th percentile of the ratios; a skipped row or one of no
    /// time is not a point; a role naming another kernel is a kind of its own.
    #[test]
    fn ratios_spread_and_only_measured_points_count() {
        let old: Vec<Measurement> = (1..=11).map(|m| gemm(m, 100.0)).collect();
        let mut new: Vec<Measurement> = (1..=11).map(|m| gemm(m, 89.0 + m as f64)).collect();
        let g = &compare(&old, &new).unwrap().by_kind[0];
        assert_eq!((g.label.as_str(), g.points), ("gemm fwd bf16", 11));
        for (got, want) in [(g.p10, 0.91), (g.median, 0.95), (g.p90, 0.99)] {
            assert!((got - want).abs() < 1e-12, "{got} {want}");
        }
        new[0].status = Status::Skipped;
        new[1].time_us = 0.0;
        let mut flash = gemm(12, 100.0);
        flash.query.role = Some(crate::ops::Role::FlashAttention2);
        let mut qkv = gemm(13, 100.0);
        qkv.query.role = Some(crate::ops::Role::Qkv);
        let (old, new) = (
            [old, vec![flash.clone(), qkv.clone()]].concat(),
            [new, vec![flash, qkv]].concat(),
        );
        let c = compare(&old, &new).unwrap();
        assert_eq!((c.common, c.only_old, c.only_new), (11, 2, 0));
        assert_eq!(
            labels_and_points(&c.by_kind),
            [
                ("gemm fwd bf16", 10),
                ("gemm fwd bf16 flash_attention_2", 1)
            ]
        );
    }
}
