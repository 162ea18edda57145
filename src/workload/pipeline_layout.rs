//! Megatron-Core's pipeline layout string (`--pipeline-model-parallel-layout`): what each
//! model chunk (virtual pipeline stage) holds, in model order. `E` is the embedding, `t` a
//! transformer layer, `m` a multi-token-prediction module, `L` the loss (final norm, LM head
//! and cross-entropy); `|` ends a chunk; `X*N` and `(…)*N` repeat; commas and spaces are
//! ignored. DeepSeek-V3 on 8 × 4 chunks in NVIDIA's H100 recipe: `Et|(tt|)*30mL` — one layer
//! beside the embedding, two per chunk, and the prediction module beside the loss. Chunk
//! `c·pp + r` runs on pipeline rank r, as with the interleaved schedule (under ZB-V the chunks
//! follow its V instead).

use crate::error::LayoutError;
use crate::limits::MAX_LAYERS;

/// Symbols the expanded layout may hold at most (a bound on `(…)*N` nesting).
const MAX_SYMBOLS: usize = 1 << 20;

/// Parentheses may nest this deep at most: the expander recurses once a level, so an input of
/// thousands of `(` would otherwise overflow the stack.
const MAX_NESTING: usize = 64;

/// What one chunk holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkContents {
    /// Holds the embedding (the first chunk only).
    pub embedding: bool,
    /// Transformer layers.
    pub layers: u64,
    /// Multi-token-prediction modules.
    pub mtp: u64,
    /// Holds the loss (the last chunk only).
    pub loss: bool,
}

/// A parsed layout: each chunk's contents in model order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineLayout {
    pub chunks: Vec<ChunkContents>,
}

fn bad(text: &str, message: impl Into<String>) -> LayoutError {
    LayoutError::PipelineLayout {
        layout: shown(text),
        message: message.into(),
    }
}

/// A layout string as a message quotes it: whole up to 120 characters, else its two ends.
fn shown(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= 120 {
        return text.to_string();
    }
    let head: String = chars[..60].iter().collect();
    let tail: String = chars[chars.len() - 40..].iter().collect();
    format!("{head}…{tail} ({} characters)", chars.len())
}

/// Expands repeats into a flat list of symbols (`|` kept).
struct Expander<'a> {
    text: &'a str,
    chars: Vec<char>,
    at: usize,
}

impl Expander<'_> {
    /// Items up to the end or a closing parenthesis.
    fn sequence(&mut self, depth: usize) -> Result<Vec<char>, LayoutError> {
        let mut out = Vec::new();
        while let Some(&c) = self.chars.get(self.at) {
            let item = match c {
                ')' if depth > 0 => return Ok(out),
                ')' => return Err(bad(self.text, "a \")\" closes nothing: drop it")),
                '(' if depth >= MAX_NESTING => {
                    let message = format!(
                        "parentheses nest more than {MAX_NESTING} deep: use fewer levels of (…)*N"
                    );
                    return Err(bad(self.text, message));
                }
                '(' => {
                    self.at += 1;
                    let inner = self.sequence(depth + 1)?;
                    if self.chars.get(self.at) != Some(&')') {
                        return Err(bad(self.text, "a \"(\" is never closed: add its \")\""));
                    }
                    self.at += 1;
                    inner
                }
                'E' | 't' | 'm' | 'L' | '|' => {
                    self.at += 1;
                    vec![c]
                }
                other => {
                    return Err(bad(
                        self.text,
                        format!(
                            "{other:?} is not a layout symbol: use E (embedding), t (layer), m \
                             (multi-token prediction), L (loss), | (next chunk), X*N or (…)*N"
                        ),
                    ))
                }
            };
            let times = self.repeat()?;
            if out.len() + item.len().saturating_mul(times) > MAX_SYMBOLS {
                return Err(bad(
                    self.text,
                    format!("expands to more than {MAX_SYMBOLS} symbols: give fewer repeats"),
                ));
            }
            for _ in 0..times {
                out.extend_from_slice(&item);
            }
        }
        // (an inner sequence at the end: its caller finds no ")" and says so)
        Ok(out)
    }

    /// `*N` after an item (1 without).
    fn repeat(&mut self) -> Result<usize, LayoutError> {
        if self.chars.get(self.at) != Some(&'*') {
            return Ok(1);
        }
        self.at += 1;
        let start = self.at;
        while self.chars.get(self.at).is_some_and(char::is_ascii_digit) {
            self.at += 1;
        }
        let digits: String = self.chars[start..self.at].iter().collect();
        digits
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=MAX_LAYERS).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| {
                bad(
                    self.text,
                    format!("\"*{digits}\": give a repeat count from 1 to {MAX_LAYERS} after *"),
                )
            })
    }
}

