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

    use super::super::testing;
    use crate::dataset::{LayerContext, Status};
    use crate::ops::{
        AttentionShape, CollectiveShape, Dtype, LookupShape, OpKind, OpQuery, Phase, Shape,
    };

    /// A forward fp16 call measured at 1 µs.
    fn row(op: OpKind, role: Option<Role>, shape: Shape) -> Measurement {
        let query = OpQuery {
            op,
            phase: Phase::Fwd,
            dtype: Dtype::Fp16,
            role,
            shape,
        };
        testing::measured(query, 1.0)
    }

    fn gemm(role: Option<Role>, m: u64) -> Measurement {
        testing::measured(testing::gemm(role, m, 1024, 1024), 1.0)
    }

    fn tokens(op: OpKind, seq: u64, width: u64) -> Measurement {
        testing::measured(testing::tokens(op, 2, seq, width), 1.0)
    }

    /// What the largest-hidden and longest-sequence hold-outs read from a row: its layer
    /// context first, else what its shape says where the shape says it.
    #[test]
    fn hidden_size_and_sequence_come_from_the_context_or_the_shape() {
        let attention = |op| {
            let shape = Shape::Attention(AttentionShape {
                batch: 1,
                seq_q: 2048,
                seq_kv: 4096,
                heads: 16,
                kv_heads: 4,
                head_dim: 128,
                causal: true,
            });
            row(op, None, shape)
        };
        let lookup = row(
            OpKind::Embedding,
            None,
            Shape::Lookup(LookupShape {
                batch: 2,
                seq: 512,
                hidden: 3072,
                vocab: 32000,
            }),
        );
        let collective = row(
            OpKind::AllReduce,
            None,
            Shape::Collective(CollectiveShape {
                bytes: 1 << 20,
                nodes: 1,
                gpus_per_node: 8,
            }),
        );
        let cases = [
            (attention(OpKind::FlashAttention), Some(2048), Some(2048)),
            // the unfused softmax's shape is an attention's, but not its hidden size
            (attention(OpKind::ScaleMaskSoftmax), None, Some(2048)),
            (lookup, Some(3072), Some(512)),
            (
                tokens(OpKind::LayerNorm, 1024, 5120),
                Some(5120),
                Some(1024),
            ),
            (tokens(OpKind::RmsNorm, 1024, 5120), Some(5120), Some(1024)),
            (
                tokens(OpKind::ResidualAdd, 1024, 5120),
                Some(5120),
                Some(1024),
            ),
            // an MLP activation's width is the MLP's, not the hidden size
            (tokens(OpKind::Gelu, 1024, 20480), None, Some(1024)),
            (gemm(Some(Role::Qkv), 4096), None, None),
            (collective, None, None),
        ];
        for (row, hidden, seq) in &cases {
            assert_eq!(hidden_of(row), *hidden, "{}", row.query);
            assert_eq!(seq_of(row), *seq, "{}", row.query);
        }
        for (mut row, _, _) in cases {
            row.context.hidden = Some(7168);
            row.context.seq = Some(8192);
            assert_eq!((hidden_of(&row), seq_of(&row)), (Some(7168), Some(8192)));
        }
    }

    /// A role's group splits on its own when it has `MIN_ROWS` rows; a pooled group's split is
    /// its roles' splits joined with a split of the rest (role-less rows and the rows of roles
    /// too small for their own), so a role's model and the pooled one are judged on the same
    /// rows. Groups too small are named.
    #[test]
    fn a_pooled_split_joins_its_roles_splits_and_small_groups_are_named() {
        let mut rows: Vec<Measurement> = Vec::new();
        let mut add = |role, n: u64| {
            let start = rows.len();
            rows.extend((1..=n).map(|i| gemm(role, 128 * i)));
            (start..rows.len()).collect::<Vec<usize>>()
        };
        let qkv = add(Some(Role::Qkv), 8);
        let up = add(Some(Role::MlpUp), 6);
        let out = add(Some(Role::AttnOut), 3);
        let roleless = add(None, 6);
        let norms: Vec<usize> = (rows.len()..rows.len() + MIN_ROWS).collect();
        rows.extend((1..=MIN_ROWS as u64).map(|i| tokens(OpKind::LayerNorm, 1024, 512 * i)));
        let refs: Vec<&Measurement> = rows.iter().collect();
        let (done, small) = split_groups(groups(&refs), SplitKind::Random, &refs, 0.25, 3);

        let find = |op, role| {
            done.iter()
                .find(|(g, _, _)| g.key.op == op && g.key.role == role)
                .unwrap_or_else(|| panic!("{op} {role:?} not split"))
        };
        let (_, qkv_t, qkv_v) = find(OpKind::Gemm, Some(Role::Qkv));
        assert_eq!((qkv_t.clone(), qkv_v.clone()), random_split(&qkv, 0.25, 3));
        let (_, up_t, up_v) = find(OpKind::Gemm, Some(Role::MlpUp));
        assert_eq!((up_t.clone(), up_v.clone()), random_split(&up, 0.25, 3));
        // the rest: the small role's 3 rows and the 6 role-less ones
        let rest: Vec<usize> = out.iter().chain(&roleless).copied().collect();
        let (rest_t, rest_v) = random_split(&rest, 0.25, 3);
        let joined = |a: &[usize], b: &[usize], c: &[usize]| {
            let mut all: Vec<usize> = a.iter().chain(b).chain(c).copied().collect();
            all.sort_unstable();
            all
        };
        let (_, pooled_t, pooled_v) = find(OpKind::Gemm, None);
        assert_eq!(*pooled_t, joined(qkv_t, up_t, &rest_t));
        assert_eq!(*pooled_v, joined(qkv_v, up_v, &rest_v));
        // exactly the fewest rows a group needs
        let (_, norm_t, norm_v) = find(OpKind::LayerNorm, None);
        assert_eq!(norm_t.len() + norm_v.len(), norms.len());
        assert_eq!(small.len(), 1);
        assert_eq!(small[0].key.role, Some(Role::AttnOut));
        assert_eq!(small[0].rows, out);

        // four norms are too few; GEMMs without a hidden size hold nothing out by it
        let refs: Vec<&Measurement> = refs
            .into_iter()
            .filter(|m| m.query.op == OpKind::Gemm)
            .chain(&rows[norms[0]..norms[4]])
            .collect();
        let (done, small) = split_groups(
            groups(&refs),
            SplitKind::HoldoutLargestHidden,
            &refs,
            0.25,
            3,
        );
        assert!(done.is_empty(), "{done:?}");
        assert_eq!(small.len(), 5);
    }

    #[test]
    fn flash_attention_2_rows_train_their_own_model_only() {
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
