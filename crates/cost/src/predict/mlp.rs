//! A small multi-layer perceptron in plain Rust, TENSILE's latency predictor
//! (Sec. IV-A: "a four layers MLP network", one per operator type there).
//!
//! Four weight layers (`in -> h1 -> h2 -> h3 -> 1`) with tanh between them,
//! inputs and target standardised on the training set, trained by Adam on the
//! mean squared error in mini-batches. Everything is `f64` and single-threaded,
//! and the initial weights and the batch order come from one seeded generator,
//! so the same data and seed give the same network bit for bit.
//!
//! Choices where the paper is vague:
//! - One network over all kinds, with the op class one-hot among the inputs,
//!   instead of TENSILE's 40 per-kind networks: a training set of a few
//!   thousand distinct ops leaves most kinds with tens of rows, too few for a
//!   network of their own.
//! - tanh rather than ReLU: with little data, no unit can die, and the fit is
//!   smooth in the (log) sizes.

use super::PredictError;

/// Hyper-parameters of [`Mlp::fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct MlpConfig {
    /// Widths of the three hidden layers.
    pub hidden: [usize; 3],
    /// Passes over the training set.
    pub epochs: usize,
    /// Rows per Adam step.
    pub batch_size: usize,
    /// Adam's step size (on standardised data).
    pub learning_rate: f64,
    /// Seed of the initial weights and of the batch order.
    pub seed: u64,
}

impl Default for MlpConfig {
    /// 32-32-16 hidden units, 150 epochs of batches of 32 at step 3e-3: common
    /// starting values for a small regression network, not tuned (tuning on the
    /// held-out sets would make their errors optimistic); the errors in the
    /// module docs of [`super`] are with these values.
    fn default() -> Self {
        MlpConfig {
            hidden: [32, 32, 16],
            epochs: 150,
            batch_size: 32,
            learning_rate: 3e-3,
            seed: 0x7e45_11e0,
        }
    }
}

impl MlpConfig {
    fn validate(&self) -> Result<(), PredictError> {
        let bad = |field: &'static str, value: String, range: &'static str| {
            Err(PredictError::BadConfig {
                field,
                value,
                range,
            })
        };
        if self.hidden.iter().any(|&h| h == 0 || h > 4096) {
            return bad(
                "hidden",
                format!("{:?}", self.hidden),
                "1 to 4096 units each",
            );
        }
        if self.epochs == 0 || self.epochs > 100_000 {
            return bad("epochs", self.epochs.to_string(), "1 to 100000");
        }
        if self.batch_size == 0 {
            return bad("batch_size", "0".into(), "at least 1");
        }
        if !(self.learning_rate.is_finite()
            && self.learning_rate > 0.0
            && self.learning_rate <= 1.0)
        {
            return bad("learning_rate", self.learning_rate.to_string(), "(0, 1]");
        }
        Ok(())
    }
}

/// SplitMix64: a tiny, well-mixed generator, enough for weights and shuffles.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One dense layer: `out = w x + b`, `w` row-major `[outputs][inputs]`.
#[derive(Debug, Clone, PartialEq)]
struct Layer {
    inputs: usize,
    outputs: usize,
    w: Vec<f64>,
    b: Vec<f64>,
}

impl Layer {
    /// Glorot-uniform weights, zero biases.
    fn new(inputs: usize, outputs: usize, rng: &mut SplitMix) -> Layer {
        let limit = (6.0 / (inputs + outputs) as f64).sqrt();
        let w = (0..inputs * outputs)
            .map(|_| (2.0 * rng.unit() - 1.0) * limit)
            .collect();
        Layer {
            inputs,
            outputs,
            w,
            b: vec![0.0; outputs],
        }
    }

    fn forward(&self, x: &[f64], out: &mut Vec<f64>) {
        out.clear();
        for o in 0..self.outputs {
            let row = &self.w[o * self.inputs..(o + 1) * self.inputs];
            out.push(self.b[o] + row.iter().zip(x).map(|(w, x)| w * x).sum::<f64>());
        }
    }
}

