//! Constructor arguments for [`make`](crate::make), the counterpart of `gym.make(id, **kwargs)`.
//!
//! The CLI fills a [`Kwargs`] from the `[env]` table of the experiment's TOML; the registry hands each
//! native env the keys it knows and rejects the rest with [`Error::BadArgument`], so a typo in a config
//! file fails loudly instead of being ignored.

use std::fmt;

use flotilla_core::{Error, Result};

/// One argument value, as TOML can spell it.
#[derive(Debug, Clone, PartialEq)]
pub enum KwargValue {
    /// A float (an [`Int`](KwargValue::Int) is accepted wherever a float is expected, as in Python).
    Float(f64),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

impl KwargValue {
    /// A short name of the variant, for error messages.
    fn kind(&self) -> &'static str {
        match self {
            KwargValue::Float(_) => "float",
            KwargValue::Int(_) => "integer",
            KwargValue::Bool(_) => "boolean",
            KwargValue::Str(_) => "string",
        }
    }
}

impl fmt::Display for KwargValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KwargValue::Float(v) => write!(f, "{v:?}"),
            KwargValue::Int(v) => write!(f, "{v}"),
            KwargValue::Bool(v) => write!(f, "{v}"),
            KwargValue::Str(v) => write!(f, "{v:?}"),
        }
    }
}

impl From<f64> for KwargValue {
    fn from(v: f64) -> Self {
        KwargValue::Float(v)
    }
}

impl From<i64> for KwargValue {
    fn from(v: i64) -> Self {
        KwargValue::Int(v)
    }
}

impl From<bool> for KwargValue {
    fn from(v: bool) -> Self {
        KwargValue::Bool(v)
    }
}

impl From<&str> for KwargValue {
    fn from(v: &str) -> Self {
        KwargValue::Str(v.to_string())
    }
}

impl From<String> for KwargValue {
    fn from(v: String) -> Self {
        KwargValue::Str(v)
    }
}

/// A small map from argument name to value that keeps insertion order (so error messages and logs
/// list keys as the user wrote them). Inserting an existing key replaces its value in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kwargs {
    entries: Vec<(String, KwargValue)>,
}

impl Kwargs {
    /// No arguments: every env's defaults.
    pub fn new() -> Self {
        Kwargs::default()
    }

    /// Sets `key`, returning the value it replaced.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<KwargValue>) -> Option<KwargValue> {
        let key = key.into();
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => Some(std::mem::replace(old, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    /// Builder form of [`insert`](Kwargs::insert): `Kwargs::new().with("g", 9.81)`.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<KwargValue>) -> Self {
        self.insert(key, value);
        self
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&KwargValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<KwargValue> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }

    /// Entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &KwargValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: Into<String>, V: Into<KwargValue>> FromIterator<(K, V)> for Kwargs {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut kwargs = Kwargs::new();
        for (k, v) in iter {
            kwargs.insert(k, v);
        }
        kwargs
    }
}

/// Reads typed values out of a [`Kwargs`] for one env, remembering which keys were used so that
/// [`finish`](KwargReader::finish) can reject the unknown ones.
pub(crate) struct KwargReader<'a> {
    env: &'a str,
    kwargs: &'a Kwargs,
    used: Vec<bool>,
}

impl<'a> KwargReader<'a> {
    pub(crate) fn new(env: &'a str, kwargs: &'a Kwargs) -> Self {
        KwargReader { env, kwargs, used: vec![false; kwargs.len()] }
    }

