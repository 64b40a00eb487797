//! Transformers as eager PyTorch trains them: BERT (Hugging Face), GPT-2 (Hugging
//! Face), ViT-B/16 (torchvision) and a tiny GPT-2-style model.
//!
//! Attention follows the eager (non-SDPA) path: q/k/v projections, the head split
//! as a copy (`view` + `permute` leave a strided view that `matmul` copies
//! contiguous before its `bmm`, which saves those copies), scores
//! `q @ k^T / sqrt(d_head)` (the scale folded into the matmul), softmax (keeps its
//! output), dropout on the probabilities (keeps its mask), `@ v`, the head merge
//! copy (`permute(..).contiguous()`), output projection, dropout, residual add,
//! layer norm; FFN linear-GELU-linear.
//!
//! Left out, each allocating only transient tensors or nothing: BERT's additive
//! attention mask (no padding is modelled), GPT-2's causal mask (`torch.where`
//! on the scores), and the separate scaling op. GPT-2's `gelu_new` is the eight
//! eager element-wise ops Hugging Face runs (they keep four tensors for backward). GPT-2's loss shifts the labels
//! (as `ForCausalLMLoss` does), so the logits are not copied. torchvision's ViT
//! has dropout 0, which PyTorch skips, so it has no dropout ops; its
//! `nn.MultiheadAttention(need_weights=False)` actually runs fused
//! `scaled_dot_product_attention` on recent PyTorch, which keeps no
//! `[seq, seq]` probabilities, so the eager path here is the conservative one.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError, TensorId};

const BERT_SOURCE: &str = "Hugging Face transformers BertForSequenceClassification \
    (BertModel with pooler + 2-label classifier), eager attention; Devlin et al. 2019";
const GPT2_SOURCE: &str = "Hugging Face transformers GPT2LMHeadModel (lm_head tied to wte), \
    eager attention; Radford et al. 2019";
const VIT_SOURCE: &str = "torchvision.models.vit_b_16 (Dosovitskiy et al. 2021)";
const TINY_SOURCE: &str = "outcore (test model, GPT-2 architecture)";

/// Dimensions of a text transformer.
#[derive(Debug, Clone, Copy)]
struct Dims {
    layers: u64,
    hidden: u64,
    heads: u64,
    /// FFN inner width.
    ffn: u64,
    vocab: u64,
    /// Rows of the learned position table (the longest sequence).
    positions: u64,
}

const BERT_VOCAB: u64 = 30_522;
const BERT_POSITIONS: u64 = 512;
const GPT2_VOCAB: u64 = 50_257;
const GPT2_POSITIONS: u64 = 1024;

/// BERT-base / BERT-large and the GPT-2 sizes, keyed by zoo name.
fn dims_of(name: &str) -> Option<Dims> {
    let bert = |layers, hidden, heads| Dims {
        layers,
        hidden,
        heads,
        ffn: 4 * hidden,
        vocab: BERT_VOCAB,
        positions: BERT_POSITIONS,
    };
    let gpt2 = |layers, hidden, heads| Dims {
        layers,
        hidden,
        heads,
        ffn: 4 * hidden,
        vocab: GPT2_VOCAB,
        positions: GPT2_POSITIONS,
    };
    Some(match name {
        "bert-base" => bert(12, 768, 12),
        "bert-large" => bert(24, 1024, 16),
        "gpt2" => gpt2(12, 768, 12),
        "gpt2-medium" => gpt2(24, 1024, 16),
        "gpt2-large" => gpt2(36, 1280, 20),
        "gpt2-xl" => gpt2(48, 1600, 25),
        _ => return None,
    })
}

const fn text_knobs(seq: u64, layers: u64) -> [Knob; 2] {
    [
        Knob {
            name: "seq",
            default: seq,
            help: "sequence length in tokens",
        },
        Knob {
            name: "layers",
            default: layers,
            help: "transformer layers (the reference count holds only at the default)",
        },
    ]
}

