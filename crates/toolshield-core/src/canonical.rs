//! Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and SHA-256 keys.
//!
//! Two payloads that mean the same JSON (keys in another order, `1.0` and `1`, other
//! whitespace) canonicalise to the same bytes and so to the same digest. serde_json's own
//! map order is never relied on.

use std::cmp::Ordering;
use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::{ErrorKind, ToolError};

/// A SHA-256 digest, shown and serialised as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        self.hex().as_str().to_owned()
    }

    /// The 64-character lowercase hex form, on the stack: for a key built around it, with
    /// no allocation of its own.
    ///
    /// ```
    /// use toolshield_core::Digest;
    ///
    /// let d = Digest::of_bytes(b"{}");
    /// let sha256_of_braces = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
    /// assert_eq!(d.hex().as_str(), sha256_of_braces);
    /// assert_eq!(d.to_string(), sha256_of_braces);
    /// assert_eq!(Digest::from_hex(d.hex().as_str()), Some(d));
    /// ```
    pub fn hex(&self) -> DigestHex {
        let mut out = [0u8; 64];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
        }
        DigestHex(out)
    }

    /// Parses the 64-character hex form.
    pub fn from_hex(s: &str) -> Option<Digest> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
    }
}

/// Two lowercase hex digits for every byte value.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        pairs[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    pairs
};

/// A [`Digest`] in lowercase hex, on the stack ([`Digest::hex`]).
#[derive(Clone, Copy)]
pub struct DigestHex([u8; 64]);

impl DigestHex {
    /// The 64 hex characters.
    pub fn as_str(&self) -> &str {
        // Always ASCII: every byte comes from `HEX_PAIRS`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for DigestHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DigestHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Digest::from_hex(&s).ok_or_else(|| serde::de::Error::custom("expected 64 hex characters"))
    }
}

/// Where canonical bytes go: a hasher or a buffer.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    /// One byte: most pieces of canonical JSON are one punctuation byte.
    fn put_byte(&mut self, byte: u8);
    /// A string that needs no escape, in quotes, then a colon when `colon` (a key): the
    /// piece every key and most string values are.
    fn put_quoted(&mut self, bytes: &[u8], colon: bool) {
        self.put_byte(b'"');
        self.put(bytes);
        self.put_byte(b'"');
        if colon {
            self.put_byte(b':');
        }
    }
}

/// SHA-256 fed through a stack buffer: the canonical writer emits many pieces of a few
/// bytes each (a quote, a colon, a short key), and one `update` per piece costs more than
/// the hashing itself. Pieces are gathered here, and each full buffer is hashed with the
/// compression function straight from it (four blocks at a time); `finish` pads in place.
/// No byte is copied into a second buffer, and the hasher is never moved.
struct BufferedHasher {
    state: [u32; 8],
    buf: [u8; BUFFERED],
    /// Bytes in `buf`, at most `BUFFERED`.
    len: usize,
    /// Bytes hashed before those in `buf`.
    hashed: u64,
}

/// Four SHA-256 blocks.
const BUFFERED: usize = 256;

/// A SHA-256 block.
const BLOCK: usize = 64;

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
const SHA256_H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// Hashes `blocks` (a whole number of 64-byte blocks) into `state`, in one call of the
/// compression function: the state is loaded into registers once for all the blocks.
#[inline]
fn compress_blocks(state: &mut [u32; 8], blocks: &[u8]) {
    let (whole, rest) = blocks.as_chunks::<BLOCK>();
    debug_assert!(rest.is_empty());
    sha2::block_api::compress256(state, whole);
}

impl BufferedHasher {
    fn new() -> Self {
        BufferedHasher {
            state: SHA256_H0,
            buf: [0; BUFFERED],
            len: 0,
            hashed: 0,
        }
    }

    /// Hashes the full buffer and empties it.
    #[inline]
    fn flush_full(&mut self) {
        compress_blocks(&mut self.state, &self.buf);
        self.hashed = self.hashed.wrapping_add(BUFFERED as u64);
        self.len = 0;
    }

