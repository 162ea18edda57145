//! Reading a Hugging Face `config.json` of the LLaMA (llama, mistral), GPT-NeoX and GPT-2
//! families into an `ArchSpec`.

use std::path::Path;

use serde_json::Value;

use super::arch::{Activation, ArchSpec, AttentionImpl, NormKind, Position};
use crate::error::{Error, Result};

pub fn from_config_json(path: &Path) -> Result<ArchSpec> {
    let text = crate::fsutil::read_to_string(path)?;
    from_config_str(path, &text)
}

/// Reads the text of a config.json that came from `path`.
pub fn from_config_str(path: &Path, text: &str) -> Result<ArchSpec> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        Error::bad_file(
            path,
            format!("not valid JSON ({e}): give the model's config.json as published"),
        )
    })?;
    let bad = |msg: String| Error::bad_file(path, msg);
    let model_type = v.get("model_type").and_then(Value::as_str).ok_or_else(|| {
        bad(
            "no \"model_type\": give a Hugging Face config.json (it names its model_type) \
                 or describe the architecture in a YAML file"
                .into(),
        )
    })?;
    let int = |key: &str| -> Result<u64> {
        match v.get(key) {
            Some(Value::Number(n)) if n.as_u64().is_some_and(|x| x > 0) => Ok(n.as_u64().unwrap()),
            Some(other) => Err(bad(format!(
                "\"{key}\" = {other} must be a positive integer"
            ))),
            None => Err(bad(format!(
                "missing \"{key}\" (needed for model_type {model_type}): add it from the \
                 model's published config"
            ))),
        }
    };
    let opt_int = |key: &str| -> Result<Option<u64>> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => int(key).map(Some),
        }
    };
    let flag = |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
    // dropout probabilities (any non-zero one means masks are stored for the backward)
    let dropout = |keys: &[&str], default: f64| {
        keys.iter()
            .map(|k| v.get(*k).and_then(Value::as_f64).unwrap_or(default))
            .any(|p| p > 0.0)
    };
    let name = v
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.parent()
                .and_then(|p| p.file_name())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| model_type.to_string())
        });
    let spec = match model_type {
        "llama" | "mistral" | "qwen2" => {
            let act = v
                .get("hidden_act")
                .and_then(Value::as_str)
                .unwrap_or("silu");
            if act != "silu" && act != "swish" {
                return Err(bad(format!(
                    "hidden_act \"{act}\": LLaMA-family configs are read as SwiGLU (silu) MLPs; \
                     describe this model in a YAML architecture file instead"
                )));
            }
            ArchSpec {
                name,
                layers: int("num_hidden_layers")?,
                hidden: int("hidden_size")?,
                heads: int("num_attention_heads")?,
                kv_heads: opt_int("num_key_value_heads")?,
                ffn_hidden: Some(int("intermediate_size")?),
                vocab: int("vocab_size")?,
                norm: NormKind::Rmsnorm,
                activation: Activation::Swiglu,
                tied_embeddings: flag("tie_word_embeddings", false),
                attention: AttentionImpl::Flash,
                position: Position::Rope,
                linear_bias: flag("attention_bias", false),
                norm_bias: None,
                seq_len: opt_int("max_position_embeddings")?,
                dropout: dropout(&["attention_dropout"], 0.0),
            }
        }
        "gpt_neox" => ArchSpec {
            name,
            layers: int("num_hidden_layers")?,
            hidden: int("hidden_size")?,
            heads: int("num_attention_heads")?,
            kv_heads: None,
            ffn_hidden: Some(int("intermediate_size")?),
            vocab: int("vocab_size")?,
            norm: NormKind::Layernorm,
            activation: Activation::Gelu,
            tied_embeddings: flag("tie_word_embeddings", false),
            attention: AttentionImpl::Flash,
            position: Position::Rope,
            linear_bias: true,
            norm_bias: None,
            seq_len: opt_int("max_position_embeddings")?,
            dropout: dropout(&["attention_dropout", "hidden_dropout"], 0.0),
        },
        "gpt2" => {
            let hidden = int("n_embd")?;
            ArchSpec {
                name,
                layers: int("n_layer")?,
                hidden,
                heads: int("n_head")?,
                kv_heads: None,
                ffn_hidden: Some(opt_int("n_inner")?.unwrap_or(4 * hidden)),
                vocab: int("vocab_size")?,
                norm: NormKind::Layernorm,
                activation: Activation::Gelu,
                tied_embeddings: flag("tie_word_embeddings", true),
                attention: AttentionImpl::Flash,
                position: Position::Learned,
                linear_bias: true,
                norm_bias: None,
                seq_len: opt_int("n_positions")?,
                dropout: dropout(&["attn_pdrop", "resid_pdrop", "embd_pdrop"], 0.1),
            }
        }
        other => {
            return Err(bad(format!(
                "model_type \"{other}\" is not supported (llama, mistral, qwen2, gpt_neox, gpt2); \
                 describe the architecture in a YAML file instead"
            )))
        }
    };
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        let p = dir.join("config.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_a_llama_config_with_gqa() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model_type":"llama","hidden_size":8192,"intermediate_size":28672,
                "num_attention_heads":64,"num_key_value_heads":8,"num_hidden_layers":80,
                "vocab_size":32000,"hidden_act":"silu","max_position_embeddings":4096,
                "_name_or_path":"meta-llama/Llama-2-70b-hf"}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.kv_heads, a.ffn_hidden, a.layers), (8, 28672, 80));
        assert_eq!(a.activation, Activation::Swiglu);
        assert_eq!(a.name, "meta-llama/Llama-2-70b-hf");
    }

    #[test]
    fn reads_gpt2_and_gpt_neox() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,"vocab_size":50257,"n_inner":null}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.ffn_hidden, a.tied_embeddings), (3072, true));
        let p = write(
            dir.path(),
            r#"{"model_type":"gpt_neox","hidden_size":6144,"intermediate_size":24576,"num_attention_heads":64,"num_hidden_layers":44,"vocab_size":50432}"#,
        );
        let a = from_config_json(&p).unwrap().validate("x").unwrap();
        assert_eq!((a.norm, a.linear_bias), (NormKind::Layernorm, true));
    }

    #[test]
    fn malformed_configs_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "{ not json");
        assert!(from_config_json(&p)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        let p = write(
            dir.path(),
            r#"{"model_type":"llama","num_hidden_layers":2,"hidden_size":"big"}"#,
        );
        let e = from_config_json(&p).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("\"hidden_size\""),
            "{e}"
        );
        let p = write(dir.path(), r#"{"model_type":"t5"}"#);
        assert!(from_config_json(&p)
            .unwrap_err()
            .to_string()
            .contains("not supported"));
    }
}