// BERT at 128 tokens, the pre-training phase-1 length; GPT-2 at 512 of its 1024
// positions, to keep default graphs moderate (`--seq 1024` for the full context).
const BERT_BASE_KNOBS: [Knob; 2] = text_knobs(128, 12);
const BERT_LARGE_KNOBS: [Knob; 2] = text_knobs(128, 24);
const GPT2_KNOBS: [Knob; 2] = text_knobs(512, 12);
const GPT2_MEDIUM_KNOBS: [Knob; 2] = text_knobs(512, 24);
const GPT2_LARGE_KNOBS: [Knob; 2] = text_knobs(512, 36);
const GPT2_XL_KNOBS: [Knob; 2] = text_knobs(512, 48);

const VIT_KNOBS: [Knob; 1] = [Knob {
    name: "layers",
    default: 12,
    help: "encoder layers (the reference count holds only at the default)",
}];

const TINY_KNOBS: [Knob; 5] = [
    Knob {
        name: "layers",
        default: 2,
        help: "transformer blocks",
    },
    Knob {
        name: "hidden",
        default: 64,
        help: "model width d_model (a multiple of heads)",
    },
    Knob {
        name: "heads",
        default: 2,
        help: "attention heads",
    },
    Knob {
        name: "seq",
        default: 16,
        help: "sequence length in tokens (also the position-table rows)",
    },
    Knob {
        name: "vocab",
        default: 256,
        help: "vocabulary size in tokens",
    },
];

/// Classifier labels of the BERT head (BertForSequenceClassification default).
const BERT_LABELS: u64 = 2;

pub(super) fn models() -> Vec<ModelInfo> {
    let text =
        |name,
         description,
         knobs: &'static [Knob],
         default_batch,
         params,
         source,
         build: fn(&'static str, &ModelRequest) -> Result<Graph, GraphError>| {
            ModelInfo {
                name,
                description,
                source,
                knobs,
                default_batch,
                reference_param_count: Some(params),
                default_optimizer: Optimizer::adamw,
                build,
            }
        };
    // BertModel counts (pooler included) plus the classifier hidden*2 + 2.
    let bert_base = 109_482_240 + 768 * BERT_LABELS + BERT_LABELS;
    let bert_large = 335_141_888 + 1024 * BERT_LABELS + BERT_LABELS;
    // GPT-2 style at the tiny defaults: wte 256*64, wpe 16*64, 2 blocks of
    // 12*64^2 + 13*64 (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj), ln_f 2*64.
    let tiny = 256 * 64 + 16 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64;
    vec![
        text(
            "bert-base",
            "BERT-base (12 layers, 768 wide, 12 heads) with a 2-label classification head, \
                eager attention; the BERT whose 73 GB at batch 64 motivates HOME",
            &BERT_BASE_KNOBS,
            32,
            bert_base,
            BERT_SOURCE,
            build_bert,
        ),
        text(
            "bert-large",
            "BERT-large (24 layers, 1024 wide, 16 heads) with a 2-label classification head, \
                eager attention (HOME and TENSILE cite BERT as a memory-bound workload)",
            &BERT_LARGE_KNOBS,
            8,
            bert_large,
            BERT_SOURCE,
            build_bert,
        ),
        text(
            "gpt2",
            "GPT-2 small (12 layers, 768 wide) causal LM with tied head, eager attention; a \
                transformer workload beyond the papers' CNN/RNN evaluations",
            &GPT2_KNOBS,
            8,
            124_439_808,
            GPT2_SOURCE,
            build_gpt2,
        ),
        text(
            "gpt2-medium",
            "GPT-2 medium (24 layers, 1024 wide) causal LM with tied head, eager attention",
            &GPT2_MEDIUM_KNOBS,
            4,
            354_823_168,
            GPT2_SOURCE,
            build_gpt2,
        ),
        text(
            "gpt2-large",
            "GPT-2 large (36 layers, 1280 wide) causal LM with tied head, eager attention",
            &GPT2_LARGE_KNOBS,
            2,
            774_030_080,
            GPT2_SOURCE,
            build_gpt2,
        ),
        text(
            "gpt2-xl",
            "GPT-2 XL (48 layers, 1600 wide, 25 heads) causal LM with tied head, eager \
                attention",
            &GPT2_XL_KNOBS,
            1,
            1_557_611_200,
            GPT2_SOURCE,
            build_gpt2,
        ),
        text(
            "vit_b_16",
            "ViT-B/16 (12 layers, 768 wide, 16x16 patches, 224x224 ImageNet, class token), \
                eager attention; a vision transformer next to the papers' CNNs",
            &VIT_KNOBS,
            32,
            86_567_656,
            VIT_SOURCE,
            build_vit,
        ),
        text(
            "tiny-transformer",
            "tiny GPT-2-style causal LM (2 layers, width 64, 2 heads, 16 tokens, vocab 256) \
                that executes on a CPU in well under a second",
            &TINY_KNOBS,
            8,
            tiny,
            TINY_SOURCE,
            build_tiny,
        ),
    ]
}

