//! `models.bin`: every model of a models directory in one file, so a prediction opens one file,
//! parses one small index and reads only the forests it uses.
//!
//! ```text
//! magic "stepcast-models\n" (16 bytes) · format version u32 LE · feature schema u32 LE ·
//! index length u64 LE · index (JSON: GPU, dataset, per model its header, area offset,
//! length and checksum) · the models' binary areas (roots and nodes, see `flat`)
//! ```
//!
//! Everything a model's predictions depend on is checked when the model is first read: the
//! area's checksum (so a file changed after training is refused, not silently used), its tree
//! structure and its values (see `FlatForest::from_area`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::flat::{FlatForest, ForestHeader};
use super::model::{DatasetRef, ModelKey, Recipe, TrainedModel, Validation, MODEL_FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::hardware::GpuSpec;
use crate::ops::features::{feature_names, FEATURE_SCHEMA_VERSION};
use crate::ops::Role;

/// The file every models directory keeps its models in.
pub const BUNDLE_FILE: &str = "models.bin";
const MAGIC: &[u8; 16] = b"stepcast-models\n";
const HEADER_BYTES: usize = 32;
/// An index larger than this is not one stepcast wrote.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// One model in the index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Which calls it answers.
    pub key: ModelKey,
    /// How it was fitted.
    pub recipe: Recipe,
    /// Roles it answers besides its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves_roles: Vec<Role>,
    /// [min, max] of every feature over its training rows.
    pub feature_ranges: Vec<[f64; 2]>,
    /// Rows it was trained on.
    pub training_rows: usize,
    /// Collectives: the (nodes, GPUs per node) layouts measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layouts: Vec<[u64; 2]>,
    /// Its validation error.
    pub validation: Validation,
    /// Collectives: its time at each of its probe shapes, µs (`TrainedModel::probe_shapes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes_us: Vec<f64>,
    /// Its forest's shape.
    pub forest: ForestHeader,
    /// Where its area lies in the file, and its checksum.
    pub offset: u64,
    /// Bytes of its area.
    pub bytes: u64,
    /// `checksum` of its area.
    pub checksum: u64,
}

/// The index: what every model shares, and each model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Index {
    /// The GPU every model was trained on.
    pub gpu: GpuSpec,
    /// The dataset every model was trained from.
    pub dataset: DatasetRef,
    /// Every model.
    pub models: Vec<IndexEntry>,
}

/// A 64-bit checksum of a model's area: four independent lanes of 8-byte words, each
/// multiplied and rotated, then folded together (several GB/s).
pub fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |h: u64, v: u64| (h ^ v).wrapping_mul(K).rotate_left(31);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let mut lanes = [K, K ^ 1, K ^ 2, K ^ 3];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane = mix(*lane, word(&block[8 * j..8 * j + 8]));
        }
    }
    let mut h = bytes.len() as u64 ^ K;
    for lane in lanes {
        h = mix(h, lane);
    }
    for &b in blocks.remainder() {
        h = mix(h, b as u64);
    }
    h
}

/// The file's bytes for these models (all trained on one GPU from one dataset), and the index.
pub fn encode(models: &[TrainedModel]) -> Result<(Vec<u8>, Index)> {
    let first = models
        .first()
        .ok_or_else(|| Error::Empty("no models to write".into()))?;
    for m in models {
        m.forest.validate().map_err(|e| {
            Error::Invalid(format!("{}: a trained forest is malformed: {e}", m.key))
        })?;
    }
    let areas: Vec<Vec<u8>> = models.iter().map(|m| m.forest.area()).collect();
    let probes: Vec<Vec<f64>> = models
        .iter()
        .map(|m| m.probe_times_us().into_owned())
        .collect();
    let entries = |base: u64| {
        let mut offset = base;
        models
            .iter()
            .zip(&areas)
            .zip(&probes)
            .map(|((m, area), probes_us)| {
                let e = IndexEntry {
                    key: m.key,
                    recipe: m.recipe,
                    serves_roles: m.serves_roles.clone(),
                    feature_ranges: m.feature_ranges.clone(),
                    training_rows: m.training_rows,
                    layouts: m.layouts.clone(),
                    validation: m.validation,
                    probes_us: probes_us.clone(),
                    forest: m.forest.header(),
                    offset,
                    bytes: area.len() as u64,
                    checksum: checksum(area),
                };
                offset += area.len() as u64;
                e
            })
            .collect::<Vec<_>>()
    };
    // the index's length fixes where the areas start; offsets are padded to a fixed width so
    // that the length does not depend on them
    let mut index = Index {
        gpu: first.gpu.clone(),
        dataset: first.dataset.clone(),
        models: entries(u64::MAX / 2),
    };
    let text_len = serde_json::to_vec(&index)
        .map_err(|e| Error::Invalid(format!("cannot encode the model index: {e}")))?
        .len();
    let base = (HEADER_BYTES + text_len) as u64;
    index.models = entries(base);
    let mut text = serde_json::to_vec(&index)
        .map_err(|e| Error::Invalid(format!("cannot encode the model index: {e}")))?;
    // real offsets are never longer than the placeholder: pad with spaces to the same length
    text.resize(text_len, b' ');
    let mut out = Vec::with_capacity(base as usize + areas.iter().map(Vec::len).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&MODEL_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&FEATURE_SCHEMA_VERSION.to_le_bytes());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    for a in &areas {
        out.extend_from_slice(a);
    }
    Ok((out, index))
}

