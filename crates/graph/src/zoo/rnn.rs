//! LSTM language models unrolled over time: SwapAdvisor's RNN-L-XK (`lstm`) and
//! BRNN-L-XK (`brnn`), after PyTorch's `word_language_model` example.
//!
//! Structure (PyTorch `examples/word_language_model`, `RNNModel` with LSTM, without
//! its dropout): token embedding of width `hidden`, `layers` stacked LSTM layers of
//! `hidden` units, a linear decoder to `vocab` logits at every position, and the
//! mean cross-entropy over all `seq * batch` positions (the per-step language-model
//! loss). Each layer is unrolled into `seq` LSTM cells that share the layer's
//! weights, as SwapAdvisor describes (section 6.1) and as an `nn.LSTMCell` loop
//! runs in eager PyTorch, so each weight's gradient is accumulated over the steps.
//! Parameters follow `nn.LSTM`: per layer and direction `weight_ih [4H, I]`,
//! `weight_hh [4H, H]` and two biases `[4H]`, i.e. `4H(I + H) + 8H` elements.
//!
//! SwapAdvisor names its models RNN-L-XK with "the parameter size of a layer is
//! XK"; we read X K as the hidden size (X * 1024 units), which with 8 layers and
//! batch 256 is consistent with the 118 GB it reports for RNN-8-8K. Its
//! configurations are `lstm --layers 8 --hidden 8192` (batch 256) and
//! `brnn --layers 4 --hidden 8192` (batch 128); the paper gives neither the
//! sequence length nor the vocabulary, so those stay at our defaults unless set.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError, TensorId};

const SOURCE: &str = "PyTorch examples/word_language_model RNNModel(LSTM) unrolled into \
    nn.LSTM-parameterised cells; SwapAdvisor (Huang et al., ASPLOS 2020) RNN/BRNN-L-XK";

const KNOBS: &[Knob] = &[
    Knob {
        name: "layers",
        default: 2,
        help: "stacked LSTM layers (SwapAdvisor: 8 for RNN-8-8K, 4 for BRNN-4-8K)",
    },
    Knob {
        name: "hidden",
        default: 1024,
        help: "hidden units per LSTM (and embedding width); SwapAdvisor's X K = X*1024",
    },
    Knob {
        name: "seq",
        default: 32,
        help: "sequence length in tokens (time steps unrolled)",
    },
    Knob {
        name: "vocab",
        default: 10_000,
        help: "vocabulary size in tokens (embedding rows and decoder classes)",
    },
];

/// `nn.LSTM` parameters of one layer and direction: `4H(I + H) + 8H`.
const fn lstm_layer_params(input: u64, hidden: u64) -> u64 {
    4 * hidden * (input + hidden) + 8 * hidden
}

// Default knobs: layers 2, hidden 1024, vocab 10000.
const H: u64 = 1024;
const V: u64 = 10_000;

pub(super) fn models() -> Vec<ModelInfo> {
    vec![
        ModelInfo {
            name: "lstm",
            description: "LSTM language model unrolled over `seq` steps, shared weights per \
                layer, per-position loss; SwapAdvisor's RNN-L-XK (--layers 8 --hidden 8192 \
                at batch 256 is RNN-8-8K)",
            source: SOURCE,
            knobs: KNOBS,
            default_batch: 256,
            // Embedding V*H + 2 layers of 4H(H+H)+8H + decoder H*V+V = 37,283,600.
            reference_param_count: Some(V * H + 2 * lstm_layer_params(H, H) + H * V + V),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_lstm,
        },
        ModelInfo {
            name: "brnn",
            description: "bidirectional LSTM language model: each layer a forward and a \
                reversed-sequence sub-layer with own weights, outputs concatenated; \
                SwapAdvisor's BRNN-L-XK (--layers 4 --hidden 8192 at batch 128 is BRNN-4-8K)",
            source: SOURCE,
            knobs: KNOBS,
            default_batch: 128,
            // Embedding V*H; layer 0: 2 directions of 4H(H+H)+8H; layer 1: 2 directions
            // of 4H(2H+H)+8H; decoder 2H*V+V: 72,705,808 in all.
            reference_param_count: Some(
                V * H
                    + 2 * lstm_layer_params(H, H)
                    + 2 * lstm_layer_params(2 * H, H)
                    + 2 * H * V
                    + V,
            ),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_brnn,
        },
    ]
}

