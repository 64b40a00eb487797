//! Device profiles: compute peaks, memory bandwidth, and the host link, built in
//! for the papers' testbeds and current GPUs, or read from a user's JSON file.
//!
//! # Units and conventions
//!
//! Rates are bytes/s or FLOP/s, times seconds, memory bytes. A card sold as
//! "N GB" is given `N * 2^30` bytes: that is what `nvidia-smi` reports as total
//! memory to within about 1% for every card here (a V100 16GB shows 16384 MiB, an
//! A100 40GB 40960 MiB, an H100 80GB 81559 MiB, an H200 143771 MiB). The number is
//! the whole device; the CUDA context and the framework's allocator take a few
//! hundred MiB of it, which planners must reserve themselves.
//!
//! Peaks are the vendor's dense (no structured sparsity) boost-clock numbers.
//! Host-link rates are for pinned host memory. Where only the one-way rate of a
//! PCIe link is known, the both-directions total is taken as `one_way * 20 / 12`,
//! the ratio SwapAdvisor measured on PCIe 3.0 (12 GB/s one way, 20 GB/s both):
//! duplex PCIe copies do not reach twice the one-way rate because both directions
//! share the root complex and the DMA engines' request slots.
//!
//! # User profiles
//!
//! A profile file is the JSON form of [`DeviceProfile`], e.g.
//!
//! ```json
//! {"name": "my-gpu", "description": "measured with bandwidthTest",
//!  "memory_bytes": 25769803776, "peak_flops_f32": 3.5e13, "peak_flops_tf32": 0,
//!  "peak_flops_f16": 1.4e14, "memory_bandwidth_bytes_per_s": 9.0e11,
//!  "h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10, "duplex_bytes_per_s": 4.2e10,
//!  "copy_latency_s": 1e-5, "kernel_launch_s": 5e-6}
//! ```
//!
//! `description` and `tf32` (`"off"`, `"convolutions"`, `"matmuls"` or `"all"`: which float32
//! ops run on TF32 tensor cores, [`Tf32`]; default `"off"`) may be left out;
//! every other field is required and unknown fields are rejected, so that a
//! misspelt rate cannot silently fall back.

use crate::error::{CostError, CostErrorKind};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A device and its host link. All rates in bytes/s or FLOP/s, times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub name: String,
    /// What the device is, including the source of the numbers.
    #[serde(default)]
    pub description: String,
    /// Total device memory in bytes (see the module docs for the GiB convention).
    pub memory_bytes: u64,
    /// FLOP/s, non-tensor-core FP32.
    pub peak_flops_f32: f64,
    /// FLOP/s of TF32 tensor cores; 0 when absent. Used for the float32 ops
    /// [`DeviceProfile::tf32`] names.
    pub peak_flops_tf32: f64,
    /// FLOP/s of FP16/BF16 tensor cores, dense, FP32 accumulate.
    pub peak_flops_f16: f64,
    pub memory_bandwidth_bytes_per_s: f64,
    /// Host-to-device rate with the other direction idle (pinned memory).
    pub h2d_bytes_per_s: f64,
    /// Device-to-host rate with the other direction idle (pinned memory).
    pub d2h_bytes_per_s: f64,
    /// Total of both directions when both run at once.
    pub duplex_bytes_per_s: f64,
    /// Fixed cost per copy (driver call, DMA setup, completion), seconds.
    pub copy_latency_s: f64,
    /// Fixed cost per kernel (launch and scheduling gap on the stream), seconds.
    pub kernel_launch_s: f64,
    /// Which float32 ops the framework runs on the TF32 tensor cores; optional
    /// in a file (default `off`) and left out of the JSON when `off`, so the
    /// built-in profiles and every file written before it read and write as
    /// before.
    #[serde(default, skip_serializing_if = "Tf32::is_off")]
    pub tf32: Tf32,
}