impl PipelineLayout {
    /// Parses and checks a layout string for a model of `layers` transformer layers: one
    /// embedding, first; one loss, last; every layer; prediction modules after every layer.
    pub fn parse(text: &str, layers: u64) -> Result<PipelineLayout, LayoutError> {
        let mut expander = Expander {
            text,
            chars: text
                .chars()
                .filter(|c| !c.is_whitespace() && *c != ',')
                .collect(),
            at: 0,
        };
        let symbols = expander.sequence(0)?;
        let mut chunks = vec![ChunkContents::default()];
        let mut seen_mtp = false;
        for &s in &symbols {
            let chunk = chunks.last_mut().expect("at least one chunk");
            match s {
                '|' => chunks.push(ChunkContents::default()),
                'E' => chunk.embedding = true,
                't' if seen_mtp => {
                    return Err(bad(
                        text,
                        "a layer follows a multi-token-prediction module: put every m after \
                         the last t",
                    ))
                }
                't' => chunk.layers += 1,
                'm' => {
                    seen_mtp = true;
                    chunk.mtp += 1;
                }
                _ => chunk.loss = true,
            }
        }
        let count = |s: char| symbols.iter().filter(|&&c| c == s).count();
        let first = symbols.iter().find(|&&c| c != '|');
        let last = symbols.iter().rev().find(|&&c| c != '|');
        if count('E') != 1 || first != Some(&'E') {
            return Err(bad(text, "give the embedding E once, first"));
        }
        if count('L') != 1 || last != Some(&'L') {
            return Err(bad(text, "give the loss L once, last"));
        }
        // (Megatron-Core would also take empty chunks before the embedding or after the loss;
        // stepcast keeps the embedding on the first chunk and the loss on the last)
        if !chunks[0].embedding {
            return Err(bad(text, "the embedding E must open the first chunk"));
        }
        if !chunks.last().is_some_and(|c| c.loss) {
            return Err(bad(
                text,
                "the loss L must close the last chunk: drop the empty chunks after it",
            ));
        }
        let given = count('t') as u64;
        if given != layers {
            return Err(bad(
                text,
                format!("holds {given} layers (t), the model {layers}: give {layers}"),
            ));
        }
        Ok(PipelineLayout { chunks })
    }