/// An open `models.bin`: its index, and the file mapped into memory (the forests are used in
/// place; only the pages a prediction touches are read).
pub struct Reader {
    path: PathBuf,
    map: Arc<dyn AsRef<[u8]> + Send + Sync>,
    /// The file's index.
    pub index: Index,
    /// A digest of the index, which holds every model's checksum: two files with the same
    /// fingerprint predict the same (see `provenance::digest`).
    pub fingerprint: String,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reader({})", self.path.display())
    }
}

/// The fingerprint of a models file's bytes (see `Reader::fingerprint`) without reading its
/// models; `None` if they are not a models file.
pub fn fingerprint(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(24..HEADER_BYTES)?.try_into().ok()?);
    let end = HEADER_BYTES.checked_add(usize::try_from(len).ok()?)?;
    let index = bytes.get(HEADER_BYTES..end)?;
    (bytes.get(..16)? == MAGIC).then(|| crate::provenance::digest(index))
}

/// Maps a file read-only. stepcast replaces `models.bin` only by renaming a new file over it
/// (never writing into it), so the mapped bytes do not change while a prediction reads them.
fn map(file: &File) -> std::io::Result<Arc<dyn AsRef<[u8]> + Send + Sync>> {
    // SAFETY: the mapping is read-only and the file is never modified in place by stepcast;
    // a program that truncates it while we run could make reads fault, as with any mmap user
    // (ripgrep, git); the checksum refuses bytes changed in place before the map was made.
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Arc::new(map))
}