    /// [`flush_full`](Self::flush_full), out of line: a full buffer is the rare case of
    /// a one-byte piece.
    #[cold]
    #[inline(never)]
    fn flush_full_cold(&mut self) {
        self.flush_full();
    }

    /// The digest of every byte put: the padding (a one bit, zeros, the length in bits)
    /// written into the buffer and hashed with what it holds.
    fn finish(&mut self) -> Digest {
        if self.len == BUFFERED {
            self.flush_full();
        }
        let bits = self
            .hashed
            .wrapping_add(self.len as u64)
            .wrapping_mul(8)
            .to_be_bytes();
        let mut at = self.len;
        self.buf[at] = 0x80;
        at += 1;
        // The padded end: the first block boundary with room for the 8 length bytes.
        let mut end = (at + 8).next_multiple_of(BLOCK);
        if end > BUFFERED {
            self.buf[at..].fill(0);
            compress_blocks(&mut self.state, &self.buf);
            at = 0;
            end = BLOCK;
        }
        self.buf[at..end - 8].fill(0);
        self.buf[end - 8..end].copy_from_slice(&bits);
        compress_blocks(&mut self.state, &self.buf[..end]);
        let mut out = [0u8; 32];
        for (bytes, word) in out.chunks_exact_mut(4).zip(self.state) {
            bytes.copy_from_slice(&word.to_be_bytes());
        }
        Digest(out)
    }
}

impl Sink for BufferedHasher {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        // Most pieces are a short key or value: copied with two fixed-size moves (which
        // may overlap) instead of a call to `memcpy` for a handful of bytes.
        if n <= 16 {
            if let Some(dst) = self.buf.get_mut(self.len..self.len + n) {
                copy_short(dst, bytes);
                self.len += n;
                return;
            }
        }
        self.put_long(bytes);
    }

    #[inline]
    fn put_quoted(&mut self, bytes: &[u8], colon: bool) {
        let n = bytes.len();
        let at = self.len;
        // A short piece with room for it, its quotes and a colon: one bounds check and
        // fixed-size moves.
        if n <= 16 {
            if let Some(dst) = self.buf.get_mut(at..at + n + 3) {
                dst[0] = b'"';
                copy_short(&mut dst[1..=n], bytes);
                dst[n + 1] = b'"';
                dst[n + 2] = b':';
                self.len = at + n + 2 + usize::from(colon);
                return;
            }
        }
        self.put_byte(b'"');
        self.put(bytes);
        self.put_byte(b'"');
        if colon {
            self.put_byte(b':');
        }
    }

    #[inline]
    fn put_byte(&mut self, byte: u8) {
        if self.len == BUFFERED {
            self.flush_full_cold();
        }
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }
}

impl BufferedHasher {
    /// [`Sink::put`] of a piece that is long or does not fit: the buffer filled and
    /// hashed as often as it takes, whole blocks of a long piece hashed where they lie.
    /// Kept out of line: the short pieces' path stays small where it is inlined.
    #[inline(never)]
    fn put_long(&mut self, mut bytes: &[u8]) {
        loop {
            if self.len == 0 && bytes.len() >= BLOCK {
                let whole = bytes.len() - bytes.len() % BLOCK;
                let (blocks, rest) = bytes.split_at(whole);
                compress_blocks(&mut self.state, blocks);
                self.hashed = self.hashed.wrapping_add(whole as u64);
                bytes = rest;
            }
            let room = BUFFERED - self.len;
            if bytes.len() <= room {
                self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
                self.len += bytes.len();
                return;
            }
            let (head, rest) = bytes.split_at(room);
            self.buf[self.len..].copy_from_slice(head);
            self.len = BUFFERED;
            self.flush_full();
            bytes = rest;
        }
    }
}