/// Errors unless `hidden` splits evenly into `heads` and `seq` fits the positions.
fn check_dims(name: &str, d: &Dims, seq: u64) -> Result<(), GraphError> {
    if !d.hidden.is_multiple_of(d.heads) {
        return Err(bad_knob(
            name,
            format!("hidden {} is not a multiple of heads {}", d.hidden, d.heads),
        ));
    }
    if seq > d.positions {
        return Err(bad_knob(
            name,
            format!("seq {seq} exceeds the {} learned positions", d.positions),
        ));
    }
    Ok(())
}

/// Eager multi-head attention core on `[n, s, d]` projections: head-split copies,
/// scaled scores, softmax, dropout (`p_drop > 0`), `@ v`, head-merge copy.
fn attention_core(
    b: &mut GraphBuilder,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    heads: u64,
    p_drop: f32,
) -> TensorId {
    let qs = b.shape(q).to_vec();
    let (n, s, d) = (qs[0], qs[1], qs[2]);
    let d_head = d / heads;
    let split = [n, heads, s, d_head];
    let qh = b.copy("split_heads_q", q, &split);
    let kh = b.copy("split_heads_k", k, &split);
    let vh = b.copy("split_heads_v", v, &split);
    let scale = 1.0 / (d_head as f32).sqrt();
    let scores = b.matmul("scores", qh, kh, true, scale);
    let mut probs = b.softmax(scores);
    if p_drop > 0.0 {
        probs = b.dropout(probs, p_drop);
    }
    let context = b.matmul("context", probs, vh, false, 1.0);
    b.copy("merge_heads", context, &[n, s, d])
}

/// The first position of `x [n, s, d]` as `[n, d]` (`x[:, 0]`): a split view,
/// whose backward scatters into a full-size gradient like `select_backward`.
fn first_token(b: &mut GraphBuilder, x: TensorId) -> TensorId {
    let xs = b.shape(x).to_vec();
    let (n, s, d) = (xs[0], xs[1], xs[2]);
    let first = b.split("first_token", x, 1, &[1, s - 1])[0];
    b.reshape(first, &[n, d])
}