fn build_lstm(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    build_lm(name, req, false)
}

fn build_brnn(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    build_lm(name, req, true)
}

/// One direction of one layer: `seq` cells sharing `nn.LSTM`-named weights, run
/// over `inputs` in order (or reversed); returns the hidden states in sequence order.
fn lstm_sublayer(
    b: &mut GraphBuilder,
    layer: u64,
    reverse: bool,
    inputs: &[TensorId],
    hidden: u64,
) -> Vec<TensorId> {
    let batch = b.shape(inputs[0])[0];
    let input_width = b.shape(inputs[0])[1];
    let suffix = if reverse { "_reverse" } else { "" };
    let w_ih = b.parameter(
        &format!("weight_ih_l{layer}{suffix}"),
        &[4 * hidden, input_width],
    );
    let w_hh = b.parameter(
        &format!("weight_hh_l{layer}{suffix}"),
        &[4 * hidden, hidden],
    );
    let b_ih = b.parameter(&format!("bias_ih_l{layer}{suffix}"), &[4 * hidden]);
    let b_hh = b.parameter(&format!("bias_hh_l{layer}{suffix}"), &[4 * hidden]);
    // nn.LSTM starts from zero state when none is given.
    let mut h = b.zeros(&format!("h0_l{layer}{suffix}"), &[batch, hidden]);
    let mut c = b.zeros(&format!("c0_l{layer}{suffix}"), &[batch, hidden]);
    let mut outputs = vec![h; inputs.len()];
    let order: Vec<usize> = if reverse {
        (0..inputs.len()).rev().collect()
    } else {
        (0..inputs.len()).collect()
    };
    for t in order {
        let cell = format!("l{layer}{suffix}.t{t}");
        (h, c) = b.lstm_cell(&cell, inputs[t], h, c, w_ih, w_hh, b_ih, b_hh);
        outputs[t] = h;
    }
    outputs
}

/// The most unrolled LSTM cells (layers x steps) a graph may have: about a
/// million ops, a few hundred MB.
const MAX_CELLS: u64 = 100_000;

fn build_lm(
    name: &'static str,
    req: &ModelRequest,
    bidirectional: bool,
) -> Result<Graph, GraphError> {
    let n = req.batch;
    let layers = req.knob("layers");
    let hidden = req.knob("hidden");
    let seq = req.knob("seq");
    let vocab = req.knob("vocab");
    // The graph is unrolled: an LSTM cell per layer and step, forward and
    // backward, so their product bounds the op count (and memory).
    if layers * seq > MAX_CELLS {
        return Err(bad_knob(
            name,
            format!(
                "layers x seq = {layers} x {seq} = {} unrolled cells is out of range; accepted: at most {MAX_CELLS}",
                layers * seq
            ),
        ));
    }
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    b.set_seq(seq);
    // Time-major like nn.LSTM's default layout: tokens [seq, batch].
    let tokens = b.input_indices("tokens", &[seq, n]);
    let targets = b.label("targets", &[seq * n]);
    let emb = b.embedding("encoder", tokens, vocab, hidden);
    // Per-step inputs as views of the embedding output (`emb.unbind(0)`).
    let mut xs = b.unbind("steps", emb, 0);
    b.push_scope("rnn");
    for layer in 0..layers {
        let forward = lstm_sublayer(&mut b, layer, false, &xs, hidden);
        xs = if bidirectional {
            let backward = lstm_sublayer(&mut b, layer, true, &xs, hidden);
            // Per-step [h_fwd, h_bwd]: the next layer's input has width 2H.
            forward
                .iter()
                .zip(&backward)
                .map(|(&f, &r)| b.concat(&[f, r], 1))
                .collect()
        } else {
            forward
        };
    }
    b.pop_scope();
    // Stack the steps time-major into [seq * batch, width] rows (row t*batch + i),
    // the layout of `output.view(-1, width)` in the example.
    let rows = b.concat(&xs, 0);
    let logits = b.linear("decoder", rows, vocab, true);
    let loss = b.softmax_cross_entropy(logits, targets);
    b.finish(loss, req.optimizer)
}