/// Copies `src` into `dst` (the same length, at most 16 bytes) with fixed-size moves: the
/// first and last 8 (4, 2) bytes, overlapping in the middle, or the one byte (a byte loop
/// here would become a call to `memcpy`).
#[inline]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert!(n == dst.len() && n <= 16);
    if n >= 8 {
        copy_fixed::<8>(dst, src, 0);
        copy_fixed::<8>(dst, src, n - 8);
    } else if n >= 4 {
        copy_fixed::<4>(dst, src, 0);
        copy_fixed::<4>(dst, src, n - 4);
    } else if n >= 2 {
        copy_fixed::<2>(dst, src, 0);
        copy_fixed::<2>(dst, src, n - 2);
    } else {
        copy_fixed::<1>(dst, src, 0);
    }
}

/// Copies the `N` bytes of `src` at `at` to the same place in `dst`.
#[inline(always)]
fn copy_fixed<const N: usize>(dst: &mut [u8], src: &[u8], at: usize) {
    let piece = src
        .get(at..at + N)
        .and_then(|s| <[u8; N]>::try_from(s).ok());
    if let (Some(piece), Some(slot)) = (piece, dst.get_mut(at..at + N)) {
        slot.copy_from_slice(&piece);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn put_byte(&mut self, byte: u8) {
        self.push(byte);
    }
}

/// Whether a key may order differently by UTF-16 code units than by its UTF-8 bytes.
/// Byte order is code point order; UTF-16 order differs from it only between a character
/// of U+E000..=U+FFFF and one above U+FFFF (a surrogate pair sorts first). Those are the
/// characters whose UTF-8 lead byte is 0xEE or above: a key without such a byte orders
/// the same both ways against any other key.
#[inline]
fn utf16_order_may_differ(key: &str) -> bool {
    key.bytes().any(|b| b >= 0xEE)
}

/// Orders two keys by their UTF-16 code units, as RFC 8785 §3.2.3 requires.
fn utf16_cmp(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.as_bytes().cmp(b.as_bytes());
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

/// How deeply arrays and objects may nest in a value that is given a canonical form.
///
/// The writer recurses once per level, so a value built in code (serde_json's parser
/// stops at 128 levels; a `Value` made by hand has no limit) could otherwise exhaust the
/// stack of the thread that hashes it. Deeper values are `INVALID_INPUT`.
pub const MAX_DEPTH: usize = 512;

/// Why a value has no canonical form here.
#[derive(Debug, Clone, Copy)]
enum NoCanonicalForm {
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A number that is not a finite double (only with serde_json's
    /// `arbitrary_precision`, where `1e400` is a `Number`).
    NotFinite,
}

impl NoCanonicalForm {
    fn into_error(self) -> ToolError {
        match self {
            NoCanonicalForm::TooDeep => ToolError::invalid_input(
                "payload nests arrays and objects too deeply for a canonical form",
            ),
            NoCanonicalForm::NotFinite => ToolError::invalid_input(
                "payload holds a number outside the range of a double: it has no canonical form",
            ),
        }
    }
}

/// Writes `value` in RFC 8785 form: object members sorted by UTF-16 code units, no
/// whitespace, numbers as ECMAScript writes doubles, strings with the minimal escapes of
/// `JSON.stringify`. `depth` is how many arrays and objects enclose `value`.
fn write_canonical<S: Sink>(
    value: &Value,
    out: &mut S,
    depth: usize,
) -> Result<(), NoCanonicalForm> {
    if depth >= MAX_DEPTH && matches!(value, Value::Array(_) | Value::Object(_)) {
        return Err(NoCanonicalForm::TooDeep);
    }
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            write_value(value, out, depth)?
        }
        Value::Array(items) => {
            out.put_byte(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put_byte(b',');
                }
                write_value(item, out, depth + 1)?;
            }
            out.put_byte(b']');
        }
        Value::Object(map) => {
            out.put_byte(b'{');
            // serde_json's map is a `BTreeMap`, ordered by bytes, unless its
            // `preserve_order` feature is on (anywhere in the build: features unify), when
            // it keeps insertion order: its keys are then checked key by key first.
            if map_orders_by_bytes() {
                write_byte_ordered_members(map, out, depth)?;
            } else if keys_ascending(map.keys().map(String::as_str)) {
                write_members(map.iter(), true, out, depth)?;
            } else {
                write_members(sorted_by_utf16(map.iter()), true, out, depth)?;
            }
            out.put_byte(b'}');
        }
    }
    Ok(())
}