/// Which float32 convolutions and matrix products run on TF32 tensor cores.
///
/// A setting of the framework on the device rather than of the hardware, kept
/// in the profile so that a plan file (which carries its device) simulates the
/// same everywhere. PyTorch's defaults are `convolutions`
/// (`torch.backends.cudnn.allow_tf32 = True`,
/// `torch.backends.cuda.matmul.allow_tf32 = False`); the built-in profiles say
/// `off`, the papers' FP32 testbeds. Measured on an H100 (latency tables of
/// 2026-11-24, docs/data/predict): with `off` the roofline over-predicted
/// ResNet-50's step by 1.49x and VGG-16's by 2.84x, while the matmul-bound
/// ViT-B/16 and GPT-2 were within 0-9%.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tf32 {
    /// Every float32 op on the CUDA cores (`peak_flops_f32`).
    #[default]
    Off,
    /// Float32 convolutions (forward and backward) on TF32 tensor cores.
    Convolutions,
    /// Float32 matrix products on TF32 tensor cores, convolutions not.
    Matmuls,
    /// Float32 convolutions and matrix products on TF32 tensor cores.
    All,
}

impl Tf32 {
    /// Whether this is the default, `off`.
    pub fn is_off(&self) -> bool {
        *self == Tf32::Off
    }

    /// Whether a float32 op of `class` (convolution or matmul) uses TF32.
    pub fn covers(self, class: outcore_graph::OpClass) -> bool {
        use outcore_graph::OpClass;
        match self {
            Tf32::Off => false,
            Tf32::Convolutions => class == OpClass::Convolution,
            Tf32::Matmuls => class == OpClass::MatMul,
            Tf32::All => matches!(class, OpClass::Convolution | OpClass::MatMul),
        }
    }
}

/// The largest rate a profile may give, bytes/s or FLOP/s: 1e18 is three orders
/// of magnitude above any single device, so a larger number is a unit mistake.
pub const MAX_RATE_PER_S: f64 = 1e18;
/// The largest per-call overhead (copy latency, kernel launch) a profile may
/// give, seconds: a second per call is no device, but microseconds written as
/// whole numbers (`5` for 5 us) are a common mistake.
pub const MAX_OVERHEAD_S: f64 = 1.0;

const GIB: u64 = 1 << 30;
const GB_PER_S: f64 = 1e9;
const TFLOP_PER_S: f64 = 1e12;
/// A pinned cudaMemcpyAsync of a small buffer completes in roughly 8-12 us end to
/// end (call, DMA setup, completion event), so 10 us per copy.
const COPY_LATENCY_S: f64 = 10e-6;
/// Back-to-back kernels on one stream are spaced by about 3-6 us of launch
/// overhead in eager frameworks (PyTorch dispatch + cudaLaunchKernel), so 5 us.
const KERNEL_LAUNCH_S: f64 = 5e-6;

