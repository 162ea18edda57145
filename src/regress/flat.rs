//! Our own flat-tree format: every tree of a forest or boosted ensemble stored depth-first in
//! three parallel arrays (split feature, threshold-or-leaf-value, offset of the right child; the
//! left child is the next node). Prediction is a tight loop over these arrays, a few
//! nanoseconds per tree level, and needs no training library at run time.
//!
//! On disk the arrays are little-endian bytes in base64 inside the model's JSON (7 bytes a
//! node): `feature` u8 (255 = leaf), `value` f32, `right` u16 offset from the node.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
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

    /// Bytes of the node arrays as stored (before base64).
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

#[derive(Serialize, Deserialize)]
struct Stored {
    n_features: usize,
    base: f64,
    scale: f64,
    trees: usize,
    nodes: usize,
    roots: Vec<u32>,
    feature_u8_b64: String,
    value_f32le_b64: String,
    right_u16le_b64: String,
}

impl Serialize for FlatForest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let value: Vec<u8> = self.value.iter().flat_map(|v| v.to_le_bytes()).collect();
        let right: Vec<u8> = self.right.iter().flat_map(|v| v.to_le_bytes()).collect();
        Stored {
            n_features: self.n_features,
            base: self.base,
            scale: self.scale,
            trees: self.roots.len(),
            nodes: self.feature.len(),
            roots: self.roots.clone(),
            feature_u8_b64: B64.encode(&self.feature),
            value_f32le_b64: B64.encode(value),
            right_u16le_b64: B64.encode(right),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for FlatForest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let s = Stored::deserialize(d)?;
        let decode = |name: &str, text: &str| {
            B64.decode(text)
                .map_err(|e| D::Error::custom(format!("forest.{name}: {e}")))
        };
        let feature = decode("feature_u8_b64", &s.feature_u8_b64)?;
        let value: Vec<f32> = decode("value_f32le_b64", &s.value_f32le_b64)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let right: Vec<u16> = decode("right_u16le_b64", &s.right_u16le_b64)?
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if feature.len() != s.nodes || s.roots.len() != s.trees {
            return Err(D::Error::custom(
                "forest: node or tree count does not match its arrays",
            ));
        }
        let forest = FlatForest {
            n_features: s.n_features,
            base: s.base,
            scale: s.scale,
            roots: s.roots,
            feature,
            value,
            right,
        };
        forest.validate().map_err(D::Error::custom)?;
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

    #[test]
    fn json_round_trip_is_exact() {
        let f = small();
        let text = serde_json::to_string(&f).unwrap();
        let back: FlatForest = serde_json::from_str(&text).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn corrupt_forests_are_refused() {
        let mut text = serde_json::to_value(small()).unwrap();
        text["n_features"] = 1.into(); // node 2 splits on feature 1
        let e = serde_json::from_value::<FlatForest>(text).unwrap_err();
        assert!(e.to_string().contains("feature 1"), "{e}");
    }
}