/// Writes `value`, `depth` arrays and objects deep: a scalar here, an array or object
/// through [`write_canonical`]. Inlined into the loops over members and items, so the
/// scalars most members hold cost no call of their own.
#[inline(always)]
fn write_value<S: Sink>(value: &Value, out: &mut S, depth: usize) -> Result<(), NoCanonicalForm> {
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_str(s, false, out),
        Value::Array(_) | Value::Object(_) => write_canonical(value, out, depth)?,
    }
    Ok(())
}

/// Writes an object's members in the order given, `key:value` separated by commas;
/// `first` when none of the object's members was written before them.
#[inline]
fn write_members<'a, S: Sink>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    mut first: bool,
    out: &mut S,
    depth: usize,
) -> Result<(), NoCanonicalForm> {
    for (k, v) in members {
        write_member(k, v, &mut first, out, depth)?;
    }
    Ok(())
}

/// Writes one member of an object at `depth`, after a comma unless it is the `first`.
#[inline(always)]
fn write_member<S: Sink>(
    key: &str,
    value: &Value,
    first: &mut bool,
    out: &mut S,
    depth: usize,
) -> Result<(), NoCanonicalForm> {
    if !*first {
        out.put_byte(b',');
    }
    *first = false;
    write_str(key, true, out);
    write_value(value, out, depth + 1)
}

/// Writes the members of a map that iterates in byte order of its keys (serde_json's
/// `BTreeMap`) in UTF-16 order (RFC 8785 §3.2.3), in one pass over the map.
///
/// Byte order is UTF-16 order unless a key holds a character from U+E000 up. A key
/// without one (a plain key) holds only characters below U+D800, whose UTF-16 code units
/// are their code points and below every unit of such a character; so a plain key
/// precedes, by UTF-16 as by bytes, every key after it in byte order. Members are written
/// as the map gives them up to the first key that is not plain; that key and the rest are
/// sorted by UTF-16 code units and written after them.
#[inline]
fn write_byte_ordered_members<S: Sink>(
    map: &Map<String, Value>,
    out: &mut S,
    depth: usize,
) -> Result<(), NoCanonicalForm> {
    let mut members = map.iter();
    let mut first = true;
    while let Some((k, v)) = members.next() {
        if !plain_key(k) {
            let rest = sorted_by_utf16(std::iter::once((k, v)).chain(members));
            return write_members(rest, first, out, depth);
        }
        write_member(k, v, &mut first, out, depth)?;
    }
    Ok(())
}

/// `members` in UTF-16 order of their keys.
#[cold]
fn sorted_by_utf16<'a>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
) -> std::vec::IntoIter<(&'a String, &'a Value)> {
    let mut entries: Vec<(&String, &Value)> = members.collect();
    entries.sort_by(|a, b| utf16_cmp(a.0, b.0));
    entries.into_iter()
}

/// Whether `key` orders the same by UTF-16 code units as by bytes against any key.
#[inline]
fn plain_key(key: &str) -> bool {
    !any_non_ascii(key.as_bytes()) || !utf16_order_may_differ(key)
}

/// Whether `keys`, in the order given, are strictly ascending by UTF-16 code units, told
/// by their bytes: every key plain and each above the one before.
fn keys_ascending<'a>(keys: impl Iterator<Item = &'a str>) -> bool {
    let mut prev: Option<&str> = None;
    for k in keys {
        if !plain_key(k) || prev.is_some_and(|p| p.as_bytes() >= k.as_bytes()) {
            return false;
        }
        prev = Some(k);
    }
    true
}

/// Whether this build's `serde_json::Map` iterates in byte order of its keys (no
/// `preserve_order`), found once by asking a map of two keys inserted out of order.
fn map_orders_by_bytes() -> bool {
    static BY_BYTES: OnceLock<bool> = OnceLock::new();
    *BY_BYTES.get_or_init(|| {
        let mut probe = Map::new();
        probe.insert("b".to_owned(), Value::Null);
        probe.insert("a".to_owned(), Value::Null);
        probe.keys().next().map(String::as_str) == Some("a")
    })
}

