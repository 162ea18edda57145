//! Which rows train and which validate a model. Training and evaluation both use these, so the
//! validation error recorded at training time is the one `stepcast eval --split random` shows.

use std::collections::BTreeMap;

use super::model::ModelKey;
use crate::dataset::Measurement;
use crate::ops::{Role, ShapeFamily};
use crate::rng::Rng;

/// The rows one model is fitted on.
#[derive(Debug, Clone)]
pub struct Group {
    /// The model the rows train.
    pub key: ModelKey,
    /// Indices into the row slice the groups were made from.
    pub rows: Vec<usize>,
}

/// Groups rows by model key: one pooled group per (op, phase, dtype) holding every row of it,
/// and one group per role present, so that a per-role model can be compared with the pooled one.
/// Rows of a role that names another kernel ([`Role::is_another_kernel`]) are in their role's
/// group alone.
pub fn groups(rows: &[&Measurement]) -> Vec<Group> {
    let mut map: BTreeMap<ModelKey, Vec<usize>> = BTreeMap::new();
    for (i, m) in rows.iter().enumerate() {
        let key = ModelKey::of(&m.query);
        if !key.role.is_some_and(Role::is_another_kernel) {
            map.entry(key.pooled()).or_default().push(i);
        }
        if key.role.is_some() {
            map.entry(key).or_default().push(i);
        }
    }
    map.into_iter()
        .map(|(key, rows)| Group { key, rows })
        .collect()
}

/// Fewest rows a group needs to be split and trained.
pub const MIN_ROWS: usize = 5;

/// A group with its training and held-out rows.
pub type SplitGroup = (Group, Vec<usize>, Vec<usize>);

/// Splits every group. A role's held-out rows are the same rows inside its pooled group, so a
/// per-role and the pooled model are compared on identical rows: a pooled group's split is the
/// union of its roles' splits (plus a split of its role-less rows). Returns the split groups
/// and those too small to split (fewer than `MIN_ROWS` rows, or nothing held out).
pub fn split_groups(
    all: Vec<Group>,
    kind: SplitKind,
    rows: &[&Measurement],
    fraction: f64,
    seed: u64,
) -> (Vec<SplitGroup>, Vec<Group>) {
    let split_one = |g: &[usize]| -> Option<(Vec<usize>, Vec<usize>)> {
        match kind {
            SplitKind::Random | SplitKind::None => Some(random_split(g, fraction, seed)),
            SplitKind::HoldoutLargestHidden => holdout_largest(g, |i| hidden_of(rows[i])),
            SplitKind::HoldoutLongestSeq => holdout_largest(g, |i| seq_of(rows[i])),
        }
    };
    let mut done: Vec<SplitGroup> = Vec::new();
    let mut too_small = Vec::new();
    for g in all.iter().filter(|g| g.key.role.is_some()) {
        match split_one(&g.rows) {
            Some((t, v)) if g.rows.len() >= MIN_ROWS && !v.is_empty() => {
                done.push((g.clone(), t, v))
            }
            _ => too_small.push(g.clone()),
        }
    }
    for g in all.iter().filter(|g| g.key.role.is_none()) {
        if g.rows.len() < MIN_ROWS {
            too_small.push(g.clone());
            continue;
        }
        let roles: Vec<&SplitGroup> = done
            .iter()
            .filter(|(r, _, _)| {
                r.key.pooled() == g.key && !r.key.role.is_some_and(Role::is_another_kernel)
            })
            .collect();
        let in_role: std::collections::HashSet<usize> = roles
            .iter()
            .flat_map(|(r, _, _)| r.rows.iter())
            .copied()
            .collect();
        // role-less rows, and rows of roles too small for a split of their own
        let roleless: Vec<usize> = g
            .rows
            .iter()
            .copied()
            .filter(|i| !in_role.contains(i))
            .collect();
        let (mut t, mut v) = if roleless.is_empty() {
            (Vec::new(), Vec::new())
        } else if roleless.len() >= MIN_ROWS {
            split_one(&roleless).unwrap_or((roleless, Vec::new()))
        } else {
            (roleless, Vec::new())
        };
        for (_, rt, rv) in roles {
            t.extend(rt);
            v.extend(rv);
        }
        t.sort_unstable();
        v.sort_unstable();
        if v.is_empty() || t.is_empty() {
            too_small.push(g.clone());
        } else {
            done.push((g.clone(), t, v));
        }
    }
    done.sort_by_key(|(g, _, _)| g.key);
    (done, too_small)
}

crate::named_enum!(
    /// How held-out rows are chosen.
    pub enum SplitKind {
        /// A random 20 % of each group (seeded), as in training.
        Random => "random",
        /// Every row of the largest hidden size of each group.
        HoldoutLargestHidden => "holdout-largest-hidden",
        /// Every row of the longest sequence of each group.
        HoldoutLongestSeq => "holdout-longest-seq",
        /// No refit: the saved models predict every row as they are (a new collection, drift).
        None => "none",
    }
);

