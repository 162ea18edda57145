//! Our own flat-tree format: every tree of a forest or boosted ensemble stored depth-first in
//! three parallel arrays (split feature, threshold-or-leaf-value, offset of the right child; the
//! left child is the next node). Prediction is a tight loop over these arrays, a few
//! nanoseconds per tree level, and needs no training library at run time.
//!
//! On disk (in a models directory's `models.bin`) a forest is its header (features, base,
//! scale, tree and node counts) in the bundle's index and one binary area: every tree's root
//! (u32 LE), then every node's `feature` u8 (255 = leaf), `value` f32 LE and `right` u16 LE
//! offset — read with one copy, no parsing, and checked before use.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Feature index marking a leaf.
pub const LEAF: u8 = u8::MAX;

/// Trees are grown with at most this many leaves so that right-child offsets fit in a u16.
pub const MAX_LEAVES_PER_TREE: usize = 30_000;

/// Where a forest's node bytes live: grown in memory, or in a mapped `models.bin`.
#[derive(Clone)]
pub struct NodeBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl NodeBytes {
    /// Bytes held in memory.
    pub fn owned(bytes: Vec<u8>) -> NodeBytes {
        let len = bytes.len();
        NodeBytes {
            owner: Arc::new(bytes),
            start: 0,
            len,
        }
    }

    /// `len` bytes from `start` of a shared buffer (a mapped file); `None` if out of range.
    pub fn shared(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<NodeBytes> {
        let end = start.checked_add(len)?;
        ((*owner).as_ref().len() >= end).then_some(NodeBytes { owner, start, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for NodeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeBytes({} bytes)", self.len)
    }
}

impl PartialEq for NodeBytes {
    fn eq(&self, other: &NodeBytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// A sum of trees: `base + scale · Σ tree(x)` (a forest averages with scale = 1/trees; boosting
/// adds learning-rate-scaled leaves to a base score with scale = 1).
///
/// The nodes are one byte string: every `feature` (u8, 255 = leaf), then every `value` (f32
/// LE: threshold or leaf value), then every `right` offset (u16 LE; the left child is the next
/// node) — the same bytes on disk and in memory, so a mapped file is used without a copy.
/// Walking a tree is checked (it ends on any node bytes), and forests are validated when they
/// are trained, before they are written.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatForest {
    /// Features a row has.
    pub n_features: usize,
    /// Added to the scaled sum of the trees.
    pub base: f64,
    /// Multiplies the sum of the trees (1/trees for a forest).
    pub scale: f64,
    roots: Vec<u32>,
    nodes: usize,
    bytes: NodeBytes,
}

/// The node arrays of a forest, read from its bytes.
struct Nodes<'a> {
    bytes: &'a [u8],
    n: usize,
}

impl Nodes<'_> {
    #[inline]
    fn feature(&self, i: usize) -> u8 {
        self.bytes[i]
    }

    #[inline]
    fn value(&self, i: usize) -> f32 {
        let at = self.n + 4 * i;
        f32::from_le_bytes([
            self.bytes[at],
            self.bytes[at + 1],
            self.bytes[at + 2],
            self.bytes[at + 3],
        ])
    }

    #[inline]
    fn right(&self, i: usize) -> usize {
        let at = 5 * self.n + 2 * i;
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]]) as usize
    }

    /// The leaf `x` reaches from node `i`; NaN if the bytes lead out of the forest (a corrupt
    /// one). The step to the next node is chosen without a branch (the comparison is a coin
    /// flip the CPU cannot predict); every step moves forward, so a walk always ends.
    #[inline]
    fn walk(&self, mut i: usize, x: &[f32; 32]) -> f32 {
        while i < self.n {
            let f = self.feature(i);
            let v = self.value(i);
            if f == LEAF {
                return v;
            }
            // a validated forest splits only on features < 32; the mask keeps a corrupt one
            // inside the row
            let go_left = x[usize::from(f & 31)] < v;
            let right = self.right(i).max(1);
            i += if go_left { 1 } else { right };
        }
        f32::NAN
    }
}

fn as_f32(x: &[f64]) -> [f32; 32] {
    let mut xf = [0f32; 32];
    for (dst, src) in xf.iter_mut().zip(x) {
        *dst = *src as f32;
    }
    xf
}