/// 2^53: every integer of at most this magnitude is exactly a double, and ECMAScript
/// writes it as its plain decimal digits.
const EXACT_INTEGER: u64 = 1 << 53;

/// Writes an integer of magnitude at most [`EXACT_INTEGER`] as decimal digits, without
/// going through a double.
fn write_integer<S: Sink>(negative: bool, mut magnitude: u64, out: &mut S) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        // `magnitude % 10` is below 10, so it fits a byte.
        buf[at] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    out.put(&buf[at..]);
}

fn write_number<S: Sink>(n: &serde_json::Number, out: &mut S) -> Result<(), NoCanonicalForm> {
    // The common case, an integer a double holds exactly: its digits (0 and -0 alike
    // are "0", and serde_json has no integer -0).
    if let Some(u) = n.as_u64() {
        if u <= EXACT_INTEGER {
            write_integer(false, u, out);
            return Ok(());
        }
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= EXACT_INTEGER {
            write_integer(i < 0, i.unsigned_abs(), out);
            return Ok(());
        }
    }
    // I-JSON numbers are IEEE doubles: integers beyond 2^53 lose precision exactly as
    // they would in JavaScript, which is what RFC 8785 specifies.
    let f = if let Some(i) = n.as_i64() {
        i as f64
    } else if let Some(u) = n.as_u64() {
        u as f64
    } else {
        // Only a number beyond a double's range has no `f64` (serde_json's
        // `arbitrary_precision`): it must not be written as something else, such as 0.
        match n.as_f64() {
            Some(f) if f.is_finite() => f,
            _ => return Err(NoCanonicalForm::NotFinite),
        }
    };
    if f == 0.0 {
        // both 0 and -0 are written "0"
        out.put_byte(b'0');
        return Ok(());
    }
    let mut buf = ryu_js::Buffer::new();
    out.put(buf.format_finite(f).as_bytes());
    Ok(())
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

/// Whether some byte of `v` is below `n` (SWAR; exact for `n <= 128`: such a byte, and
/// only such a byte, sets its high bit in the mask).
#[inline(always)]
const fn has_less(v: u64, n: u8) -> bool {
    v.wrapping_sub(ONES.wrapping_mul(n as u64)) & !v & HIGH != 0
}

/// Whether some byte of `v` is `b`.
#[inline(always)]
const fn has_byte(v: u64, b: u8) -> bool {
    has_less(v ^ ONES.wrapping_mul(b as u64), 1)
}

/// Whether `word` holds for some word of `bytes` read eight bytes at a time, the last
/// word overlapping the one before it (so every byte is read and no word is padded);
/// 4 to 7 bytes are read as two overlapping 4-byte halves, fewer byte by byte (`byte`).
/// Every read is a load straight from the slice: a word assembled in memory and loaded
/// whole would stall the load.
#[inline(always)]
fn any_word(bytes: &[u8], word: impl Fn(u64) -> bool, byte: impl Fn(u8) -> bool) -> bool {
    let load8 = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_le_bytes)
    };
    let load4 = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(|w| u64::from(u32::from_le_bytes(w)))
    };
    let n = bytes.len();
    if n < 4 {
        return bytes.iter().any(|&b| byte(b));
    }
    if n < 8 {
        // A read that cannot fail; were it to, the answer errs on "holds".
        return match (load4(0), load4(n - 4)) {
            (Some(lo), Some(hi)) => word(lo | hi << 32),
            _ => true,
        };
    }
    let mut at = 0;
    while at + 8 <= n {
        if load8(at).is_none_or(&word) {
            return true;
        }
        at += 8;
    }
    at < n && load8(n - 8).is_none_or(&word)
}

/// Whether any byte of `bytes` must be escaped in a JSON string (below 0x20, `"` or `\\`).
#[inline]
fn any_needs_escape(bytes: &[u8]) -> bool {
    any_word(
        bytes,
        |v| has_less(v, 0x20) || has_byte(v, b'"') || has_byte(v, b'\\'),
        |b| b < 0x20 || b == b'"' || b == b'\\',
    )
}

