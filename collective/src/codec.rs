//! Gradient compression for the all-reduce: what crosses the wire is smaller, the optimiser still sees an f32
//! mean gradient and keeps f32 master weights.
//!
//! - [`Compression::Fp16`] / [`Compression::Bf16`]: cast (after dividing by the world size, as DDP's
//!   `fp16_compress_hook` does, so the sum cannot overflow), all-reduce, cast back. Half the bytes.
//! - [`Compression::TopK`]: each rank sends only its k largest-magnitude entries (values and i32 indices,
//!   all-gathered), and keeps what it did not send as a residual added to its next gradient (error feedback),
//!   so no gradient is lost, only delayed.
use tch::{Kind, Tensor};

use crate::{Error, ProcessGroup, Result};

/// How gradients are compressed on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Compression {
    /// f32 as is.
    None,
    /// IEEE half precision.
    Fp16,
    /// bfloat16 (f32's range, 8 bits of mantissa).
    Bf16,
    /// The `fraction` (0 < fraction ≤ 1) of entries with the largest magnitude, with error feedback.
    TopK {
        /// Share of the entries each rank sends per step.
        fraction: f64,
    },
}

impl Compression {
    /// Parse a config value: `none`, `fp16`, `bf16` or `topk:<fraction>` (e.g. `topk:0.01`).
    pub fn parse(text: &str) -> std::result::Result<Compression, String> {
        let t = text.trim();
        match t {
            "none" => Ok(Compression::None),
            "fp16" => Ok(Compression::Fp16),
            "bf16" => Ok(Compression::Bf16),
            _ => match t.strip_prefix("topk:").map(str::parse::<f64>) {
                Some(Ok(f)) if f > 0.0 && f <= 1.0 => Ok(Compression::TopK { fraction: f }),
                _ => Err(format!(
                    "compression {text:?}: expected none, fp16, bf16 or topk:<fraction in (0, 1]> (e.g. topk:0.01)"
                )),
            },
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => write!(f, "none"),
            Compression::Fp16 => write!(f, "fp16"),
            Compression::Bf16 => write!(f, "bf16"),
            Compression::TopK { fraction } => write!(f, "topk:{fraction}"),
        }
    }
}

/// Averages a flat f32 gradient over the group, compressed as configured; keeps top-k's residual between steps.
#[derive(Debug)]
pub struct GradientCodec {
    compression: Compression,
    /// Top-k's error feedback: what this rank has not sent yet.
    residual: Option<Tensor>,
    /// Payload bytes this rank has put into collectives so far.
    bytes_sent: u64,
}

impl GradientCodec {
    /// A codec with an empty residual.
    pub fn new(compression: Compression) -> Self {
        GradientCodec { compression, residual: None, bytes_sent: 0 }
    }

    /// The compression.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Payload bytes this rank has contributed to collectives (the compressed size, before the collective's
    /// own traffic: a ring all-reduce moves 2(n−1)/n of it per rank, an all-gather (n−1) times it).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// The payload bytes one step sends for a gradient of `numel` f32 entries.
    pub fn payload_bytes(&self, numel: i64) -> u64 {
        let n = numel as u64;
        match self.compression {
            Compression::None => 4 * n,
            Compression::Fp16 | Compression::Bf16 => 2 * n,
            Compression::TopK { fraction } => 8 * top_k(numel, fraction) as u64,
        }
    }

    /// The residual top-k has kept back (zeros before the first step; `None` for other compressions).
    pub fn residual(&self) -> Option<&Tensor> {
        self.residual.as_ref()
    }

    /// Replace `grad` (a contiguous f32 vector) with the mean over all ranks of their gradients, as compressed.
    pub fn all_reduce_mean(&mut self, group: &mut ProcessGroup, grad: &mut Tensor) -> Result<()> {
        if grad.kind() != Kind::Float || grad.dim() != 1 {
            return Err(Error::Tensor(format!(
                "gradient codec: expected a flat f32 vector, got {:?} of shape {:?}",
                grad.kind(),
                grad.size()
            )));
        }
        let world = group.world_size() as f64;
        self.bytes_sent += self.payload_bytes(grad.numel() as i64);
        match self.compression {
            Compression::None => group.all_reduce_mean(grad),
            Compression::Fp16 | Compression::Bf16 => {
                let kind = if self.compression == Compression::Fp16 { Kind::Half } else { Kind::BFloat16 };
                let mut wire = (&*grad / world).to_kind(kind);
                group.all_reduce_sum(&mut wire)?;
                grad.copy_(&wire);
                Ok(())
            }
            Compression::TopK { fraction } => {
                let k = top_k(grad.numel() as i64, fraction);
                let residual = self.residual.get_or_insert_with(|| grad.zeros_like());
                if residual.size() != grad.size() {
                    return Err(Error::Tensor(format!(
                        "gradient codec: top-k residual holds {} entries, this gradient {}: one codec per \
                         parameter set",
                        residual.numel(),
                        grad.numel()
                    )));
                }
                let acc = &*grad + &*residual;
                let (_, index) = acc.abs().topk(k, 0, true, false);
                let values = acc.index_select(0, &index);
                // What is sent leaves the residual; the rest waits for the next step.
                *residual = acc.index_fill(0, &index, 0.0);
                let all_values = group.all_gather(&values)?;
                let all_index = group.all_gather(&index.to_kind(Kind::Int))?;
                let _ = grad.zero_();
                let _ = grad.index_add_(0, &all_index.flatten(0, -1).to_kind(Kind::Int64), &all_values.flatten(0, -1));
                let _ = grad.g_mul_scalar_(1.0 / world);
                Ok(())
            }
        }
    }
}

/// How many entries top-k sends for `numel` entries and `fraction`: at least one.
pub fn top_k(numel: i64, fraction: f64) -> i64 {
    ((numel as f64 * fraction).round() as i64).clamp(1, numel.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressions_parse_and_print_back() {
        for text in ["none", "fp16", "bf16", "topk:0.01"] {
            assert_eq!(Compression::parse(text).unwrap().to_string(), text);
        }
        for bad in ["fp8", "topk:0", "topk:1.5", "topk:x", ""] {
            let e = Compression::parse(bad).unwrap_err();
            assert!(e.contains("expected none, fp16, bf16 or topk"), "{bad}: {e}");
        }
        assert_eq!(top_k(1000, 0.01), 10);
        assert_eq!(top_k(10, 0.001), 1, "at least one entry");
        let codec = GradientCodec::new(Compression::TopK { fraction: 0.01 });
        assert_eq!(codec.payload_bytes(1_000_000), 80_000, "10 K values + 10 K i32 indices");
    }
}