fn build_bert(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let Some(mut d) = dims_of(name) else {
        return Err(bad_knob(name, "not a BERT configuration".into()));
    };
    d.layers = req.knob("layers");
    let (n, s) = (req.batch, req.knob("seq"));
    check_dims(name, &d, s)?;
    let eps = 1e-12;
    let p = 0.1;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(BERT_SOURCE);
    b.set_seq(s);
    let input_ids = b.input_indices("input_ids", &[n, s]);
    let token_type_ids = b.input_indices("token_type_ids", &[n, s]);
    // HF slices its `position_ids` buffer to [1, s] and broadcasts the lookup.
    let position_ids = b.input_indices("position_ids", &[1, s]);
    let labels = b.label("labels", &[n]);
    let mut x = b.scoped("bert.embeddings", |b| {
        let words = b.embedding("word_embeddings", input_ids, d.vocab, d.hidden);
        let types = b.embedding("token_type_embeddings", token_type_ids, 2, d.hidden);
        let pos = b.embedding("position_embeddings", position_ids, d.positions, d.hidden);
        let pos = b.expand(pos, &[n, s, d.hidden]);
        let sum = b.add(&[words, types, pos]);
        let normed = b.layer_norm_eps("LayerNorm", sum, eps);
        b.dropout(normed, p)
    });
    for layer in 0..d.layers {
        x = b.scoped(format!("bert.encoder.layer.{layer}"), |b| {
            let q = b.linear("attention.self.query", x, d.hidden, true);
            let k = b.linear("attention.self.key", x, d.hidden, true);
            let v = b.linear("attention.self.value", x, d.hidden, true);
            let ctx = b.scoped("attention.self", |b| attention_core(b, q, k, v, d.heads, p));
            let a = b.linear("attention.output.dense", ctx, d.hidden, true);
            let a = b.dropout(a, p);
            let a = b.add(&[a, x]);
            let a = b.layer_norm_eps("attention.output.LayerNorm", a, eps);
            let f = b.linear("intermediate.dense", a, d.ffn, true);
            // BERT's "gelu" is the exact erf GELU, one op.
            let f = b.gelu(f);
            let f = b.linear("output.dense", f, d.hidden, true);
            let f = b.dropout(f, p);
            let f = b.add(&[f, a]);
            b.layer_norm_eps("output.LayerNorm", f, eps)
        });
    }
    let pooled = b.scoped("bert.pooler", |b| {
        let first = first_token(b, x);
        let dense = b.linear("dense", first, d.hidden, true);
        b.tanh(dense)
    });
    let pooled = b.dropout(pooled, p);
    let logits = b.linear("classifier", pooled, BERT_LABELS, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn build_gpt2(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let Some(mut d) = dims_of(name) else {
        return Err(bad_knob(name, "not a GPT-2 configuration".into()));
    };
    d.layers = req.knob("layers");
    gpt2_graph(name, GPT2_SOURCE, req, d, req.knob("seq"))
}

fn build_tiny(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let hidden = req.knob("hidden");
    let seq = req.knob("seq");
    let d = Dims {
        layers: req.knob("layers"),
        hidden,
        heads: req.knob("heads"),
        ffn: 4 * hidden,
        vocab: req.knob("vocab"),
        positions: seq,
    };
    gpt2_graph(name, TINY_SOURCE, req, d, seq)
}

/// GPT2LMHeadModel: pre-LN blocks, fused qkv projection (HF `Conv1D`, weight
/// `[in, out]`; the same parameters as a linear), final layer norm, lm_head tied
/// to the token embedding, causal-LM loss over every position.
fn gpt2_graph(
    name: &'static str,
    source: &str,
    req: &ModelRequest,
    d: Dims,
    s: u64,
) -> Result<Graph, GraphError> {
    check_dims(name, &d, s)?;
    let n = req.batch;
    let p = 0.1;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(source);
    b.set_seq(s);
    let input_ids = b.input_indices("input_ids", &[n, s]);
    // `position_ids = arange(s).unsqueeze(0)`, broadcast over the batch.
    let position_ids = b.input_indices("position_ids", &[1, s]);
    // Next-token labels, already shifted (HF pads and shifts the labels).
    let labels = b.label("labels", &[n * s]);
    let wte = b.scoped("transformer.wte", |b| {
        b.parameter("weight", &[d.vocab, d.hidden])
    });
    let mut x = b.scoped("transformer", |b| {
        let tokens = b.embedding_with("wte", input_ids, wte);
        let pos = b.embedding("wpe", position_ids, d.positions, d.hidden);
        let pos = b.expand(pos, &[n, s, d.hidden]);
        let sum = b.add(&[tokens, pos]);
        b.dropout(sum, p)
    });
    for layer in 0..d.layers {
        x = b.scoped(format!("transformer.h.{layer}"), |b| {
            let h = b.layer_norm("ln_1", x);
            let ctx = b.scoped("attn", |b| {
                let qkv = b.linear("c_attn", h, 3 * d.hidden, true);
                let parts = b.split("split_qkv", qkv, 2, &[d.hidden, d.hidden, d.hidden]);
                let ctx = attention_core(b, parts[0], parts[1], parts[2], d.heads, p);
                let out = b.linear("c_proj", ctx, d.hidden, true);
                b.dropout(out, p)
            });
            let x = b.add(&[ctx, x]);
            let h = b.layer_norm("ln_2", x);
            let f = b.scoped("mlp", |b| {
                let f = b.linear("c_fc", h, d.ffn, true);
                // `gelu_new`, as eager PyTorch runs it: eight element-wise ops.
                let f = b.gelu_tanh_eager(f);
                let f = b.linear("c_proj", f, d.hidden, true);
                b.dropout(f, p)
            });
            b.add(&[f, x])
        });
    }
    let x = b.layer_norm("transformer.ln_f", x);
    let logits = b.linear_with("lm_head", x, wte, None);
    let rows = b.reshape(logits, &[n * s, d.vocab]);
    let loss = b.softmax_cross_entropy(rows, labels);
    b.finish(loss, req.optimizer)
}

/// torchvision `vit_b_16`: 16x16 patch convolution, class token, learned position
/// embedding, pre-LN encoder blocks with packed in-projection, final layer norm,
/// linear head on the class token. Dropout rates are 0, so no dropout ops.
fn build_vit(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let (image, patch, hidden, heads, mlp, classes) = (224u64, 16u32, 768u64, 12u64, 3072, 1000);
    let grid = image / patch as u64;
    let s = grid * grid + 1;
    let n = req.batch;
    let eps = 1e-6;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(VIT_SOURCE);
    let images = b.input("images", &[n, 3, image, image]);
    let labels = b.label("labels", &[n]);
    let conv = crate::Conv2dAttrs {
        kernel: [patch; 2],
        stride: [patch; 2],
        padding: [0; 2],
        dilation: [1; 2],
        groups: 1,
        bias: true,
    };
    let patches = b.conv2d_full("conv_proj", images, hidden, conv);
    // reshape(n, hidden, grid^2).permute(0, 2, 1): views; the cat below copies.
    let patches = b.reshape(patches, &[n, hidden, grid * grid]);
    let patches = b.permute(patches, &[0, 2, 1]);
    let class_token = b.parameter("class_token", &[1, 1, hidden]);
    let class_tokens = b.expand(class_token, &[n, 1, hidden]);
    let x = b.concat(&[class_tokens, patches], 1);
    let mut x = b.scoped("encoder", |b| {
        let pos = b.parameter("pos_embedding", &[1, s, hidden]);
        let pos = b.expand(pos, &[n, s, hidden]);
        b.add(&[x, pos])
    });
    for layer in 0..req.knob("layers") {
        x = b.scoped(format!("encoder.layers.encoder_layer_{layer}"), |b| {
            let h = b.layer_norm_eps("ln_1", x, eps);
            let ctx = b.scoped("self_attention", |b| {
                // Packed in_proj_weight [3d, d] and in_proj_bias [3d].
                let qkv = b.linear("in_proj", h, 3 * hidden, true);
                let parts = b.split("split_qkv", qkv, 2, &[hidden, hidden, hidden]);
                let ctx = attention_core(b, parts[0], parts[1], parts[2], heads, 0.0);
                b.linear("out_proj", ctx, hidden, true)
            });
            let x = b.add(&[ctx, x]);
            let h = b.layer_norm_eps("ln_2", x, eps);
            let f = b.linear("mlp.0", h, mlp, true);
            let f = b.gelu(f);
            let f = b.linear("mlp.3", f, hidden, true);
            b.add(&[f, x])
        });
    }
    let x = b.layer_norm_eps("encoder.ln", x, eps);
    let first = first_token(&mut b, x);
    let logits = b.linear("heads.head", first, classes, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}
