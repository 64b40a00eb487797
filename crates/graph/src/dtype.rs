//! Element types and their sizes.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of a tensor. Names follow PyTorch (`float32`, `int64`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Float64,
    Float32,
    Float16,
    Bfloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    Uint8,
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::Float64 | DType::Int64 => 8,
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::Bfloat16 | DType::Int16 => 2,
            DType::Int8 | DType::Uint8 | DType::Bool => 1,
        }
    }

    /// The PyTorch spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Float64 => "float64",
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Int64 => "int64",
            DType::Int32 => "int32",
            DType::Int16 => "int16",
            DType::Int8 => "int8",
            DType::Uint8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Whether the type is a floating-point type (the cost model prices FLOPs by it).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float64 | DType::Float32 | DType::Float16 | DType::Bfloat16
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "float64" | "double" => DType::Float64,
            "float32" | "float" => DType::Float32,
            "float16" | "half" => DType::Float16,
            "bfloat16" => DType::Bfloat16,
            "int64" | "long" => DType::Int64,
            "int32" | "int" => DType::Int32,
            "int16" | "short" => DType::Int16,
            "int8" => DType::Int8,
            "uint8" => DType::Uint8,
            "bool" => DType::Bool,
            other => return Err(format!("unknown dtype `{other}`")),
        })
    }
}