/// Adam's moment estimates for one parameter vector.
#[derive(Debug, Clone)]
struct Adam {
    m: Vec<f64>,
    v: Vec<f64>,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const ADAM_EPS: f64 = 1e-8;

impl Adam {
    fn new(n: usize) -> Adam {
        Adam {
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    fn step(&mut self, params: &mut [f64], grads: &[f64], lr: f64, t: i32) {
        let (c1, c2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        for i in 0..params.len() {
            self.m[i] = BETA1 * self.m[i] + (1.0 - BETA1) * grads[i];
            self.v[i] = BETA2 * self.v[i] + (1.0 - BETA2) * grads[i] * grads[i];
            params[i] -= lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + ADAM_EPS);
        }
    }
}

/// A trained network with its input and target standardisation.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    layers: Vec<Layer>,
    x_mean: Vec<f64>,
    x_scale: Vec<f64>,
    y_mean: f64,
    y_scale: f64,
    /// Mean squared error on the (standardised) training set after each epoch.
    pub loss_history: Vec<f64>,
}

/// Mean and a scale that is never zero (a constant column is left at zero).
fn standardiser(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = values.clone().count().max(1) as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let sd = var.sqrt();
    (mean, if sd > 1e-12 { sd } else { 1.0 })
}

impl Mlp {
    /// Trains on rows `xs` (all the same length) with targets `ys`.
    pub fn fit(xs: &[Vec<f64>], ys: &[f64], config: &MlpConfig) -> Result<Mlp, PredictError> {
        config.validate()?;
        if xs.is_empty() || xs.len() != ys.len() {
            return Err(PredictError::EmptyTrainingSet {
                detail: format!("{} feature rows and {} targets", xs.len(), ys.len()),
            });
        }
        let dim = xs[0].len();
        if let Some(bad) = xs.iter().position(|x| x.len() != dim) {
            return Err(PredictError::EmptyTrainingSet {
                detail: format!("row {bad} has {} features, row 0 has {dim}", xs[bad].len()),
            });
        }
        if let Some(i) =
            (0..xs.len()).find(|&i| !ys[i].is_finite() || xs[i].iter().any(|v| !v.is_finite()))
        {
            return Err(PredictError::EmptyTrainingSet {
                detail: format!("row {i} has a non-finite feature or target"),
            });
        }
        let (x_mean, x_scale): (Vec<f64>, Vec<f64>) = (0..dim)
            .map(|j| standardiser(xs.iter().map(move |x| x[j])))
            .unzip();
        let (y_mean, y_scale) = standardiser(ys.iter().copied());
        let rows: Vec<Vec<f64>> = xs
            .iter()
            .map(|x| (0..dim).map(|j| (x[j] - x_mean[j]) / x_scale[j]).collect())
            .collect();
        let targets: Vec<f64> = ys.iter().map(|y| (y - y_mean) / y_scale).collect();

        let mut rng = SplitMix(config.seed);
        let widths = [dim, config.hidden[0], config.hidden[1], config.hidden[2], 1];
        let layers = widths
            .windows(2)
            .map(|w| Layer::new(w[0], w[1], &mut rng))
            .collect();
        let mut mlp = Mlp {
            layers,
            x_mean,
            x_scale,
            y_mean,
            y_scale,
            loss_history: Vec::with_capacity(config.epochs),
        };
        mlp.train(&rows, &targets, config, &mut rng);
        Ok(mlp)
    }