impl Reader {
    /// Opens and maps `path`, reading and checking its header and index.
    pub fn open(path: &Path) -> Result<Reader> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let map = map(&file).map_err(|e| Error::io(path, e))?;
        Self::from_shared(path, map)
    }

    /// Reads a models file built into the binary (`path` names it in messages).
    pub fn from_static(path: &Path, bytes: &'static [u8]) -> Result<Reader> {
        Self::from_shared(path, Arc::new(bytes))
    }

    /// Reads a models file held in memory (`path` names it in messages).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Reader> {
        Self::from_shared(path, Arc::new(bytes))
    }

    fn from_shared(path: &Path, map: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Result<Reader> {
        let bad = |m: String| Error::bad_file(path, m);
        let bytes: &[u8] = (*map).as_ref();
        let header: [u8; HEADER_BYTES] = bytes
            .get(..HEADER_BYTES)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| {
                bad("too short to be a models file; retrain with `stepcast train`".into())
            })?;
        if &header[..16] != MAGIC {
            return Err(bad(
                "not a stepcast models file (wrong magic bytes); retrain with `stepcast train`"
                    .into(),
            ));
        }
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        for (what, found, expected) in [
            ("model format", word(16), MODEL_FORMAT_VERSION),
            ("feature schema", word(20), FEATURE_SCHEMA_VERSION),
        ] {
            if found != expected {
                return Err(Error::SchemaVersion {
                    path: path.to_path_buf(),
                    what,
                    found,
                    expected,
                });
            }
        }
        let len = u64::from_le_bytes(header[24..32].try_into().expect("8 bytes"));
        if len > MAX_INDEX_BYTES {
            return Err(bad(format!(
                "index of {len} bytes: the file is corrupt; retrain"
            )));
        }
        let text = bytes
            .get(HEADER_BYTES..HEADER_BYTES + len as usize)
            .ok_or_else(|| bad("the index is cut short: the file is corrupt; retrain".into()))?;
        let index: Index = serde_json::from_slice(text)
            .map_err(|e| bad(format!("corrupt model index: {e}; retrain")))?;
        for e in &index.models {
            let expected = feature_names(e.key.op.family()).len();
            if e.feature_ranges.len() != expected || e.forest.n_features != expected {
                return Err(bad(format!(
                    "{}: features do not match schema {FEATURE_SCHEMA_VERSION}; retrain",
                    e.key
                )));
            }
        }
        Ok(Reader {
            path: path.to_path_buf(),
            fingerprint: crate::provenance::digest(text),
            map,
            index,
        })
    }

    /// Reads, checks and builds model `i` of the index.
    pub fn model(&self, i: usize) -> Result<TrainedModel> {
        let e = &self.index.models[i];
        let bad = |m: String| Error::bad_file(&self.path, format!("{}: {m}; retrain", e.key));
        if e.forest.area_bytes() != Some(e.bytes as usize) {
            return Err(bad(
                "the index disagrees with itself on the model's size".into()
            ));
        }
        let start = usize::try_from(e.offset).map_err(|_| bad("offset out of range".into()))?;
        let area = (*self.map)
            .as_ref()
            .get(start..start.saturating_add(e.bytes as usize))
            .ok_or_else(|| bad("the file is cut short".into()))?;
        if checksum(area) != e.checksum {
            return Err(bad(
                "its trees were changed after training (checksum mismatch)".into(),
            ));
        }
        let forest =
            FlatForest::from_shared_area(&e.forest, Arc::clone(&self.map), start).map_err(bad)?;
        let ranges_ok = e
            .feature_ranges
            .iter()
            .all(|[lo, hi]| lo.is_finite() && hi.is_finite() && lo <= hi);
        let v = &e.validation;
        if !ranges_ok
            || ![v.sigma_log, v.log_residual_p10, v.log_residual_p90]
                .iter()
                .all(|x| x.is_finite())
        {
            return Err(bad(
                "training ranges or validation errors are not finite (or a range is inverted)"
                    .into(),
            ));
        }
        let model = TrainedModel {
            key: e.key,
            recipe: e.recipe,
            serves_roles: e.serves_roles.clone(),
            feature_names: feature_names(e.key.op.family())
                .iter()
                .map(|s| s.to_string())
                .collect(),
            feature_ranges: e.feature_ranges.clone(),
            training_rows: e.training_rows,
            layouts: e.layouts.clone(),
            validation: e.validation,
            gpu: self.index.gpu.clone(),
            dataset: self.index.dataset.clone(),
            forest,
            probes_us: e.probes_us.clone(),
        };
        let probes_ok = e.probes_us.is_empty()
            || (e.probes_us.len() == model.probe_count()
                && e.probes_us.iter().all(|t| t.is_finite() && *t > 0.0));
        if !probes_ok {
            return Err(bad(
                "its stored collective probe times do not match its layouts or are not times"
                    .into(),
            ));
        }
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Dtype, OpKind, Phase};
    use crate::regress::modelset::ModelSet;

    /// Three of the paper's A100 models, one of each kind a file holds: a LayerNorm's forest, the
    /// pooled optimizer model (which serves a role), and an all-reduce (layouts and probe times).
    fn three_models() -> Vec<TrainedModel> {
        let set = ModelSet::builtin("perlmutter").unwrap();
        let key = |op, phase, role| ModelKey {
            op,
            phase,
            dtype: Dtype::Fp16,
            role,
        };
        [
            key(OpKind::LayerNorm, Phase::Fwd, None),
            key(OpKind::OptimizerStep, Phase::None, None),
            key(OpKind::AllReduce, Phase::None, None),
        ]
        .iter()
        .map(|k| set.get(k).unwrap().clone())
        .collect()
    }

    /// The bytes `encode` writes, read back: every model as it went in, each area where the
    /// index says, right after the header and the index.
    #[test]
    fn encoded_models_read_back_as_they_were() {
        let models = three_models();
        assert!(!models[1].serves_roles.is_empty());
        assert!(!models[2].layouts.is_empty() && !models[2].probe_times_us().is_empty());
        let (bytes, index) = encode(&models).unwrap();
        assert_eq!(&bytes[..16], MAGIC);
        assert_eq!(bytes[16..20], MODEL_FORMAT_VERSION.to_le_bytes());
        assert_eq!(bytes[20..24], FEATURE_SCHEMA_VERSION.to_le_bytes());
        let index_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
        let mut offset = (HEADER_BYTES + index_len) as u64;
        for (e, m) in index.models.iter().zip(&models) {
            assert_eq!(e.offset, offset, "{}", e.key);
            assert_eq!(e.bytes as usize, m.forest.area().len());
            offset += e.bytes;
        }
        assert_eq!(offset as usize, bytes.len());
        let reader = Reader::from_bytes(Path::new("m.bin"), bytes.clone()).unwrap();
        assert_eq!(reader.index.models.len(), 3);
        for (i, m) in models.iter().enumerate() {
            let read = reader.model(i).unwrap();
            assert_eq!(read, *m, "{}", m.key);
            assert_eq!(read.forest.area(), m.forest.area());
            assert_eq!(reader.index.models[i].probes_us, *m.probe_times_us());
        }
        // a kernel's model stores no probe table (a collective's is its own, above)
        assert_eq!(reader.index.models[0].probes_us, Vec::<f64>::new());
        assert_eq!(fingerprint(&bytes), Some(reader.fingerprint.clone()));
        // a reader shows as its file (not the megabytes it maps)
        assert_eq!(format!("{reader:?}"), "Reader(m.bin)");
        assert!(matches!(encode(&[]), Err(Error::Empty(_))));
    }

    fn refusal(bytes: Vec<u8>) -> String {
        Reader::from_bytes(Path::new("dir/models.bin"), bytes)
            .unwrap_err()
            .to_string()
    }

    /// A file whose header or index is not what stepcast writes is refused when opened, by name,
    /// with what to do.
    #[test]
    fn a_foreign_or_damaged_header_is_refused_on_opening() {
        let (good, index) = encode(&three_models()).unwrap();
        let with = |at: usize, patch: &[u8]| {
            let mut b = good.clone();
            b[at..at + patch.len()].copy_from_slice(patch);
            b
        };
        let short = refusal(good[..HEADER_BYTES - 1].to_vec());
        assert!(
            short.contains("dir/models.bin") && short.contains("too short"),
            "{short}"
        );
        assert!(refusal(with(0, b"stepcast-modelz\n")).contains("wrong magic bytes"));
        for (at, what, expected) in [
            (16, "model format", MODEL_FORMAT_VERSION),
            (20, "feature schema", FEATURE_SCHEMA_VERSION),
        ] {
            let err = Reader::from_bytes(Path::new("x"), with(at, &(expected + 1).to_le_bytes()))
                .unwrap_err();
            match err {
                Error::SchemaVersion { what: w, found, .. } => {
                    assert_eq!((w, found), (what, expected + 1))
                }
                other => panic!("{other}"),
            }
        }
        let too_long = refusal(with(24, &(MAX_INDEX_BYTES + 1).to_le_bytes()));
        let said = format!("index of {} bytes", MAX_INDEX_BYTES + 1);
        assert!(too_long.contains(&said), "{too_long}");
        // the largest index allowed is read as far as the file goes
        let cut = refusal(with(24, &MAX_INDEX_BYTES.to_le_bytes()));
        assert!(cut.contains("index is cut short"), "{cut}");
        let len = u64::from_le_bytes(good[24..32].try_into().unwrap()) as usize;
        assert!(refusal(good[..HEADER_BYTES + len - 1].to_vec()).contains("cut short"));
        assert!(refusal(with(HEADER_BYTES, b"[")).contains("corrupt model index"));
        // an index whose model has a feature too many (or its forest does) for the schema
        for widen in [true, false] {
            let mut index = index.clone();
            let e = &mut index.models[0];
            if widen {
                e.feature_ranges.push([0.0, 1.0]);
            } else {
                e.forest.n_features += 1;
            }
            let text = serde_json::to_vec(&index).unwrap();
            let mut b = good[..24].to_vec();
            b.extend_from_slice(&(text.len() as u64).to_le_bytes());
            b.extend_from_slice(&text);
            let err = refusal(b);
            assert!(err.contains("features do not match schema"), "{err}");
        }
    }

    /// A model's area and its index entry are checked when the model is first read: the file
    /// opens, and only the damaged model is refused.
    #[test]
    fn a_damaged_model_is_refused_when_read() {
        let (good, index) = encode(&three_models()).unwrap();
        let read = |edit: &dyn Fn(&mut IndexEntry), bytes: Vec<u8>| {
            let mut reader = Reader::from_bytes(Path::new("dir/models.bin"), bytes).unwrap();
            edit(&mut reader.index.models[1]);
            assert!(reader.model(0).is_ok());
            reader.model(1).map(|_| ()).map_err(|e| e.to_string())
        };
        read(&|_| {}, good.clone()).unwrap();
        let refused = |edit: &dyn Fn(&mut IndexEntry), bytes: Vec<u8>, says: &str| {
            let err = read(edit, bytes).unwrap_err();
            assert!(
                err.contains("dir/models.bin") && err.contains(says),
                "{err}"
            );
            assert!(
                err.contains("optimizer_step") && err.contains("retrain"),
                "{err}"
            );
        };
        refused(&|e| e.bytes += 7, good.clone(), "disagrees with itself");
        refused(&|e| e.offset = u64::MAX - 3, good.clone(), "cut short");
        let end = (index.models[1].offset + index.models[1].bytes) as usize;
        refused(&|_| {}, good[..end - 1].to_vec(), "cut short");
        let mut flipped = good.clone();
        flipped[end - 1] ^= 0x10;
        refused(&|_| {}, flipped, "checksum mismatch");
        let not_finite = "not finite";
        refused(
            &|e| e.feature_ranges[0] = [f64::NAN, 1.0],
            good.clone(),
            not_finite,
        );
        refused(
            &|e| e.feature_ranges[0] = [0.0, f64::INFINITY],
            good.clone(),
            not_finite,
        );
        refused(
            &|e| e.feature_ranges[0] = [2.0, 1.0],
            good.clone(),
            "a range is inverted",
        );
        refused(
            &|e| e.validation.sigma_log = f64::NAN,
            good.clone(),
            not_finite,
        );
        refused(
            &|e| e.validation.log_residual_p10 = f64::NAN,
            good.clone(),
            not_finite,
        );
        refused(
            &|e| e.validation.log_residual_p90 = -f64::INFINITY,
            good.clone(),
            not_finite,
        );
        // a range of one value is a range
        read(&|e| e.feature_ranges[0] = [1.0, 1.0], good.clone()).unwrap();
        // the all-reduce's probe table: one time per probe, each a time
        let mut reader = Reader::from_bytes(Path::new("dir/models.bin"), good.clone()).unwrap();
        let probes = reader.index.models[2].probes_us.clone();
        for bad in [
            probes[1..].to_vec(),
            [probes.clone(), vec![1.0]].concat(),
            [vec![0.0], probes[1..].to_vec()].concat(),
            [vec![f64::NAN], probes[1..].to_vec()].concat(),
        ] {
            reader.index.models[2].probes_us = bad;
            let err = reader.model(2).unwrap_err().to_string();
            assert!(err.contains("probe times"), "{err}");
        }
        // no stored table: computed from the trees when needed
        reader.index.models[2].probes_us.clear();
        let model = reader.model(2).unwrap();
        assert_eq!(*model.probe_times_us(), probes);
    }

    #[test]
    fn the_fingerprint_of_the_bytes_is_the_readers() {
        let bytes = crate::assets::MODELS[0].1;
        let reader = Reader::from_static(Path::new("x"), bytes).unwrap();
        assert_eq!(
            fingerprint(bytes).as_deref(),
            Some(reader.fingerprint.as_str())
        );
        assert_eq!(fingerprint(b"stepcast-models\n"), None);
        assert_eq!(fingerprint(&bytes[..40]), None);
    }

    #[test]
    fn checksum_sees_every_byte() {
        let a = vec![7u8; 1003];
        // a change in any lane's word, in the tail past the last whole block, or in the length
        for i in [0, 8, 16, 24, 31, 1000, 1001, 1002] {
            let mut b = a.clone();
            b[i] ^= 1;
            assert_ne!(checksum(&a), checksum(&b), "byte {i}");
        }
        assert_ne!(checksum(&a[..1000]), checksum(&a[..1001]));
        assert_ne!(checksum(&[]), checksum(&[0]));
        // lanes are not interchangeable: swapping two words changes the sum
        let mut words = [0u8; 32];
        words[..8].copy_from_slice(&1u64.to_le_bytes());
        words[8..16].copy_from_slice(&2u64.to_le_bytes());
        let mut swapped = words;
        swapped[..8].copy_from_slice(&2u64.to_le_bytes());
        swapped[8..16].copy_from_slice(&1u64.to_le_bytes());
        assert_ne!(checksum(&words), checksum(&swapped));
    }
}
