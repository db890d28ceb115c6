//! TensorBoard event files: what `torch.utils.tensorboard.SummaryWriter` writes, so TensorBoard (and its Python
//! `event_accumulator`) reads a Flotilla run directory as it reads a PyTorch one.
//!
//! A file `events.out.tfevents.{unix seconds}.{host}.{pid}.{n}` holds TFRecords: each an 8-byte little-endian
//! length, its masked CRC32C, the payload (a serialised `tensorflow.Event`) and the payload's masked CRC32C. The
//! first event names the file version (`brain.Event:2`); then one event per summary: scalars as
//! `Summary.Value.simple_value`, text (hyperparameters) as a string tensor for the `text` plugin.
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Error, Result};

/// The protobuf messages TensorBoard reads, with TensorFlow's field numbers (event.proto, summary.proto,
/// tensor.proto, tensor_shape.proto). Fields Flotilla never writes are left out: protobuf readers skip absent
/// fields, and these are never parsed here.
mod proto {
    /// `tensorflow.Event`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        #[prost(int64, tag = "2")]
        pub step: i64,
        #[prost(oneof = "What", tags = "3, 5, 7")]
        pub what: Option<What>,
    }

    /// `Event.what`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(Summary),
        #[prost(message, tag = "7")]
        SessionLog(SessionLog),
    }

    /// `tensorflow.SessionLog`: `status` 1 is `START` (a session (re)starts here).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionLog {
        #[prost(int32, tag = "1")]
        pub status: i32,
    }

    /// `tensorflow.SessionLog.SessionStatus.START`.
    pub const SESSION_START: i32 = 1;

    /// `tensorflow.Summary`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<Value>,
    }

    /// `tensorflow.Summary.Value`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(string, tag = "1")]
        pub tag: String,
        #[prost(message, optional, tag = "9")]
        pub metadata: Option<SummaryMetadata>,
        #[prost(oneof = "Data", tags = "2, 8")]
        pub data: Option<Data>,
    }

    /// `Summary.Value.value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Data {
        #[prost(float, tag = "2")]
        SimpleValue(f32),
        #[prost(message, tag = "8")]
        Tensor(TensorProto),
    }

    /// `tensorflow.SummaryMetadata`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryMetadata {
        #[prost(message, optional, tag = "1")]
        pub plugin_data: Option<PluginData>,
    }

    /// `SummaryMetadata.PluginData`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginData {
        #[prost(string, tag = "1")]
        pub plugin_name: String,
        #[prost(bytes = "vec", tag = "2")]
        pub content: Vec<u8>,
    }

    /// `tensorflow.TensorProto`, as far as a string tensor needs it.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        /// `tensorflow.DataType`: 7 is `DT_STRING`.
        #[prost(int32, tag = "1")]
        pub dtype: i32,
        #[prost(message, optional, tag = "2")]
        pub tensor_shape: Option<TensorShapeProto>,
        #[prost(bytes = "vec", repeated, tag = "8")]
        pub string_val: Vec<Vec<u8>>,
    }

    /// `tensorflow.TensorShapeProto` (no dimensions: a scalar).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {}

    /// `tensorflow.DataType.DT_STRING`.
    pub const DT_STRING: i32 = 7;
}

/// TFRecord's masked CRC32C of `data`: the checksum rotated right by 15 bits plus a constant, so that a CRC
/// over bytes that hold CRCs stays well distributed.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Append one TFRecord holding `payload` to `out`.
fn write_record(out: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let len = (payload.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc32c(&len).to_le_bytes())?;
    out.write_all(payload)?;
    out.write_all(&masked_crc32c(payload).to_le_bytes())
}