    fn train(
        &mut self,
        rows: &[Vec<f64>],
        targets: &[f64],
        config: &MlpConfig,
        rng: &mut SplitMix,
    ) {
        let mut adam: Vec<(Adam, Adam)> = self
            .layers
            .iter()
            .map(|l| (Adam::new(l.w.len()), Adam::new(l.b.len())))
            .collect();
        let mut grads: Vec<(Vec<f64>, Vec<f64>)> = self
            .layers
            .iter()
            .map(|l| (vec![0.0; l.w.len()], vec![0.0; l.b.len()]))
            .collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        let mut acts = vec![Vec::new(); self.layers.len() + 1];
        let mut t = 0i32;
        for _ in 0..config.epochs {
            // Fisher-Yates with the seeded generator.
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            for batch in order.chunks(config.batch_size) {
                for g in grads.iter_mut() {
                    g.0.fill(0.0);
                    g.1.fill(0.0);
                }
                for &i in batch {
                    self.backprop(&rows[i], targets[i], &mut acts, &mut grads);
                }
                t = t.saturating_add(1);
                let scale = 1.0 / batch.len() as f64;
                for ((layer, (aw, ab)), (gw, gb)) in self
                    .layers
                    .iter_mut()
                    .zip(adam.iter_mut())
                    .zip(grads.iter_mut())
                {
                    gw.iter_mut().for_each(|g| *g *= scale);
                    gb.iter_mut().for_each(|g| *g *= scale);
                    aw.step(&mut layer.w, gw, config.learning_rate, t);
                    ab.step(&mut layer.b, gb, config.learning_rate, t);
                }
            }
            let loss = rows
                .iter()
                .zip(targets)
                .map(|(x, y)| (self.forward_standardised(x, &mut acts) - y).powi(2))
                .sum::<f64>()
                / rows.len() as f64;
            self.loss_history.push(loss);
        }
    }

    /// Output for a standardised row; `acts[l]` holds layer `l`'s input
    /// (after tanh) for backprop.
    fn forward_standardised(&self, x: &[f64], acts: &mut [Vec<f64>]) -> f64 {
        acts[0].clear();
        acts[0].extend_from_slice(x);
        let last = self.layers.len() - 1;
        for (l, layer) in self.layers.iter().enumerate() {
            let (before, after) = acts.split_at_mut(l + 1);
            layer.forward(&before[l], &mut after[0]);
            if l < last {
                after[0].iter_mut().for_each(|v| *v = v.tanh());
            }
        }
        acts[self.layers.len()][0]
    }

    /// Adds the gradient of `(out - y)^2 / 2` to `grads`.
    fn backprop(
        &self,
        x: &[f64],
        y: f64,
        acts: &mut [Vec<f64>],
        grads: &mut [(Vec<f64>, Vec<f64>)],
    ) {
        let out = self.forward_standardised(x, acts);
        let mut delta = vec![out - y];
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            let input = &acts[l];
            let (gw, gb) = &mut grads[l];
            for (o, d) in delta.iter().enumerate() {
                gb[o] += d;
                let row = &mut gw[o * layer.inputs..(o + 1) * layer.inputs];
                row.iter_mut().zip(input).for_each(|(g, a)| *g += d * a);
            }
            if l == 0 {
                break;
            }
            // Through the weights, then through the previous layer's tanh.
            delta = (0..layer.inputs)
                .map(|i| {
                    let back: f64 = delta
                        .iter()
                        .enumerate()
                        .map(|(o, d)| d * layer.w[o * layer.inputs + i])
                        .sum();
                    back * (1.0 - input[i] * input[i])
                })
                .collect();
        }
    }

    /// The prediction for one raw (not standardised) row.
    pub fn predict(&self, x: &[f64]) -> f64 {
        let row: Vec<f64> = x
            .iter()
            .zip(self.x_mean.iter().zip(&self.x_scale))
            .map(|(v, (m, s))| (v - m) / s)
            .collect();
        let mut acts = vec![Vec::new(); self.layers.len() + 1];
        self.forward_standardised(&row, &mut acts) * self.y_scale + self.y_mean
    }

    /// Inputs the network takes.
    pub fn input_dim(&self) -> usize {
        self.x_mean.len()
    }
}
