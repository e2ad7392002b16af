//! The streaming RFC 8785 writer against `serde_jcs` as an oracle, and RFC vectors.

use proptest::prelude::*;
use serde_json::{json, Value};
use toolshield_core::canonical::canonical_json;
use toolshield_core::{payload_digest, Digest};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        // Longer than the digest's 256-byte buffer, with or without escapes.
        "\\PC{200,400}".prop_map(Value::String),
        "[a\"\\\\\n\u{1}]{250,600}".prop_map(Value::String),
        // Around 2^53, where integers stop being written from their digits.
        prop_oneof![
            Just(1i64 << 53),
            Just((1i64 << 53) + 1),
            Just((1i64 << 53) - 1),
            Just(-(1i64 << 53)),
            Just(-(1i64 << 53) - 1),
            Just(i64::MIN),
        ]
        .prop_map(|n| json!(n)),
        // control characters, quotes, backslashes, astral and high-BMP characters
        prop::collection::vec(
            prop_oneof![
                Just('\u{0}'),
                Just('\u{1f}'),
                Just('"'),
                Just('\\'),
                Just('\n'),
                Just('\u{7f}'),
                Just('\u{2028}'),
                Just('\u{e000}'),
                Just('\u{ffff}'),
                Just('\u{10000}'),
                Just('\u{1f600}'),
                Just('a'),
                Just('é'),
            ],
            0..8
        )
        .prop_map(|cs| Value::String(cs.into_iter().collect())),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-z]{0,4}",
                    "\\PC{0,4}",
                    Just("\u{e000}".to_owned()),
                    Just("\u{1f600}".to_owned()),
                    // Plain keys and keys that sort otherwise by UTF-16, sharing a prefix.
                    "a[bz\u{e000}\u{ffff}\u{10000}\u{1f600}]{0,3}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn matches_serde_jcs(v in arb_json()) {
        let ours = canonical_json(&v).unwrap();
        let oracle = serde_jcs::to_string(&v).unwrap();
        prop_assert_eq!(&ours, &oracle);
        prop_assert_eq!(payload_digest(&v).unwrap(), Digest::of_bytes(ours.as_bytes()));
    }
}

#[test]
fn rfc_8785_number_vectors() {
    // Appendix B of RFC 8785 (the doubles that JSON can carry).
    let cases: &[(&str, &str)] = &[
        ("0", "0"),
        ("-0", "0"),
        ("1e+21", "1e+21"),
        ("1e21", "1e+21"),
        ("999999999999999900000", "999999999999999900000"),
        ("9007199254740992", "9007199254740992"),
        ("9007199254740993", "9007199254740992"),
        ("295147905179352830000", "295147905179352830000"),
        ("1e-7", "1e-7"),
        ("0.000001", "0.000001"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("-1.7976931348623157e308", "-1.7976931348623157e+308"),
        ("333333333.3333333", "333333333.3333333"),
        ("1.0", "1"),
        ("100", "100"),
    ];
    for (input, expected) in cases {
        let v: Value = serde_json::from_str(input).unwrap();
        assert_eq!(canonical_json(&v).unwrap(), *expected, "input {input}");
    }
}

#[test]
fn plain_keys_before_keys_that_sort_otherwise_by_utf16_keep_their_place() {
    // Byte order: "a" < "a\u{e000}" < "a\u{1f600}" < "b" < "\u{e000}" < "\u{1f600}".
    // UTF-16 moves each astral key before its high-BMP neighbour, and only those.
    let v = json!({
        "\u{1f600}": 5, "\u{e000}": 4, "b": 3, "a\u{1f600}": 2, "a\u{e000}": 1, "a": 0
    });
    let expected =
        "{\"a\":0,\"a\u{1f600}\":2,\"a\u{e000}\":1,\"b\":3,\"\u{1f600}\":5,\"\u{e000}\":4}";
    assert_eq!(canonical_json(&v).unwrap(), expected);
    assert_eq!(serde_jcs::to_string(&v).unwrap(), expected);
    assert_eq!(
        payload_digest(&v).unwrap(),
        Digest::of_bytes(expected.as_bytes())
    );
}

#[test]
fn keys_sort_by_utf16_code_units_not_bytes() {
    // U+1F600 is the surrogate pair D83D DE00 in UTF-16, which sorts before U+E000,
    // while its UTF-8 bytes (F0 ..) sort after U+E000's (EE ..).
    let v = json!({"\u{e000}": 1, "\u{1f600}": 2, "a": 0});
    assert_eq!(
        canonical_json(&v).unwrap(),
        "{\"a\":0,\"\u{1f600}\":2,\"\u{e000}\":1}"
    );
}