/// An open TensorBoard event file. Every `add_*` appends one event and flushes it, so a crash loses at most the
/// event being written (as `metrics.csv` does).
#[derive(Debug)]
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (which must exist), named as TensorFlow names them; never overwrites one (a
    /// resumed run adds a file beside the first: TensorBoard reads a directory's files as one run).
    pub fn create(dir: &Path) -> Result<Self> {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let host = hostname();
        let mut n = 0u32;
        let (file, path) = loop {
            let path = dir.join(format!("events.out.tfevents.{secs}.{host}.{}.{n}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (f, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(source) => return Err(Error::Io { action: "creating", path: path.display().to_string(), source }),
            }
        };
        let mut writer = EventWriter { out: BufWriter::new(file), path };
        writer.write(proto::Event {
            wall_time: wall_time(),
            step: 0,
            what: Some(proto::What::FileVersion("brain.Event:2".into())),
        })?;
        Ok(writer)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Scalars at one step, as one event (TensorBoard's x axis is `step`; Flotilla uses env steps). Non-finite
    /// values are written as they are (TensorBoard shows them as gaps).
    pub fn add_scalars<S: AsRef<str>>(&mut self, step: u64, scalars: &[(S, f64)]) -> Result<()> {
        if scalars.is_empty() {
            return Ok(());
        }
        let value = scalars
            .iter()
            .map(|(tag, v)| proto::Value {
                tag: tag.as_ref().to_string(),
                metadata: None,
                data: Some(proto::Data::SimpleValue(*v as f32)),
            })
            .collect();
        self.write_summary(step, value)
    }

    /// A session (re)starts at `step`: TensorBoard's reader drops the points of this directory's earlier event
    /// files at `step` and after (TensorFlow's `SessionLog.START`), so a run resumed from a checkpoint shows the
    /// resumed curve, not what a dead process logged past its checkpoint.
    pub fn add_session_start(&mut self, step: u64) -> Result<()> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        let start = proto::SessionLog { status: proto::SESSION_START };
        self.write(proto::Event { wall_time: wall_time(), step, what: Some(proto::What::SessionLog(start)) })
    }

    /// Markdown text under `tag` (TensorBoard's Text tab), e.g. the run's hyperparameters.
    pub fn add_text(&mut self, step: u64, tag: &str, markdown: &str) -> Result<()> {
        let value = proto::Value {
            tag: tag.to_string(),
            metadata: Some(proto::SummaryMetadata {
                plugin_data: Some(proto::PluginData { plugin_name: "text".into(), content: Vec::new() }),
            }),
            data: Some(proto::Data::Tensor(proto::TensorProto {
                dtype: proto::DT_STRING,
                tensor_shape: Some(proto::TensorShapeProto {}),
                string_val: vec![markdown.as_bytes().to_vec()],
            })),
        };
        self.write_summary(step, vec![value])
    }

    fn write_summary(&mut self, step: u64, value: Vec<proto::Value>) -> Result<()> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write(proto::Event {
            wall_time: wall_time(),
            step,
            what: Some(proto::What::Summary(proto::Summary { value })),
        })
    }

    fn write(&mut self, event: proto::Event) -> Result<()> {
        let payload = prost::Message::encode_to_vec(&event);
        write_record(&mut self.out, &payload).and_then(|_| self.out.flush()).map_err(|source| Error::Io {
            action: "writing",
            path: self.path.display().to_string(),
            source,
        })
    }
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// This machine's name for the file name (as TensorFlow's `socket.gethostname()`), `localhost` if unknown;
/// characters other than letters, digits, `-`, `_` and `.` become `_`.
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into());
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

/// A Markdown table of `(key, value)` rows, as CleanRL writes its hyperparameters (`|param|value|`); `|` in a
/// cell is escaped.
pub fn markdown_table<K: AsRef<str>, V: AsRef<str>>(rows: &[(K, V)]) -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut out = String::from("|param|value|\n|-|-|\n");
    for (k, v) in rows {
        out.push_str(&format!("|{}|{}|\n", esc(k.as_ref()), esc(v.as_ref())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read back the TFRecords of a file, checking both checksums of every record.
    fn records(path: &Path) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let mut out = Vec::new();
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc32c(len_bytes));
            let payload = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(payload));
            out.push(payload.to_vec());
            at += 16 + len;
        }
        out
    }

    #[test]
    fn masked_crc32c_matches_tensorflow() {
        // CRC32C check value of "123456789" (RFC 3720) is 0xe3069283; TensorFlow masks it as below.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
        // The empty string's masked CRC, as TensorFlow's `masked_crc32c(b"")` gives it.
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn events_round_trip_through_the_record_framing() {
        let dir = std::env::temp_dir().join(format!("flotilla-tb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = EventWriter::create(&dir).unwrap();
        w.add_scalars(100, &[("charts/sps", 12.5), ("losses/value_loss", 0.25)]).unwrap();
        w.add_text(0, "hyperparameters", &markdown_table(&[("algorithm.kind", "ppo")])).unwrap();
        // A second writer in the same directory gets a file of its own.
        let w2 = EventWriter::create(&dir).unwrap();
        assert_ne!(w.path(), w2.path());
        let events: Vec<proto::Event> =
            records(w.path()).iter().map(|r| prost::Message::decode(r.as_slice()).unwrap()).collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].what, Some(proto::What::FileVersion("brain.Event:2".into())));
        let Some(proto::What::Summary(s)) = &events[1].what else { panic!("{:?}", events[1]) };
        assert_eq!(events[1].step, 100);
        let got: Vec<(&str, Option<&proto::Data>)> =
            s.value.iter().map(|v| (v.tag.as_str(), v.data.as_ref())).collect();
        assert_eq!(
            got,
            [
                ("charts/sps", Some(&proto::Data::SimpleValue(12.5))),
                ("losses/value_loss", Some(&proto::Data::SimpleValue(0.25)))
            ]
        );
        let Some(proto::What::Summary(s)) = &events[2].what else { panic!("{:?}", events[2]) };
        let Some(proto::Data::Tensor(t)) = &s.value[0].data else { panic!("{s:?}") };
        assert_eq!(String::from_utf8_lossy(&t.string_val[0]), "|param|value|\n|-|-|\n|algorithm.kind|ppo|\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