/// A profile's number as an error message shows it: as written for
/// ordinary magnitudes, in exponent form for huge or tiny ones (`1e300`,
/// not its 301 digits).
fn number_text(value: f64) -> String {
    let magnitude = value.abs();
    if value.is_finite() && magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// Both-directions total of a PCIe link from its one-way rate, by SwapAdvisor's
/// measured ratio (20 GB/s both ways for 12 GB/s one way); see the module docs.
/// Rounded to whole bytes/s so that the number survives a JSON round trip exactly.
fn pcie_duplex(one_way_bytes_per_s: f64) -> f64 {
    (one_way_bytes_per_s * 20.0 / 12.0).round()
}

/// The names of the built-in profiles, in the order of [`DeviceProfile::builtins`].
const BUILTIN_NAMES: &[&str] = &[
    "v100-16gb-pcie3",
    "v100-16gb-nvlink",
    "rtx2080ti-11gb",
    "a6000-48gb",
    "a100-40gb",
    "h100-80gb",
    "h200-141gb",
];

// One positional argument per profile number keeps the table below readable.
#[allow(clippy::too_many_arguments)]
fn profile(
    name: &str,
    description: &str,
    memory_gib: u64,
    fp32_tflops: f64,
    tf32_tflops: f64,
    fp16_tflops: f64,
    hbm_gb_per_s: f64,
    h2d_gb_per_s: f64,
    d2h_gb_per_s: f64,
    duplex_bytes_per_s: f64,
) -> DeviceProfile {
    DeviceProfile {
        name: name.to_string(),
        description: description.to_string(),
        memory_bytes: memory_gib * GIB,
        peak_flops_f32: fp32_tflops * TFLOP_PER_S,
        peak_flops_tf32: tf32_tflops * TFLOP_PER_S,
        peak_flops_f16: fp16_tflops * TFLOP_PER_S,
        memory_bandwidth_bytes_per_s: hbm_gb_per_s * GB_PER_S,
        h2d_bytes_per_s: h2d_gb_per_s * GB_PER_S,
        d2h_bytes_per_s: d2h_gb_per_s * GB_PER_S,
        duplex_bytes_per_s,
        copy_latency_s: COPY_LATENCY_S,
        kernel_launch_s: KERNEL_LAUNCH_S,
        tf32: Tf32::Off,
    }
}

fn builtin_profile(name: &str) -> Option<DeviceProfile> {
    let p = match name {
        // SwapAdvisor (ASPLOS'20) testbed, EC2 p3.2xlarge: one V100-SXM2 16GB on a
        // PCIe 3.0 host link, "12GB/s unidirectional and 20GB/s bidirectional"
        // (paper Sec. 6). V100-SXM2 datasheet: 15.7 TFLOP/s FP32, 125 TFLOP/s
        // tensor FP16, 900 GB/s HBM2. Volta has no TF32.
        "v100-16gb-pcie3" => profile(
            name,
            "NVIDIA V100-SXM2 16GB on PCIe 3.0 x16 (SwapAdvisor's EC2 p3.2xlarge). \
             Compute and HBM2: NVIDIA V100 datasheet (15.7 TFLOP/s FP32, 125 TFLOP/s FP16 \
             tensor, 900 GB/s). Host link: SwapAdvisor Sec. 6, measured 12 GB/s one way, \
             20 GB/s both ways.",
            16,
            15.7,
            0.0,
            125.0,
            900.0,
            12.0,
            12.0,
            20.0 * GB_PER_S,
        ),
        // The schedule-window paper's IBM POWER9 AC922: V100-SXM2 16GB joined to the
        // CPU by "two NVLinks (each can transfer memory at 50GB/s)" (paper Sec. 5).
        // An NVLink 2.0 brick moves 25 GB/s each way, 50 GB/s both ways, so two
        // bricks give 50 GB/s one way and 100 GB/s both ways. These are link
        // maxima (the paper gives no measurement); pinned copies reach ~90% of them.
        "v100-16gb-nvlink" => profile(
            name,
            "NVIDIA V100-SXM2 16GB in an IBM POWER9 AC922 with two NVLink 2.0 links to the \
             CPU (schedule-window paper Sec. 5: two NVLinks at 50 GB/s each, i.e. 25 GB/s \
             per direction per link). Compute and HBM2: NVIDIA V100 datasheet. Host link: \
             nominal 50 GB/s one way, 100 GB/s both ways.",
            16,
            15.7,
            0.0,
            125.0,
            900.0,
            50.0,
            50.0,
            100.0 * GB_PER_S,
        ),
        // HOME's testbed: RTX 2080 Ti 11GB on PCIe 3.0 x16 (paper Sec. 5). Turing
        // whitepaper, reference clocks: 13.4 TFLOP/s FP32, 616 GB/s GDDR6, tensor
        // FP16 53.8 TFLOP/s with FP32 accumulate (GeForce runs FP32-accumulate
        // tensor math at half the FP16-accumulate 107.6; mixed-precision training
        // accumulates in FP32). The host link is PCIe 3.0 x16 like SwapAdvisor's,
        // so its measured 12 / 20 GB/s are used.
        "rtx2080ti-11gb" => profile(
            name,
            "NVIDIA GeForce RTX 2080 Ti 11GB on PCIe 3.0 x16 (HOME's testbed). Compute and \
             memory: Turing whitepaper (13.4 TFLOP/s FP32, 53.8 TFLOP/s FP16 tensor with \
             FP32 accumulate, 616 GB/s). Host link: PCIe 3.0 x16 as measured by \
             SwapAdvisor, 12 GB/s one way, 20 GB/s both ways.",
            11,
            13.4,
            0.0,
            53.8,
            616.0,
            12.0,
            12.0,
            20.0 * GB_PER_S,
        ),
        // TENSILE's testbed: one RTX A6000 48GB (paper Sec. 5, "Experiment
        // Platform"). RTX A6000 datasheet / GA102 whitepaper: 38.7 TFLOP/s FP32,
        // 77.4 TF32 and 154.8 FP16 tensor (dense; the datasheet's 309.7 is
        // sparse), 768 GB/s GDDR6. PCIe 4.0 x16: 31.5 GB/s raw per direction,
        // pinned copies measure ~25 GB/s.
        "a6000-48gb" => profile(
            name,
            "NVIDIA RTX A6000 48GB on PCIe 4.0 x16 (TENSILE's testbed). Compute and memory: \
             RTX A6000 datasheet (38.7 TFLOP/s FP32, 77.4 TF32 and 154.8 FP16 tensor dense, \
             768 GB/s). Host link: PCIe 4.0 x16, ~25 GB/s one way as typically measured \
             with pinned memory; both ways 25 * 20/12 GB/s by SwapAdvisor's PCIe ratio.",
            48,
            38.7,
            77.4,
            154.8,
            768.0,
            25.0,
            25.0,
            pcie_duplex(25.0 * GB_PER_S),
        ),
        // A100-SXM4-40GB datasheet: 19.5 FP32, 156 TF32, 312 FP16 tensor (dense),
        // 1555 GB/s HBM2. Host link PCIe 4.0 x16, ~25 GB/s measured one way.
        "a100-40gb" => profile(
            name,
            "NVIDIA A100-SXM4 40GB on PCIe 4.0 x16. Compute and memory: A100 datasheet \
             (19.5 TFLOP/s FP32, 156 TF32, 312 FP16 tensor dense, 1555 GB/s). Host link: \
             ~25 GB/s one way measured with pinned memory; both ways 25 * 20/12 GB/s by \
             SwapAdvisor's PCIe ratio.",
            40,
            19.5,
            156.0,
            312.0,
            1555.0,
            25.0,
            25.0,
            pcie_duplex(25.0 * GB_PER_S),
        ),
        // H100-SXM5-80GB datasheet: 67 FP32, 494.7 TF32, 989.4 FP16 tensor
        // (dense; the sheet's 989 / 1979 are sparse), 3.35 TB/s HBM3. Host link
        // PCIe 5.0 x16: 63 GB/s raw per direction, ~55 GB/s measured.
        "h100-80gb" => profile(
            name,
            "NVIDIA H100-SXM5 80GB on PCIe 5.0 x16. Compute and memory: H100 datasheet \
             (67 TFLOP/s FP32, 495 TF32, 989 FP16 tensor dense, 3.35 TB/s). Host link: \
             ~55 GB/s one way measured with pinned memory; both ways 55 * 20/12 GB/s by \
             SwapAdvisor's PCIe ratio.",
            80,
            67.0,
            495.0,
            989.0,
            3350.0,
            55.0,
            55.0,
            pcie_duplex(55.0 * GB_PER_S),
        ),
        // H200-SXM 141GB: the H100's GH100 compute (67 FP32, 495 TF32, 989 FP16
        // dense) with 141 GB HBM3e at 4.8 TB/s. Host link PCIe 5.0 x16 as H100.
        "h200-141gb" => profile(
            name,
            "NVIDIA H200-SXM 141GB on PCIe 5.0 x16. Compute: as H100-SXM5 (67 TFLOP/s FP32, \
             495 TF32, 989 FP16 tensor dense); memory: H200 datasheet (141 GB HBM3e, \
             4.8 TB/s). Host link: ~55 GB/s one way as H100; both ways 55 * 20/12 GB/s by \
             SwapAdvisor's PCIe ratio.",
            141,
            67.0,
            495.0,
            989.0,
            4800.0,
            55.0,
            55.0,
            pcie_duplex(55.0 * GB_PER_S),
        ),
        _ => return None,
    };
    Some(p)
}

impl DeviceProfile {
    /// A built-in profile by name; an unknown name is an error listing the names.
    pub fn builtin(name: &str) -> Result<DeviceProfile, CostError> {
        builtin_profile(name).ok_or_else(|| {
            CostError::new(CostErrorKind::UnknownDevice {
                name: name.to_string(),
                known: BUILTIN_NAMES.join(", "),
            })
        })
    }

    /// The names of the built-in profiles.
    pub fn builtin_names() -> &'static [&'static str] {
        BUILTIN_NAMES
    }

    /// Every built-in profile, in the order of [`DeviceProfile::builtin_names`].
    pub fn builtins() -> Vec<DeviceProfile> {
        BUILTIN_NAMES
            .iter()
            .filter_map(|name| builtin_profile(name))
            .collect()
    }

    /// Parses and validates a profile from JSON text; `origin` names the source in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<DeviceProfile, CostError> {
        let profile: DeviceProfile = serde_json::from_str(text).map_err(|e| {
            CostError::new(CostErrorKind::Parse {
                origin: origin.to_string(),
                what: "device profile (JSON object with the fields of DeviceProfile; rates in bytes/s and FLOP/s, times in seconds)",
                detail: e.to_string(),
            })
        })?;
        profile.validate_as(origin)?;
        Ok(profile)
    }

    /// Reads and validates a user profile from a JSON file.
    pub fn from_json_file(path: &Path) -> Result<DeviceProfile, CostError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| {
            CostError::new(CostErrorKind::Read {
                path: origin.clone(),
                source,
            })
        })?;
        // A UTF-8 byte order mark (some editors write one) is not JSON.
        DeviceProfile::from_json_str(text.strip_prefix('\u{feff}').unwrap_or(&text), &origin)
    }

    /// A built-in profile by name, else a profile file at that path.
    pub fn load(name_or_path: &str) -> Result<DeviceProfile, CostError> {
        if let Some(p) = builtin_profile(name_or_path) {
            return Ok(p);
        }
        let path = Path::new(name_or_path);
        // A string that names no file and does not look like a path was most
        // likely a misspelt built-in name, so list the names rather than saying
        // "file not found".
        let looks_like_path = name_or_path.contains(['/', '\\']) || name_or_path.ends_with(".json");
        if path.is_file() || looks_like_path {
            DeviceProfile::from_json_file(path)
        } else {
            DeviceProfile::builtin(name_or_path)
        }
    }

    /// The JSON form, as [`DeviceProfile::from_json_str`] reads it.
    pub fn to_json_string(&self) -> String {
        // A struct of strings and numbers always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks that every rate is positive, finite and at most [`MAX_RATE_PER_S`],
    /// times are non-negative and at most [`MAX_OVERHEAD_S`], and memory is non-zero.
    pub fn validate(&self) -> Result<(), CostError> {
        self.validate_as("in memory")
    }

    /// [`DeviceProfile::validate`], naming `origin` (a file, a plan) in errors.
    pub fn validate_as(&self, origin: &str) -> Result<(), CostError> {
        let bad = |field: &'static str, requirement: &'static str, value: String| {
            Err(CostError::new(CostErrorKind::InvalidProfile {
                profile: self.name.clone(),
                origin: origin.to_string(),
                field,
                requirement,
                value,
            }))
        };
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty", format!("{:?}", self.name));
        }
        if self.memory_bytes == 0 {
            return bad(
                "memory_bytes",
                "must be positive (bytes); give the device's total memory",
                "0".into(),
            );
        }
        let positive: [(&'static str, f64); 6] = [
            ("peak_flops_f32", self.peak_flops_f32),
            ("peak_flops_f16", self.peak_flops_f16),
            (
                "memory_bandwidth_bytes_per_s",
                self.memory_bandwidth_bytes_per_s,
            ),
            ("h2d_bytes_per_s", self.h2d_bytes_per_s),
            ("d2h_bytes_per_s", self.d2h_bytes_per_s),
            ("duplex_bytes_per_s", self.duplex_bytes_per_s),
        ];
        for (field, value) in positive {
            if !(value.is_finite() && value > 0.0 && value <= MAX_RATE_PER_S) {
                return bad(
                    field,
                    "must be a positive rate in (0, 1e18] bytes/s or FLOP/s; give the measured or datasheet rate in base units (e.g. 2.5e10 for 25 GB/s)",
                    number_text(value),
                );
            }
        }
        if !(self.peak_flops_tf32.is_finite()
            && self.peak_flops_tf32 >= 0.0
            && self.peak_flops_tf32 <= MAX_RATE_PER_S)
        {
            return bad(
                "peak_flops_tf32",
                "must be a rate in [0, 1e18] FLOP/s, 0 when the device has no TF32",
                number_text(self.peak_flops_tf32),
            );
        }
        let (one_way_max, one_way_sum) = (
            self.h2d_bytes_per_s.max(self.d2h_bytes_per_s),
            self.h2d_bytes_per_s + self.d2h_bytes_per_s,
        );
        if !(one_way_max..=one_way_sum).contains(&self.duplex_bytes_per_s) {
            return bad(
                "duplex_bytes_per_s",
                "must lie between the larger one-way rate and the sum of both (copies in both directions at once move at least what one direction does alone, and at most both at full rate); give the measured both-directions total, e.g. 20/12 of the one-way rate for PCIe",
                number_text(self.duplex_bytes_per_s),
            );
        }
        let overheads: [(&'static str, f64); 2] = [
            ("copy_latency_s", self.copy_latency_s),
            ("kernel_launch_s", self.kernel_launch_s),
        ];
        for (field, value) in overheads {
            if !(value.is_finite() && (0.0..=MAX_OVERHEAD_S).contains(&value)) {
                return bad(
                    field,
                    "must be a time in [0, 1] seconds; give the per-call overhead in seconds (e.g. 5e-6 for 5 us)",
                    number_text(value),
                );
            }
        }
        Ok(())
    }

    /// Host-to-device rate while device-to-host copies run at the same time.
    ///
    /// The measured both-directions total is split evenly, `duplex / 2`, and capped
    /// by the one-way rate: `min(h2d, duplex / 2)`. An even split is what two
    /// saturated copy engines get from a shared link (neither has priority); the
    /// cap keeps a direction from running faster than it does alone when the
    /// total is generous (NVLink). With unequal one-way rates the faster direction
    /// could in principle take the slower one's leftover; we do not model that,
    /// which errs on the slow side.
    pub fn h2d_duplex_bytes_per_s(&self) -> f64 {
        self.h2d_bytes_per_s.min(self.duplex_bytes_per_s / 2.0)
    }

    /// Device-to-host rate while host-to-device copies run at the same time:
    /// `min(d2h, duplex / 2)`, see [`DeviceProfile::h2d_duplex_bytes_per_s`].
    pub fn d2h_duplex_bytes_per_s(&self) -> f64 {
        self.d2h_bytes_per_s.min(self.duplex_bytes_per_s / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_follow_the_name_list_and_validate() {
        let all = DeviceProfile::builtins();
        let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, DeviceProfile::builtin_names());
        for p in &all {
            p.validate().unwrap();
            assert!(!p.description.is_empty(), "{} has no source", p.name);
            // Host links are far slower than device memory on every card here.
            assert!(p.h2d_bytes_per_s < p.memory_bandwidth_bytes_per_s / 10.0);
            // Tensor cores are never slower than CUDA cores.
            assert!(p.peak_flops_f16 > p.peak_flops_f32);
        }
    }

    #[test]
    fn memory_is_whole_gib() {
        let v100 = DeviceProfile::builtin("v100-16gb-pcie3").unwrap();
        assert_eq!(v100.memory_bytes, 16 * (1 << 30));
        let h200 = DeviceProfile::builtin("h200-141gb").unwrap();
        assert_eq!(h200.memory_bytes, 141 * (1 << 30));
    }

    #[test]
    fn duplex_rate_is_half_the_total_capped_by_one_way() {
        // PCIe 3.0 as SwapAdvisor measured it: 20 GB/s total -> 10 GB/s each way,
        // below the 12 GB/s one-way rate.
        let pcie = DeviceProfile::builtin("v100-16gb-pcie3").unwrap();
        assert_eq!(pcie.h2d_duplex_bytes_per_s(), 10e9);
        assert_eq!(pcie.d2h_duplex_bytes_per_s(), 10e9);
        // A generous total is capped by the one-way rate.
        let mut p = pcie.clone();
        p.duplex_bytes_per_s = 100e9;
        assert_eq!(p.h2d_duplex_bytes_per_s(), 12e9);
        p.d2h_bytes_per_s = 8e9;
        assert_eq!(p.d2h_duplex_bytes_per_s(), 8e9);
    }

    /// A both-directions total below the one-way rate (1 B/s beside 12
    /// GB/s) or above both directions at full rate is refused by name; the
    /// built-in profiles lie inside.
    #[test]
    fn a_duplex_rate_outside_the_one_way_rates_is_refused() {
        for p in DeviceProfile::builtins() {
            p.validate().expect("built-in profiles are consistent");
        }
        let pcie = DeviceProfile::builtin("v100-16gb-pcie3").unwrap();
        for duplex in [1.0, 11e9, 24.5e9] {
            let mut p = pcie.clone();
            p.duplex_bytes_per_s = duplex;
            let e = p.validate().expect_err("inconsistent").to_string();
            assert!(e.contains("duplex_bytes_per_s"), "{e}");
            assert!(e.contains("between the larger one-way rate"), "{e}");
        }
        let mut p = pcie;
        p.duplex_bytes_per_s = 24e9;
        p.validate().expect("both directions at full rate");
    }

    /// Huge numbers in an error are written in exponent form.
    #[test]
    fn an_error_writes_a_huge_number_in_exponent_form() {
        let mut p = DeviceProfile::builtin("v100-16gb-pcie3").unwrap();
        p.copy_latency_s = 1e300;
        let e = p.validate().expect_err("out of range").to_string();
        assert!(e.contains("1e300"), "{e}");
        assert_eq!(super::number_text(5e-6), "5e-6");
        assert_eq!(super::number_text(0.5), "0.5");
        assert_eq!(super::number_text(2.5e10), "25000000000");
    }

    #[test]
    fn pcie_duplex_uses_swapadvisors_ratio() {
        assert!((pcie_duplex(12e9) - 20e9).abs() < 1.0);
        let a100 = DeviceProfile::builtin("a100-40gb").unwrap();
        assert!((a100.duplex_bytes_per_s - 25e9 * 20.0 / 12.0).abs() < 1.0);
    }

    #[test]
    fn unknown_name_lists_the_builtins() {
        let err = DeviceProfile::builtin("v200").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown device `v200`"), "{msg}");
        for name in DeviceProfile::builtin_names() {
            assert!(msg.contains(name), "{msg}");
        }
        // `load` treats a bare word as a misspelt name, not a missing file.
        let msg = DeviceProfile::load("v200").unwrap_err().to_string();
        assert!(msg.contains("a100-40gb"), "{msg}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.d2h_bytes_per_s = -1.0;
        let msg = p.validate().unwrap_err().to_string();
        assert!(msg.contains("`d2h_bytes_per_s`"), "{msg}");
        assert!(msg.contains("positive"), "{msg}");

        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.peak_flops_f32 = f64::NAN;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("peak_flops_f32")
        );

        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.copy_latency_s = -1e-6;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("copy_latency_s")
        );

        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.memory_bytes = 0;
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("memory_bytes")
        );

        // Finite but absurd numbers are out of range, named with the range.
        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.kernel_launch_s = 1e308;
        let msg = p.validate().unwrap_err().to_string();
        assert!(msg.contains("`kernel_launch_s`"), "{msg}");
        assert!(msg.contains("[0, 1] seconds"), "{msg}");
        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.h2d_bytes_per_s = 1e300;
        let msg = p.validate().unwrap_err().to_string();
        assert!(msg.contains("(0, 1e18]"), "{msg}");

        // No TF32 and zero overheads are allowed.
        let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
        p.peak_flops_tf32 = 0.0;
        p.copy_latency_s = 0.0;
        p.kernel_launch_s = 0.0;
        p.validate().unwrap();
    }

    #[test]
    fn json_round_trip_and_unknown_fields() {
        let p = DeviceProfile::builtin("h100-80gb").unwrap();
        let back = DeviceProfile::from_json_str(&p.to_json_string(), "test").unwrap();
        assert_eq!(back, p);

        let text = p
            .to_json_string()
            .replace("\"h2d_bytes_per_s\"", "\"h2d_byte_per_s\"");
        let msg = DeviceProfile::from_json_str(&text, "typo.json")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("typo.json"), "{msg}");
        assert!(msg.contains("h2d_byte_per_s"), "{msg}");
    }

    #[test]
    fn tf32_is_optional_left_out_when_off_and_a_bad_mode_is_named() {
        let p = DeviceProfile::builtin("h100-80gb").unwrap();
        assert_eq!(p.tf32, Tf32::Off);
        let text = p.to_json_string();
        assert!(!text.contains("\"tf32\""), "{text}");
        // Files written before the field read as `off`; the field reads back.
        let mut with = p.clone();
        with.tf32 = Tf32::Convolutions;
        let with_text = with.to_json_string();
        assert!(
            with_text.contains("\"tf32\": \"convolutions\""),
            "{with_text}"
        );
        assert_eq!(
            DeviceProfile::from_json_str(&with_text, "t.json").unwrap(),
            with
        );
        let bad = with_text.replace("\"convolutions\"", "\"conv\"");
        let msg = DeviceProfile::from_json_str(&bad, "t.json")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("conv") && msg.contains("convolutions"),
            "{msg}"
        );
    }
}
