//! Batches of observations in their own element type: image frames stay `u8` from the emulator to the
//! learner's device (where the network divides by 255); everything else is `f32`.
//!
//! [`ObsBuf`] owns a batch, [`ObsRef`] borrows one (or a row range of one). Code that only understands floats
//! calls [`ObsRef::to_f32`], which converts frames explicitly: nothing converts behind the caller's back.
use std::ops::Range;

use crate::space::DType;

/// Owned observations, flattened row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum ObsBuf {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// Bytes (image frames).
    U8(Vec<u8>),
}

/// Borrowed observations, flattened row-major.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ObsRef<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// Bytes (image frames).
    U8(&'a [u8]),
}

impl ObsBuf {
    /// An empty buffer of `dtype`.
    pub fn empty(dtype: DType) -> Self {
        match dtype {
            DType::F32 => ObsBuf::F32(Vec::new()),
            DType::U8 => ObsBuf::U8(Vec::new()),
        }
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F32 => ObsBuf::F32(vec![0.0; len]),
            DType::U8 => ObsBuf::U8(vec![0; len]),
        }
    }

    /// An empty buffer of `dtype` with room for `capacity` elements.
    pub fn with_capacity(dtype: DType, capacity: usize) -> Self {
        match dtype {
            DType::F32 => ObsBuf::F32(Vec::with_capacity(capacity)),
            DType::U8 => ObsBuf::U8(Vec::with_capacity(capacity)),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.as_ref().dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole buffer, borrowed.
    pub fn as_ref(&self) -> ObsRef<'_> {
        match self {
            ObsBuf::F32(v) => ObsRef::F32(v),
            ObsBuf::U8(v) => ObsRef::U8(v),
        }
    }

    /// Elements `range`, borrowed. Panics if it is out of bounds, as slicing does.
    pub fn slice(&self, range: Range<usize>) -> ObsRef<'_> {
        self.as_ref().slice(range)
    }

    /// Forget the contents, keeping the allocation and the dtype.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keep the first `len` elements.
    pub fn truncate(&mut self, len: usize) {
        match self {
            ObsBuf::F32(v) => v.truncate(len),
            ObsBuf::U8(v) => v.truncate(len),
        }
    }

    /// Append `other`, which must have this buffer's dtype (`false`, and nothing appended, if not).
    #[must_use]
    pub fn extend(&mut self, other: ObsRef<'_>) -> bool {
        match (self, other) {
            (ObsBuf::F32(v), ObsRef::F32(o)) => v.extend_from_slice(o),
            (ObsBuf::U8(v), ObsRef::U8(o)) => v.extend_from_slice(o),
            _ => return false,
        }
        true
    }

    /// Overwrite elements `at..at + other.len()` with `other`, which must have this buffer's dtype (`false`, and
    /// nothing written, if not). Panics if the range is out of bounds.
    #[must_use]
    pub fn write_at(&mut self, at: usize, other: ObsRef<'_>) -> bool {
        match (self, other) {
            (ObsBuf::F32(v), ObsRef::F32(o)) => v[at..at + o.len()].copy_from_slice(o),
            (ObsBuf::U8(v), ObsRef::U8(o)) => v[at..at + o.len()].copy_from_slice(o),
            _ => return false,
        }
        true
    }

    /// The values of `range` as f32 (u8 frames converted), appended to `out`.
    pub fn extend_f32(&self, range: Range<usize>, out: &mut Vec<f32>) {
        self.slice(range).to_f32(out);
    }
}

impl<'a> ObsRef<'a> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            ObsRef::F32(_) => DType::F32,
            ObsRef::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ObsRef::F32(v) => v.len(),
            ObsRef::U8(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range`. Panics if it is out of bounds, as slicing does.
    pub fn slice(&self, range: Range<usize>) -> ObsRef<'a> {
        match *self {
            ObsRef::F32(v) => ObsRef::F32(&v[range]),
            ObsRef::U8(v) => ObsRef::U8(&v[range]),
        }
    }

    /// The floats, if these are f32 observations.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match *self {
            ObsRef::F32(v) => Some(v),
            ObsRef::U8(_) => None,
        }
    }

    /// The values as f32 (u8 frames converted to 0.0–255.0), appended to `out`.
    pub fn to_f32(&self, out: &mut Vec<f32>) {
        match *self {
            ObsRef::F32(v) => out.extend_from_slice(v),
            ObsRef::U8(v) => out.extend(v.iter().map(|&b| f32::from(b))),
        }
    }

    /// An owned copy.
    pub fn to_buf(&self) -> ObsBuf {
        match *self {
            ObsRef::F32(v) => ObsBuf::F32(v.to_vec()),
            ObsRef::U8(v) => ObsBuf::U8(v.to_vec()),
        }
    }
}

impl<'a> From<&'a [f32]> for ObsRef<'a> {
    fn from(v: &'a [f32]) -> Self {
        ObsRef::F32(v)
    }
}

impl<'a> From<&'a Vec<f32>> for ObsRef<'a> {
    fn from(v: &'a Vec<f32>) -> Self {
        ObsRef::F32(v)
    }
}

impl<'a> From<&'a [u8]> for ObsRef<'a> {
    fn from(v: &'a [u8]) -> Self {
        ObsRef::U8(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_keep_their_dtype() {
        let mut b = ObsBuf::empty(DType::U8);
        assert!(b.extend(ObsRef::U8(&[1, 2, 3])));
        assert!(!b.extend(ObsRef::F32(&[1.0])), "a float row is refused by a frame buffer");
        assert_eq!(b, ObsBuf::U8(vec![1, 2, 3]));
        assert!(b.write_at(1, ObsRef::U8(&[9])));
        assert_eq!(b.slice(1..3), ObsRef::U8(&[9, 3]));
        let mut f = Vec::new();
        b.extend_f32(0..3, &mut f);
        assert_eq!(f, [1.0, 9.0, 3.0]);
        b.clear();
        assert_eq!((b.dtype(), b.len()), (DType::U8, 0));
        assert_eq!(ObsRef::from(&[0.5f32][..]).as_f32(), Some(&[0.5f32][..]));
        assert_eq!(ObsRef::U8(&[1]).as_f32(), None);
    }
}
