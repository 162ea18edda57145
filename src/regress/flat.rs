//! Our own flat-tree format: every tree of a forest or boosted ensemble stored depth-first in
//! three parallel arrays (split feature, threshold-or-leaf-value, offset of the right child; the
//! left child is the next node). Prediction is a tight loop over these arrays, a few
//! nanoseconds per tree level, and needs no training library at run time.
//!
//! On disk the model's JSON holds the forest's header and a `.nodes` file beside it the raw
//! arrays (7 bytes a node): `feature` u8 (255 = leaf), `value` f32 LE, `right` u16 LE offset
//! from the node — read with one copy, no parsing.

use serde::{Deserialize, Serialize};

/// Feature index marking a leaf.
pub const LEAF: u8 = u8::MAX;

/// Trees are grown with at most this many leaves so that right-child offsets fit in a u16.
pub const MAX_LEAVES_PER_TREE: usize = 30_000;

/// A sum of trees: `base + scale · Σ tree(x)` (a forest averages with scale = 1/trees; boosting
/// adds learning-rate-scaled leaves to a base score with scale = 1).
#[derive(Debug, Clone, PartialEq)]
pub struct FlatForest {
    pub n_features: usize,
    pub base: f64,
    pub scale: f64,
    roots: Vec<u32>,
    feature: Vec<u8>,
    value: Vec<f32>,
    right: Vec<u16>,
}

impl FlatForest {
    pub fn predict(&self, x: &[f64]) -> f64 {
        let mut xf = [0f32; 32];
        for (dst, src) in xf.iter_mut().zip(x) {
            *dst = *src as f32;
        }
        let sum: f64 = self
            .roots
            .iter()
            .map(|&root| self.tree_value(root as usize, &xf) as f64)
            .sum();
        self.base + self.scale * sum
    }

    /// Each tree's own output (`base + tree(x)` for a forest with `scale = 1/trees`, i.e. what a
    /// forest of that single tree would predict); used for the spread of a forest.
    pub fn tree_predictions(&self, x: &[f64]) -> Vec<f64> {
        let mut xf = [0f32; 32];
        for (dst, src) in xf.iter_mut().zip(x) {
            *dst = *src as f32;
        }
        self.roots
            .iter()
            .map(|&root| self.base + self.tree_value(root as usize, &xf) as f64)
            .collect()
    }

    #[inline]
    fn tree_value(&self, mut i: usize, x: &[f32; 32]) -> f32 {
        loop {
            let f = self.feature[i];
            if f == LEAF {
                return self.value[i];
            }
            i += if x[f as usize] < self.value[i] {
                1
            } else {
                self.right[i] as usize
            };
        }
    }

    pub fn tree_count(&self) -> usize {
        self.roots.len()
    }

    pub fn node_count(&self) -> usize {
        self.feature.len()
    }

    /// Bytes of the node arrays as stored.
    pub fn stored_bytes(&self) -> usize {
        self.feature.len() * 7 + self.roots.len() * 4
    }

    /// Checks that indices stay inside the arrays, so a corrupt file cannot make `predict` loop
    /// or index out of bounds.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.feature.len();
        if self.value.len() != n || self.right.len() != n {
            return Err("node arrays differ in length".to_string());
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
            let f = self.feature[i];
            if f == LEAF {
                continue;
            }
            if f as usize >= self.n_features {
                return Err(format!(
                    "node {i} splits on feature {f} of {}",
                    self.n_features
                ));
            }
            let right = i + self.right[i] as usize;
            if self.right[i] < 2 || right >= n || i + 1 >= n {
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

    pub fn set_right(&mut self, node: usize, right: usize) {
        self.right[node] = u16::try_from(right - node).expect("tree kept under 2^16 nodes");
    }

    /// Index of the next node to be pushed.
    pub fn len(&self) -> usize {
        self.feature.len()
    }

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

    pub fn finish(self, scale: f64, base: f64, n_features: usize) -> FlatForest {
        FlatForest {
            n_features,
            base,
            scale,
            roots: self.roots,
            feature: self.feature,
            value: self.value,
            right: self.right,
        }
    }
}

/// What the model's JSON holds of a forest; the node arrays live in the `.nodes` file beside it.
#[derive(Serialize, Deserialize)]
struct Header {
    n_features: usize,
    base: f64,
    scale: f64,
    trees: usize,
    nodes: usize,
    roots: Vec<u32>,
}

impl Serialize for FlatForest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Header {
            n_features: self.n_features,
            base: self.base,
            scale: self.scale,
            trees: self.roots.len(),
            nodes: self.feature.len(),
            roots: self.roots.clone(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for FlatForest {
    /// Reads the header only: `attach_nodes` must follow.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let h = Header::deserialize(d)?;
        if h.roots.len() != h.trees {
            return Err(D::Error::custom(
                "forest: tree count does not match its roots",
            ));
        }
        Ok(FlatForest {
            n_features: h.n_features,
            base: h.base,
            scale: h.scale,
            roots: h.roots,
            feature: Vec::new(),
            value: Vec::new(),
            right: Vec::with_capacity(h.nodes),
        })
    }
}

impl FlatForest {
    /// The node arrays as stored in a `.nodes` file: every `feature` byte, then every `value`
    /// as f32 little-endian, then every `right` offset as u16 little-endian (7 bytes a node).
    pub fn node_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.feature.len() * 7);
        out.extend_from_slice(&self.feature);
        for v in &self.value {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for r in &self.right {
            out.extend_from_slice(&r.to_le_bytes());
        }
        out
    }

    /// Fills a forest read by `Deserialize` with its node arrays and checks the result.
    pub fn attach_nodes(&mut self, bytes: &[u8]) -> Result<(), String> {
        let expected = self.right.capacity();
        if bytes.len() != expected * 7 {
            return Err(format!(
                "{} bytes of nodes where the model expects {} nodes ({} bytes); the .nodes file \
                 belongs to another training",
                bytes.len(),
                expected,
                expected * 7
            ));
        }
        let (feature, rest) = bytes.split_at(expected);
        let (value, right) = rest.split_at(expected * 4);
        self.feature = feature.to_vec();
        self.value = value
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        self.right = right
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        self.validate()
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
        let text = serde_json::to_string(f).unwrap();
        let mut back: FlatForest = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        back.attach_nodes(&f.node_bytes())?;
        Ok(back)
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
        let text = serde_json::to_string(&f).unwrap();
        let mut back: FlatForest = serde_json::from_str(&text).unwrap();
        let e = back.attach_nodes(&f.node_bytes()[1..]).unwrap_err();
        assert!(e.contains("another training"), "{e}");
    }
}