    fn take(&mut self, key: &str) -> Option<&'a KwargValue> {
        let i = self.kwargs.entries.iter().position(|(k, _)| k == key)?;
        self.used[i] = true;
        Some(&self.kwargs.entries[i].1)
    }

    pub(crate) fn error(&self, key: &str, detail: String) -> Error {
        Error::BadArgument { env: self.env.to_string(), key: key.to_string(), detail }
    }

    fn wrong_type(&self, key: &str, expected: &str, got: &KwargValue) -> Error {
        self.error(key, format!("expected {expected}, got the {} {got}", got.kind()))
    }

    /// A finite float (an integer is widened, as Python would).
    pub(crate) fn float(&mut self, key: &str) -> Result<Option<f64>> {
        let value = match self.take(key) {
            None => return Ok(None),
            Some(KwargValue::Float(v)) => *v,
            Some(KwargValue::Int(v)) => *v as f64,
            Some(other) => return Err(self.wrong_type(key, "a number", other)),
        };
        require_finite(self.env, key, value)?;
        Ok(Some(value))
    }

    /// A boolean.
    pub(crate) fn boolean(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key) {
            None => Ok(None),
            Some(KwargValue::Bool(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong_type(key, "a boolean", other)),
        }
    }

    /// An integer.
    pub(crate) fn int(&mut self, key: &str) -> Result<Option<i64>> {
        match self.take(key) {
            None => Ok(None),
            Some(KwargValue::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong_type(key, "an integer", other)),
        }
    }

    /// Fails on the first key nobody read, listing the ones this env accepts.
    pub(crate) fn finish(self, accepted: &[&str]) -> Result<()> {
        match self.used.iter().position(|used| !used) {
            None => Ok(()),
            Some(i) => {
                let key = &self.kwargs.entries[i].0;
                let list = if accepted.is_empty() { "none".to_string() } else { accepted.join(", ") };
                Err(self.error(key, format!("unknown argument; {} accepts: {list}", self.env)))
            }
        }
    }
}

/// A config's `from_kwargs`: `read` takes the keys it knows, then any other key is
/// [`Error::BadArgument`] listing the `accepted` ones.
pub(crate) fn read_config<C>(
    env: &str,
    kwargs: &Kwargs,
    accepted: &[&str],
    read: impl FnOnce(&mut KwargReader<'_>) -> Result<C>,
) -> Result<C> {
    let mut reader = KwargReader::new(env, kwargs);
    let config = read(&mut reader)?;
    reader.finish(accepted)?;
    Ok(config)
}

/// A finite `value` for `key`, else [`Error::BadArgument`].
pub(crate) fn require_finite(env: &str, key: &str, value: f64) -> Result<()> {
    require(env, key, value, value.is_finite(), "a finite number")
}

/// A positive finite `value` for `key`, else [`Error::BadArgument`].
pub(crate) fn require_positive(env: &str, key: &str, value: f64) -> Result<()> {
    require(env, key, value, value.is_finite() && value > 0.0, "a positive finite number")
}

fn require(env: &str, key: &str, value: f64, ok: bool, want: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::BadArgument { env: env.into(), key: key.into(), detail: format!("expected {want}, got {value}") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_replaces_in_place_and_keeps_order() {
        let mut kw = Kwargs::new().with("b", 1i64).with("a", true);
        assert_eq!(kw.insert("b", 2.5), Some(KwargValue::Int(1)));
        let keys: Vec<_> = kw.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(kw.get("b"), Some(&KwargValue::Float(2.5)));
        assert_eq!(kw.remove("a"), Some(KwargValue::Bool(true)));
        assert_eq!(kw.len(), 1);
    }

    #[test]
    fn reader_types_and_unknown_keys() {
        let kw: Kwargs = [("g", KwargValue::Int(10)), ("flag", KwargValue::Str("yes".into()))].into_iter().collect();
        let mut r = KwargReader::new("Pendulum-v1", &kw);
        assert_eq!(r.float("g"), Ok(Some(10.0)));
        let err = r.boolean("flag").unwrap_err();
        assert!(err.to_string().contains("expected a boolean, got the string \"yes\""), "{err}");
        let mut r = KwargReader::new("Pendulum-v1", &kw);
        r.float("g").unwrap();
        let err = r.finish(&["g"]).unwrap_err();
        assert_eq!(
            err,
            Error::BadArgument {
                env: "Pendulum-v1".into(),
                key: "flag".into(),
                detail: "unknown argument; Pendulum-v1 accepts: g".into()
            }
        );
    }
}