/// (train, held out) of one group. The random split permutes the group's rows with a fixed seed
/// and holds out ⌈fraction·n⌉ of them (scikit-learn's `train_test_split` rule).
pub fn random_split(group_rows: &[usize], fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut order = group_rows.to_vec();
    Rng::new(seed).shuffle(&mut order);
    let held = ((fraction * order.len() as f64).ceil() as usize).min(order.len());
    let val = order[..held].to_vec();
    let mut train = order[held..].to_vec();
    train.sort_unstable();
    let mut val = val;
    val.sort_unstable();
    (train, val)
}

/// Held out: the rows whose `value` is the group's largest. Rows without the value stay in
/// training. `None` when no row has the value or every row has the largest.
pub fn holdout_largest(
    group_rows: &[usize],
    value: impl Fn(usize) -> Option<u64>,
) -> Option<(Vec<usize>, Vec<usize>)> {
    let max = group_rows.iter().filter_map(|&i| value(i)).max()?;
    let (val, train): (Vec<usize>, Vec<usize>) =
        group_rows.iter().partition(|&&i| value(i) == Some(max));
    (!train.is_empty()).then_some((train, val))
}

/// Hidden size of a row: its layer context, else what its own shape says.
pub fn hidden_of(m: &Measurement) -> Option<u64> {
    m.context.hidden.or(match m.query.shape {
        crate::ops::Shape::Attention(a) if m.query.op == crate::ops::OpKind::FlashAttention => {
            Some(a.heads * a.head_dim)
        }
        crate::ops::Shape::Lookup(l) => Some(l.hidden),
        crate::ops::Shape::Tokens(t)
            if matches!(
                m.query.op,
                crate::ops::OpKind::LayerNorm
                    | crate::ops::OpKind::RmsNorm
                    | crate::ops::OpKind::ResidualAdd
            ) =>
        {
            Some(t.width)
        }
        _ => None,
    })
}

/// Sequence length of a row: its layer context, else its shape's.
pub fn seq_of(m: &Measurement) -> Option<u64> {
    m.context
        .seq
        .or(match (m.query.op.family(), m.query.shape) {
            (ShapeFamily::Attention, crate::ops::Shape::Attention(a)) => Some(a.seq_q),
            (ShapeFamily::Tokens, crate::ops::Shape::Tokens(t)) => Some(t.seq),
            (ShapeFamily::Lookup, crate::ops::Shape::Lookup(l)) => Some(l.seq),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_split_is_seeded_and_disjoint() {
        let rows: Vec<usize> = (0..101).collect();
        let (t1, v1) = random_split(&rows, 0.2, 0);
        let (t2, v2) = random_split(&rows, 0.2, 0);
        assert_eq!((t1.clone(), v1.clone()), (t2, v2));
        assert_eq!(v1.len(), 21);
        assert_eq!(t1.len() + v1.len(), 101);
        assert!(v1.iter().all(|v| !t1.contains(v)));
        assert_ne!(random_split(&rows, 0.2, 1).1, v1);
    }

    #[test]
    fn holdout_takes_the_largest_value() {
        let rows: Vec<usize> = (0..6).collect();
        let vals = [Some(1), Some(3), None, Some(3), Some(2), Some(1)];
        let (train, held) = holdout_largest(&rows, |i| vals[i]).unwrap();
        assert_eq!(held, vec![1, 3]);
        assert_eq!(train, vec![0, 2, 4, 5]);
        assert!(holdout_largest(&rows, |_| None).is_none());
        assert!(holdout_largest(&rows, |_| Some(5)).is_none());
    }

    #[test]
    fn flash_attention_2_rows_train_their_own_model_only() {
        use crate::dataset::{LayerContext, Status};
        use crate::ops::{AttentionShape, Dtype, OpKind, OpQuery, Phase, Shape};
        let row = |seq: u64, role: Option<Role>| Measurement {
            query: OpQuery {
                op: OpKind::FlashAttention,
                phase: Phase::Fwd,
                dtype: Dtype::Bf16,
                role,
                shape: Shape::Attention(AttentionShape {
                    batch: 1,
                    seq_q: seq,
                    seq_kv: seq,
                    heads: 32,
                    kv_heads: 32,
                    head_dim: 128,
                    causal: true,
                }),
            },
            context: LayerContext::default(),
            time_us: seq as f64,
            samples_us: vec![seq as f64],
            status: Status::Ok,
            throttled: false,
            note: String::new(),
        };
        let rows: Vec<Measurement> = (1..=6)
            .map(|i| row(1024 * i, None))
            .chain((1..=6).map(|i| row(1024 * i, Some(Role::FlashAttention2))))
            .collect();
        let refs: Vec<&Measurement> = rows.iter().collect();
        let all = groups(&refs);
        let pooled = all.iter().find(|g| g.key.role.is_none()).unwrap();
        let fa2 = all
            .iter()
            .find(|g| g.key.role == Some(Role::FlashAttention2))
            .unwrap();
        assert_eq!(pooled.rows, (0..6).collect::<Vec<_>>());
        assert_eq!(fa2.rows, (6..12).collect::<Vec<_>>());
        // the pooled split holds none of the FA2 rows either
        let (split, _) = split_groups(all, SplitKind::Random, &refs, 0.2, 0);
        let (_, t, v) = split.iter().find(|(g, _, _)| g.key.role.is_none()).unwrap();
        assert!(t.iter().chain(v).all(|&i| i < 6));
    }
}