impl FlatForest {
    fn nodes(&self) -> Nodes<'_> {
        Nodes {
            bytes: self.bytes.as_slice(),
            n: self.nodes,
        }
    }

    /// The forest's output for feature row `x`.
    pub fn predict(&self, x: &[f64]) -> f64 {
        let xf = as_f32(x);
        let nodes = self.nodes();
        let sum: f64 = self
            .roots
            .iter()
            .map(|&root| nodes.walk(root as usize, &xf) as f64)
            .sum();
        self.base + self.scale * sum
    }

    /// Each tree's own output (`base + tree(x)` for a forest with `scale = 1/trees`, i.e. what a
    /// forest of that single tree would predict); used for the spread of a forest.
    pub fn tree_predictions(&self, x: &[f64]) -> Vec<f64> {
        let xf = as_f32(x);
        let nodes = self.nodes();
        self.roots
            .iter()
            .map(|&root| self.base + nodes.walk(root as usize, &xf) as f64)
            .collect()
    }

    /// Trees.
    pub fn tree_count(&self) -> usize {
        self.roots.len()
    }

    /// Nodes of all trees.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Bytes of the trees as stored.
    pub fn stored_bytes(&self) -> usize {
        self.nodes * 7 + self.roots.len() * 4
    }

    /// Checks that every walk stays inside the forest and ends on a finite leaf, so a forest
    /// that passes cannot make `predict` loop, leave the forest or return a non-number.
    pub fn validate(&self) -> Result<(), String> {
        let nodes = self.nodes();
        let n = self.nodes;
        if self.bytes.len != n * 7 {
            return Err("node bytes do not match the node count".to_string());
        }
        if self.n_features > 32 {
            return Err(format!("{} features (at most 32)", self.n_features));
        }
        for &root in &self.roots {
            if root as usize >= n {
                return Err(format!("tree root {root} beyond {n} nodes"));
            }
        }
        for i in 0..n {
            let v = nodes.value(i);
            if !v.is_finite() {
                return Err(format!("node {i} holds {v}, not a finite number"));
            }
            let f = nodes.feature(i);
            if f == LEAF {
                continue;
            }
            if f as usize >= self.n_features {
                return Err(format!(
                    "node {i} splits on feature {f} of {}",
                    self.n_features
                ));
            }
            // the left child, i + 1, lies before the right one
            if nodes.right(i) < 2 || i + nodes.right(i) >= n {
                return Err(format!("node {i} has children outside the forest"));
            }
        }
        if !self.base.is_finite() || !self.scale.is_finite() {
            return Err("base or scale is not finite".to_string());
        }
        Ok(())
    }
}

/// Collects trees as they are grown.
#[derive(Debug, Default)]
pub struct TreeBuilder {
    roots: Vec<u32>,
    feature: Vec<u8>,
    value: Vec<f32>,
    right: Vec<u16>,
}

impl TreeBuilder {
    /// Starts a new tree at the next node.
    pub fn start_tree(&mut self) {
        self.roots.push(self.feature.len() as u32);
    }

    /// Appends a node (split or leaf) and returns its index.
    pub fn push(&mut self, feature: u8, value: f32) -> usize {
        self.feature.push(feature);
        self.value.push(value);
        self.right.push(0);
        self.feature.len() - 1
    }

    /// Points split node `node` at its right child, node `right`.
    pub fn set_right(&mut self, node: usize, right: usize) {
        self.right[node] = u16::try_from(right - node).expect("tree kept under 2^16 nodes");
    }

    /// Index of the next node to be pushed.
    pub fn len(&self) -> usize {
        self.feature.len()
    }

    /// Whether no node was pushed.
    pub fn is_empty(&self) -> bool {
        self.feature.is_empty()
    }

    /// Output of the most recently started tree for a row whose feature `f` is `value(f)`.
    pub fn eval_last(&self, value: impl Fn(usize) -> f32) -> f32 {
        let mut i = *self.roots.last().expect("a tree was started") as usize;
        loop {
            let f = self.feature[i];
            if f == LEAF {
                return self.value[i];
            }
            i += if value(f as usize) < self.value[i] {
                1
            } else {
                self.right[i] as usize
            };
        }
    }