/// Whether `bytes` holds a byte from 0x80 up (is not ASCII).
#[inline]
fn any_non_ascii(bytes: &[u8]) -> bool {
    any_word(bytes, |v| v & HIGH != 0, |b| b >= 0x80)
}

/// Writes `s` as a JSON string, followed by a colon when it is a key (`colon`).
#[inline]
fn write_str<S: Sink>(s: &str, colon: bool, out: &mut S) {
    let bytes = s.as_bytes();
    // Nearly every key and value has nothing to escape: one check, one copy.
    if !any_needs_escape(bytes) {
        out.put_quoted(bytes, colon);
        return;
    }
    write_escaped(bytes, out);
    if colon {
        out.put_byte(b':');
    }
}

/// Writes `bytes`, which hold a character to escape, as a JSON string.
#[cold]
fn write_escaped<S: Sink>(bytes: &[u8], out: &mut S) {
    out.put_byte(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[],
            _ => continue,
        };
        if start < i {
            out.put(&bytes[start..i]);
        }
        if escape.is_empty() {
            let [hi, lo] = HEX_PAIRS[usize::from(b)];
            out.put(&[b'\\', b'u', b'0', b'0', hi, lo]);
        } else {
            out.put(escape);
        }
        start = i + 1;
    }
    if start < bytes.len() {
        out.put(&bytes[start..]);
    }
    out.put_byte(b'"');
}

/// The RFC 8785 canonical form of a JSON value.
///
/// `INVALID_INPUT` for a value nested deeper than [`MAX_DEPTH`], or holding a number
/// that is not a finite double (possible only with serde_json's `arbitrary_precision`);
/// the message names no value.
pub fn canonical_json(value: &Value) -> Result<String, ToolError> {
    let mut buf = Vec::with_capacity(128);
    write_canonical(value, &mut buf, 0).map_err(NoCanonicalForm::into_error)?;
    String::from_utf8(buf).map_err(|e| ToolError::from_source(ErrorKind::Internal, e))
}

/// SHA-256 of the canonical JSON of `value`, streamed into the hasher through a small
/// stack buffer (never the whole canonical text).
///
/// Fails as [`canonical_json`] does, with `INVALID_INPUT`.
pub fn payload_digest(value: &Value) -> Result<Digest, ToolError> {
    let mut hasher = BufferedHasher::new();
    write_canonical(value, &mut hasher, 0).map_err(NoCanonicalForm::into_error)?;
    Ok(hasher.finish())
}

/// The cache key of a read-only call: `{tool}:{sha256(canonical payload)}`.
pub fn cache_key(tool: &str, payload: &Value) -> Result<String, ToolError> {
    Ok(cache_key_from_digest(tool, &payload_digest(payload)?))
}