    /// Multi-token-prediction modules the layout places.
    pub fn mtp_layers(&self) -> u64 {
        self.chunks.iter().map(|c| c.mtp).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_v3_on_32_chunks() {
        let l = PipelineLayout::parse("Et|(tt|)*30mL", 61).unwrap();
        assert_eq!(l.chunks.len(), 32);
        assert_eq!(
            l.chunks[0],
            ChunkContents {
                embedding: true,
                layers: 1,
                ..Default::default()
            }
        );
        assert!(l.chunks[1..31].iter().all(|c| c.layers == 2 && c.mtp == 0));
        assert_eq!(
            l.chunks[31],
            ChunkContents {
                mtp: 1,
                loss: true,
                ..Default::default()
            }
        );
        assert_eq!(l.mtp_layers(), 1);
        // Megatron's own example: commas ignored, the module on its own chunk
        let l = PipelineLayout::parse("Et*3|(tt|)*29,m|L", 61).unwrap();
        assert_eq!(l.chunks.len(), 32);
        assert_eq!(l.chunks[0].layers, 3);
        assert_eq!(l.chunks[30].mtp, 1);
        assert!(l.chunks[31].loss && l.chunks[31].layers == 0);
        // nested repeats
        let l = PipelineLayout::parse("E((t*2)|)*2tL", 5).unwrap();
        let layers: Vec<u64> = l.chunks.iter().map(|c| c.layers).collect();
        assert_eq!(layers, vec![2, 2, 1]);
        // modules counted wherever they are, none without
        let l = PipelineLayout::parse("Ett|ttmmL", 4).unwrap();
        assert_eq!((l.chunks[1].mtp, l.mtp_layers()), (2, 2));
        assert_eq!(PipelineLayout::parse("EttttL", 4).unwrap().mtp_layers(), 0);
    }

    /// A layout may expand to exactly the most symbols, and is then judged on what it holds.
    #[test]
    fn a_layout_may_expand_to_the_most_symbols() {
        assert_eq!(MAX_SYMBOLS, 1024 * 1024);
        let message = PipelineLayout::parse("(t*1024)*1024", 4)
            .unwrap_err()
            .to_string();
        assert!(message.contains("embedding E once, first"), "{message}");
        let message = PipelineLayout::parse("t(t*1024)*1024", 4)
            .unwrap_err()
            .to_string();
        assert!(message.contains("expands to more than"), "{message}");
    }

    /// Parentheses nest up to 64 deep; one more is refused with the fix, and so are a
    /// hundred thousand (which once overflowed the stack: found by fuzzing job files).
    #[test]
    fn parentheses_nest_a_bounded_depth() {
        let nested = |depth: usize| format!("{}Ettt|tL{}", "(".repeat(depth), ")".repeat(depth));
        let l = PipelineLayout::parse(&nested(MAX_NESTING), 4).unwrap();
        assert_eq!(l.chunks.len(), 2);
        for depth in [MAX_NESTING + 1, 100_000] {
            let message = PipelineLayout::parse(&nested(depth), 4)
                .unwrap_err()
                .to_string();
            assert!(
                message.contains("nest more than 64 deep: use fewer levels"),
                "{message}"
            );
            // a long string is quoted by its two ends
            let ends = format!("\"{}…{} ", "(".repeat(60), ")".repeat(40));
            assert!(message.contains(&ends), "{message}");
            let characters = format!("({} characters)", 2 * depth + 7);
            assert!(message.contains(&characters), "{message}");
        }
    }

    #[test]
    fn a_layout_that_cannot_be_is_refused_with_the_fix() {
        for (text, says) in [
            ("Et|tL", "holds 2 layers (t), the model 4: give 4"),
            ("tEtttL", "embedding E once, first"),
            ("EttEttL", "embedding E once, first"),
            ("Etttt", "loss L once, last"),
            ("EttttL|", "drop the empty chunks after it"),
            ("|EttttL", "must open the first chunk"),
            ("EtLtttL", "loss L once, last"),
            ("Ettmtt|L", "put every m after the last t"),
            ("Ett(tt|L", "never closed"),
            ("Ett)tt|L", "closes nothing"),
            ("Ettxtt|L", "'x' is not a layout symbol"),
            ("Et*0ttt|L", "\"*0\""),
            ("Et*|tttL", "\"*\""),
            ("E((((t*9999)*9999)*9999)*9999)L", "expands to more than"),
        ] {
            let message = PipelineLayout::parse(text, 4).unwrap_err().to_string();
            assert!(message.contains(says), "{text}: {message}");
            assert!(message.contains(text), "{text}: {message}");
        }
    }
}