    /// The forest of the trees pushed, `base + scale · Σ tree(x)`.
    pub fn finish(self, scale: f64, base: f64, n_features: usize) -> FlatForest {
        let n = self.feature.len();
        let mut bytes = Vec::with_capacity(n * 7);
        bytes.extend_from_slice(&self.feature);
        for v in &self.value {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for r in &self.right {
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        FlatForest {
            n_features,
            base,
            scale,
            roots: self.roots,
            nodes: n,
            bytes: NodeBytes::owned(bytes),
        }
    }
}

/// What a bundle's index holds of a forest; the roots and nodes are its binary area.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ForestHeader {
    /// Features a row has.
    pub n_features: usize,
    /// Added to the scaled sum of the trees.
    pub base: f64,
    /// Multiplies the sum of the trees.
    pub scale: f64,
    /// Trees.
    pub trees: usize,
    /// Nodes of all trees.
    pub nodes: usize,
}

impl ForestHeader {
    /// Bytes of the binary area.
    pub fn area_bytes(&self) -> Option<usize> {
        self.trees
            .checked_mul(4)?
            .checked_add(self.nodes.checked_mul(7)?)
    }
}

impl FlatForest {
    /// The forest's shape, as a bundle's index stores it.
    pub fn header(&self) -> ForestHeader {
        ForestHeader {
            n_features: self.n_features,
            base: self.base,
            scale: self.scale,
            trees: self.roots.len(),
            nodes: self.nodes,
        }
    }

    /// The forest as stored: every root (u32 LE), then the node bytes.
    pub fn area(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.stored_bytes());
        for r in &self.roots {
            out.extend_from_slice(&r.to_le_bytes());
        }
        out.extend_from_slice(self.bytes.as_slice());
        out
    }

    /// A forest over an area (`FlatForest::area`'s bytes) at `start` of a shared buffer, used
    /// in place. Not validated: forests are validated when trained and areas checksummed.
    pub fn from_shared_area(
        h: &ForestHeader,
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
    ) -> Result<FlatForest, String> {
        let len = h.area_bytes().ok_or("the forest's size overflows")?;
        let area = NodeBytes::shared(owner, start, len)
            .ok_or_else(|| format!("{len} bytes of trees run past the end of the file"))?;
        let roots_len = h.trees * 4;
        let roots = area.as_slice()[..roots_len]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(FlatForest {
            n_features: h.n_features,
            base: h.base,
            scale: h.scale,
            roots,
            nodes: h.nodes,
            bytes: NodeBytes {
                owner: area.owner,
                start: start + roots_len,
                len: len - roots_len,
            },
        })
    }