/// The cache key from a digest already computed (see [`ToolRequest::payload_digest`](crate::ToolRequest::payload_digest)).
pub fn cache_key_from_digest(tool: &str, digest: &Digest) -> String {
    use fmt::Write as _;
    let mut key = String::with_capacity(tool.len() + 1 + 64);
    key.push_str(tool);
    key.push(':');
    // Writing into a String never fails.
    let _ = write!(key, "{digest}");
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_spells_every_byte_as_the_hex_crate_does() {
        for b in 0..=255u8 {
            let mut bytes = [0u8; 32];
            bytes[usize::from(b) % 32] = b;
            bytes[31 - usize::from(b) % 32] = b.wrapping_mul(31);
            let d = Digest(bytes);
            assert_eq!(d.hex().as_str(), hex::encode(bytes), "byte {b:#04x}");
            assert_eq!(Digest::from_hex(d.hex().as_str()), Some(d));
        }
    }

    #[test]
    fn short_copies_of_every_length_land_whole() {
        let src: Vec<u8> = (1..=16).collect();
        for n in 0..=16 {
            let mut dst = [0u8; 16];
            copy_short(&mut dst[..n], &src[..n]);
            assert_eq!(&dst[..n], &src[..n], "length {n}");
            assert!(
                dst[n..].iter().all(|&b| b == 0),
                "length {n} wrote past its end"
            );
        }
    }

    #[test]
    fn the_buffered_hasher_hashes_what_a_plain_buffer_holds() {
        // Pieces of every length from 0 to 40, across the buffer's boundary many times.
        let mut hashed = BufferedHasher::new();
        let mut plain = Vec::new();
        for round in 0..50_u8 {
            for n in 0..=40_usize {
                let piece: Vec<u8> = (0..n).map(|i| round ^ (i as u8)).collect();
                hashed.put(&piece);
                plain.put(&piece);
                hashed.put_byte(round);
                plain.put_byte(round);
            }
        }
        assert_eq!(hashed.finish(), Digest::of_bytes(&plain));
    }

    #[test]
    fn the_padding_is_right_at_every_length_and_long_pieces_hash_where_they_lie() {
        // Every total length across the buffer's end (the padding's length field in the
        // same block, in the next, in a block after a full buffer), reached with pieces
        // short and long (whole blocks hashed straight from the piece).
        for total in 0..=3 * BUFFERED + 2 * BLOCK {
            for piece in [1, 7, 63, 64, 65, 255, 256, 300] {
                let bytes: Vec<u8> = (0..total).map(|i| (i * 31 + piece) as u8).collect();
                let mut hashed = BufferedHasher::new();
                for chunk in bytes.chunks(piece) {
                    hashed.put(chunk);
                }
                assert_eq!(
                    hashed.finish(),
                    Digest::of_bytes(&bytes),
                    "{total} bytes in pieces of {piece}"
                );
            }
        }
    }

    #[test]
    fn quoted_pieces_hash_as_their_bytes_at_every_offset() {
        // Quoted keys and values of every length from 0 to 40, with and without a colon,
        // starting at every offset of the buffer (a boundary inside the piece included).
        let mut hashed = BufferedHasher::new();
        let mut plain = Vec::new();
        for round in 0..30_u8 {
            for n in 0..=40_usize {
                let piece: Vec<u8> = (0..n)
                    .map(|i| b'a' + ((round as usize + i) % 26) as u8)
                    .collect();
                let colon = n % 2 == 0;
                hashed.put_quoted(&piece, colon);
                plain.put_quoted(&piece, colon);
            }
            hashed.put_byte(round);
            plain.put_byte(round);
        }
        assert_eq!(hashed.finish(), Digest::of_bytes(&plain));
    }

    #[test]
    fn keys_in_another_order_than_utf16_are_told_from_sorted_ones() {
        // The check an insertion-ordered map (serde_json's `preserve_order`) goes through.
        assert!(keys_ascending(["a", "b", "ba", "é"].into_iter()));
        assert!(keys_ascending(std::iter::empty()));
        assert!(!keys_ascending(["b", "a"].into_iter()));
        assert!(!keys_ascending(["a", "a"].into_iter()));
        assert!(!keys_ascending(["ab", "a"].into_iter()));
        // U+E000 sorts after U+10000 by bytes but before it by UTF-16: never trusted.
        assert!(!keys_ascending(["a", "\u{e000}"].into_iter()));
        assert!(!keys_ascending(["\u{10000}"].into_iter()));
        assert!(plain_key("caller") && plain_key("ville-é") && !plain_key("\u{ffff}"));
    }

    #[test]
    fn every_byte_to_escape_and_every_non_ascii_byte_is_found_at_every_position_of_every_length() {
        let must = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        for len in 0..=24_usize {
            assert!(
                !any_needs_escape(&vec![b'x'; len]),
                "length {len}, nothing to escape"
            );
            for at in 0..len {
                for b in 0..=255_u8 {
                    let mut bytes = vec![b'x'; len];
                    bytes[at] = b;
                    assert_eq!(
                        any_needs_escape(&bytes),
                        must(b),
                        "byte {b:#04x} at {at} of {len}"
                    );
                    assert_eq!(
                        any_non_ascii(&bytes),
                        b >= 0x80,
                        "non-ASCII: byte {b:#04x} at {at} of {len}"
                    );
                }
            }
        }
    }
}