    /// A forest from its header and an area of bytes, validated.
    pub fn from_area(h: &ForestHeader, bytes: &[u8]) -> Result<FlatForest, String> {
        if h.area_bytes() != Some(bytes.len()) {
            return Err(format!(
                "{} bytes of trees where the index says {} trees of {} nodes",
                bytes.len(),
                h.trees,
                h.nodes
            ));
        }
        let forest = Self::from_shared_area(h, Arc::new(bytes.to_vec()), 0)?;
        forest.validate()?;
        Ok(forest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// x0 < 2 ? 10 : (x1 < 5 ? 20 : 30), and a second tree that always says 1.
    fn small() -> FlatForest {
        let mut b = TreeBuilder::default();
        b.start_tree();
        let root = b.push(0, 2.0);
        b.push(LEAF, 10.0);
        let inner = b.push(1, 5.0);
        b.set_right(root, inner);
        b.push(LEAF, 20.0);
        let r = b.push(LEAF, 30.0);
        b.set_right(inner, r);
        b.start_tree();
        b.push(LEAF, 1.0);
        b.finish(1.0, 0.5, 2)
    }

    #[test]
    fn predicts_by_walking_the_arrays() {
        let f = small();
        assert_eq!(f.predict(&[1.0, 0.0]), 0.5 + 10.0 + 1.0);
        assert_eq!(f.predict(&[3.0, 4.0]), 0.5 + 20.0 + 1.0);
        assert_eq!(f.predict(&[3.0, 5.0]), 0.5 + 30.0 + 1.0);
        assert_eq!(f.tree_predictions(&[3.0, 5.0]), vec![30.5, 1.5]);
    }

    fn round_trip(f: &FlatForest) -> Result<FlatForest, String> {
        FlatForest::from_area(&f.header(), &f.area())
    }

    #[test]
    fn header_and_nodes_round_trip_exactly() {
        let f = small();
        assert_eq!(round_trip(&f).unwrap(), f);
    }

    #[test]
    fn corrupt_forests_are_refused() {
        let mut f = small();
        f.n_features = 1; // node 2 splits on feature 1
        assert!(round_trip(&f).unwrap_err().contains("feature 1"));
        let f = small();
        let e = FlatForest::from_area(&f.header(), &f.area()[1..]).unwrap_err();
        assert!(e.contains("the index says"), "{e}");
        // a leaf that is not a number
        let (checked, _) = corrupted(value_at(1), &f32::NAN.to_le_bytes());
        let e = checked.unwrap_err();
        assert!(e.contains("not a finite number"), "{e}");
    }

    /// Byte offsets in `small()`'s area: two roots (8 bytes), then six features, six values
    /// and six right offsets.
    const ROOTS: usize = 8;
    const NODES: usize = 6;
    fn value_at(node: usize) -> usize {
        ROOTS + NODES + 4 * node
    }
    fn right_at(node: usize) -> usize {
        ROOTS + 5 * NODES + 2 * node
    }

    /// `small()`'s area with `bytes` written at `at`, read back (validated) and unvalidated.
    fn corrupted(at: usize, bytes: &[u8]) -> (Result<FlatForest, String>, FlatForest) {
        let f = small();
        let mut area = f.area();
        area[at..at + bytes.len()].copy_from_slice(bytes);
        let shared = FlatForest::from_shared_area(&f.header(), Arc::new(area.clone()), 0);
        (FlatForest::from_area(&f.header(), &area), shared.unwrap())
    }

    /// Every way a forest's bytes can lead a walk astray is refused by name; unvalidated, the
    /// same bytes still give an answer (NaN where the walk leaves the forest), never a panic
    /// or an endless loop.
    #[test]
    fn every_corruption_a_walk_could_meet_is_refused() {
        let x = [3.0, 5.0];
        // a root past the last node
        let (checked, raw) = corrupted(4, &7u32.to_le_bytes());
        assert_eq!(checked.unwrap_err(), "tree root 7 beyond 6 nodes");
        assert!(raw.predict(&x).is_nan());
        // a right child that is the node itself or the next (offset 0 or 1): a walk that
        // does not branch
        for offset in [0u16, 1] {
            let (checked, raw) = corrupted(right_at(0), &offset.to_le_bytes());
            assert_eq!(
                checked.unwrap_err(),
                "node 0 has children outside the forest"
            );
            assert!(raw.predict(&x).is_finite());
        }
        // a right child past the last node
        for (node, offset) in [(0, 6u16), (2, 4)] {
            let (checked, raw) = corrupted(right_at(node), &offset.to_le_bytes());
            let e = checked.unwrap_err();
            assert_eq!(e, format!("node {node} has children outside the forest"));
            assert!(raw.predict(&x).is_nan());
        }
        // the last node a split: its left child would be past the end
        let (checked, raw) = corrupted(ROOTS + 5, &[0]);
        assert_eq!(
            checked.unwrap_err(),
            "node 5 has children outside the forest"
        );
        assert!(raw.predict(&[0.0, 0.0]).is_nan());
        // a split on a feature beyond any row's 32: masked into the row unvalidated
        let (checked, raw) = corrupted(ROOTS + 2, &[200]);
        assert_eq!(checked.unwrap_err(), "node 2 splits on feature 200 of 2");
        assert!(raw.predict(&x).is_finite());
        // an infinite threshold
        let (checked, _) = corrupted(value_at(0), &f32::INFINITY.to_le_bytes());
        assert_eq!(
            checked.unwrap_err(),
            "node 0 holds inf, not a finite number"
        );
        // the header's own numbers
        let mut f = small();
        f.n_features = 33;
        assert_eq!(f.validate().unwrap_err(), "33 features (at most 32)");
        for (base, scale) in [(f64::NAN, 1.0), (0.5, f64::INFINITY)] {
            let f = FlatForest {
                base,
                scale,
                ..small()
            };
            assert_eq!(f.validate().unwrap_err(), "base or scale is not finite");
        }
        let f = FlatForest {
            nodes: 5,
            ..small()
        };
        assert_eq!(
            f.validate().unwrap_err(),
            "node bytes do not match the node count"
        );
        assert_eq!(small().validate(), Ok(()));
        let widest = FlatForest {
            n_features: 32,
            ..small()
        };
        assert_eq!(widest.validate(), Ok(()));
    }

    /// A header whose area overflows or runs past the buffer is refused before any byte is
    /// read.
    #[test]
    fn an_area_past_its_buffer_is_refused() {
        let f = small();
        let header = f.header();
        assert_eq!(header.area_bytes(), Some(f.area().len()));
        assert_eq!(f.stored_bytes(), ROOTS + 7 * NODES);
        assert_eq!((f.tree_count(), f.node_count()), (2, NODES));
        let huge = ForestHeader {
            nodes: usize::MAX / 7 + 1,
            ..header
        };
        assert_eq!(huge.area_bytes(), None);
        let buffer: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(f.area());
        let e = FlatForest::from_shared_area(&huge, buffer.clone(), 0).unwrap_err();
        assert_eq!(e, "the forest's size overflows");
        let e = FlatForest::from_shared_area(&header, buffer.clone(), 1).unwrap_err();
        assert_eq!(e, "50 bytes of trees run past the end of the file");
        // in place at an offset of a larger buffer
        let mut padded = vec![9u8; 3];
        padded.extend(f.area());
        let at_3 = FlatForest::from_shared_area(&header, Arc::new(padded), 3).unwrap();
        assert_eq!(at_3, f);
        assert!(NodeBytes::shared(buffer.clone(), usize::MAX, 2).is_none());
        assert!(NodeBytes::shared(buffer.clone(), 0, 51).is_none());
        assert_eq!(
            NodeBytes::shared(buffer, 48, 2).map(|b| b.as_slice().to_vec()),
            Some(f.area()[48..].to_vec())
        );
    }

    /// Node bytes compare by content, wherever they live, and print their size only.
    #[test]
    fn node_bytes_compare_by_content() {
        let a = NodeBytes::owned(vec![1, 2, 3]);
        let b = NodeBytes::shared(Arc::new(vec![0u8, 1, 2, 3]), 1, 3).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, NodeBytes::owned(vec![1, 2, 4]));
        assert_eq!(format!("{a:?}"), "NodeBytes(3 bytes)");
    }

    /// The scale multiplies the trees' sum, not the base; each tree's own prediction is the
    /// base plus its leaf.
    #[test]
    fn the_scale_multiplies_the_trees_not_the_base() {
        let f = FlatForest {
            scale: 0.5,
            base: 2.0,
            ..small()
        };
        assert_eq!(f.predict(&[1.0, 0.0]), 2.0 + 0.5 * (10.0 + 1.0));
        assert_eq!(f.tree_predictions(&[1.0, 0.0]), vec![12.0, 3.0]);
    }

    /// The builder evaluates the tree it is growing as the finished forest will, and every
    /// byte of a value comes back (0.3 has none of them zero).
    #[test]
    fn the_builder_evaluates_its_last_tree() {
        let mut b = TreeBuilder::default();
        assert!(b.is_empty());
        b.start_tree();
        b.push(LEAF, 0.3);
        b.start_tree();
        let root = b.push(1, 5.0);
        b.push(LEAF, 20.0);
        let right = b.push(LEAF, 30.0);
        b.set_right(root, right);
        assert_eq!((b.len(), b.is_empty()), (4, false));
        let row = |x1: f32| move |f: usize| if f == 1 { x1 } else { -1.0 };
        assert_eq!(b.eval_last(row(4.0)), 20.0);
        assert_eq!(b.eval_last(row(5.0)), 30.0);
        let f = b.finish(1.0, 0.0, 2);
        assert_eq!(f.tree_predictions(&[0.0, 5.0]), vec![0.3f32 as f64, 30.0]);
    }
}
