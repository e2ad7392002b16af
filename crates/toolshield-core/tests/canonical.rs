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

/// Parses `input` and checks its canonical bytes, and that the digest is the SHA-256 of
/// exactly those bytes.
fn assert_canonical(input: &str, expected: &[u8]) {
    let v: Value = serde_json::from_str(input).unwrap();
    let ours = canonical_json(&v).unwrap();
    assert_eq!(
        ours.as_bytes(),
        expected,
        "input {input:?}: got {ours:?}, expected {:?}",
        String::from_utf8_lossy(expected)
    );
    assert_eq!(payload_digest(&v).unwrap(), Digest::of_bytes(expected));
}

fn unhex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect()
}

#[test]
fn the_published_jcs_test_vectors_canonicalise_to_their_expected_bytes() {
    // The `testdata` of the JCS reference implementation: input and the expected UTF-8
    // bytes of the canonical form, in hex.
    let cases: &[(&str, &str, &str)] = &[
        (
            "arrays",
            r#"[ 56, { "d": true, "10": null, "1": [ ] } ]"#,
            "5b 35 36 2c 7b 22 31 22 3a 5b 5d 2c 22 31 30 22 3a 6e 75 6c 6c 2c 22 64 22 3a 74 72 75 65 7d 5d",
        ),
        (
            "french",
            "{\n  \"peach\": \"This sorting order\",\n  \"p\u{e9}ch\u{e9}\": \"is wrong according to French\",\n  \"p\u{ea}che\": \"but canonicalization MUST\",\n  \"sin\":   \"ignore locale\"\n}",
            "7b 22 70 65 61 63 68 22 3a 22 54 68 69 73 20 73 6f 72 74 69 6e 67 20 6f 72 64 65 72 22 2c 22 70
             c3 a9 63 68 c3 a9 22 3a 22 69 73 20 77 72 6f 6e 67 20 61 63 63 6f 72 64 69 6e 67 20 74 6f 20 46
             72 65 6e 63 68 22 2c 22 70 c3 aa 63 68 65 22 3a 22 62 75 74 20 63 61 6e 6f 6e 69 63 61 6c 69 7a
             61 74 69 6f 6e 20 4d 55 53 54 22 2c 22 73 69 6e 22 3a 22 69 67 6e 6f 72 65 20 6c 6f 63 61 6c 65
             22 7d",
        ),
        (
            "structures",
            r#"{
  "1": {"f": {"f": "hi","F": 5} ,"\n": 56.0},
  "10": { },
  "": "empty",
  "a": { },
  "111": [ {"e": "yes","E": "no" } ],
  "A": { }
}"#,
            "7b 22 22 3a 22 65 6d 70 74 79 22 2c 22 31 22 3a 7b 22 5c 6e 22 3a 35 36 2c 22 66 22 3a 7b 22 46
             22 3a 35 2c 22 66 22 3a 22 68 69 22 7d 7d 2c 22 31 30 22 3a 7b 7d 2c 22 31 31 31 22 3a 5b 7b 22
             45 22 3a 22 6e 6f 22 2c 22 65 22 3a 22 79 65 73 22 7d 5d 2c 22 41 22 3a 7b 7d 2c 22 61 22 3a 7b
             7d 7d",
        ),
        (
            "unicode",
            r#"{ "Unnormalized Unicode":"A\u030a" }"#,
            "7b 22 55 6e 6e 6f 72 6d 61 6c 69 7a 65 64 20 55 6e 69 63 6f 64 65 22 3a 22 41 cc 8a 22 7d",
        ),
        (
            "values",
            r#"{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#,
            "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 75 65 2c 66 61 6c 73 65 5d 2c 22 6e
             75 6d 62 65 72 73 22 3a 5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 65 2b 33 30
             2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24
             5c 75 30 30 30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d",
        ),
        (
            "weird",
            r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\u000a": "Newline",
  "1": "One",
  "\u0080": "Control\u007f",
  "\ud83d\ude02": "Smiley",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "</script>": "Browser Challenge"
}"#,
            "7b 22 5c 6e 22 3a 22 4e 65 77 6c 69 6e 65 22 2c 22 5c 72 22 3a 22 43 61 72 72 69 61 67 65 20 52
             65 74 75 72 6e 22 2c 22 31 22 3a 22 4f 6e 65 22 2c 22 3c 2f 73 63 72 69 70 74 3e 22 3a 22 42 72
             6f 77 73 65 72 20 43 68 61 6c 6c 65 6e 67 65 22 2c 22 c2 80 22 3a 22 43 6f 6e 74 72 6f 6c 7f 22
             2c 22 c3 b6 22 3a 22 4c 61 74 69 6e 20 53 6d 61 6c 6c 20 4c 65 74 74 65 72 20 4f 20 57 69 74 68
             20 44 69 61 65 72 65 73 69 73 22 2c 22 e2 82 ac 22 3a 22 45 75 72 6f 20 53 69 67 6e 22 2c 22 f0
             9f 98 82 22 3a 22 53 6d 69 6c 65 79 22 2c 22 ef ac b3 22 3a 22 48 65 62 72 65 77 20 4c 65 74 74
             65 72 20 44 61 6c 65 74 20 57 69 74 68 20 44 61 67 65 73 68 22 7d",
        ),
    ];
    for (name, input, hex) in cases {
        let expected = unhex(hex);
        let v: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonical_json(&v).unwrap().as_bytes(),
            expected.as_slice(),
            "vector {name}"
        );
        assert_canonical(input, &expected);
    }
}

#[test]
fn the_rfc_8785_key_sorting_example_orders_by_utf16_code_units() {
    // RFC 8785 §3.2.3: U+1F600 (a surrogate pair, D83D DE00) sorts before U+FB33.
    let input = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#;
    let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
    assert_canonical(input, expected.as_bytes());
}

#[test]
fn every_double_of_rfc_8785_appendix_b_is_written_as_ecmascript_writes_it() {
    // (IEEE 754 bits, canonical text), RFC 8785 Appendix B.
    let cases: &[(u64, &str)] = &[
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];
    for (bits, expected) in cases {
        let f = f64::from_bits(*bits);
        // As a double built in code, and as the text a JSON parser reads.
        let built = Value::from(f);
        assert_eq!(
            canonical_json(&built).unwrap(),
            *expected,
            "bits {bits:016x}"
        );
        let text = format!("{f:e}");
        assert_canonical(&text, expected.as_bytes());
        // The same value inside an object and an array is written the same way.
        let wrapped = json!({"n": [f]});
        assert_eq!(
            canonical_json(&wrapped).unwrap(),
            format!("{{\"n\":[{expected}]}}"),
            "bits {bits:016x}"
        );
    }
}

#[test]
fn numbers_are_written_as_the_double_they_denote_whatever_their_spelling() {
    let cases: &[(&str, &str)] = &[
        ("1e21", "1e+21"),
        ("1E+21", "1e+21"),
        ("1e20", "100000000000000000000"),
        ("1e-7", "1e-7"),
        ("1e-6", "0.000001"),
        ("-0", "0"),
        ("-0.0", "0"),
        ("-0e10", "0"),
        ("0e0", "0"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("0.000001", "0.000001"),
        ("333333333.3333333", "333333333.3333333"),
        ("1e+23", "1e+23"),
        ("1e23", "1e+23"),
        ("4.50", "4.5"),
        ("2e-3", "0.002"),
        ("1E30", "1e+30"),
        ("0.1", "0.1"),
        ("1e-1", "0.1"),
        ("56.0", "56"),
        ("-56.0", "-56"),
        ("-1", "-1"),
        ("9007199254740993", "9007199254740992"),
        ("-9007199254740993", "-9007199254740992"),
        ("18446744073709551615", "18446744073709552000"),
        ("-9223372036854775808", "-9223372036854776000"),
        ("123456789012345680000", "123456789012345680000"),
    ];
    for (input, expected) in cases {
        assert_canonical(input, expected.as_bytes());
    }
}

#[test]
fn strings_carry_only_the_escapes_json_requires_with_lowercase_hex() {
    // Every control character: the five short escapes, the rest as \u00xx in lowercase.
    for c in 0u8..0x20 {
        let s = String::from(char::from(c));
        let expected = match c {
            0x08 => "\"\\b\"".to_owned(),
            0x09 => "\"\\t\"".to_owned(),
            0x0a => "\"\\n\"".to_owned(),
            0x0c => "\"\\f\"".to_owned(),
            0x0d => "\"\\r\"".to_owned(),
            _ => format!("\"\\u{c:04x}\""),
        };
        assert_eq!(
            canonical_json(&json!(s)).unwrap(),
            expected,
            "char {c:#04x}"
        );
        assert_eq!(
            payload_digest(&json!(s)).unwrap(),
            Digest::of_bytes(expected.as_bytes())
        );
    }
    // Quote and backslash escaped; nothing else: `/`, DEL, C1 controls, U+2028, U+2029,
    // noncharacters and astral characters are written as their UTF-8 bytes.
    let cases: &[(&str, &str)] = &[
        ("\"", "\"\\\"\""),
        ("\\", "\"\\\\\""),
        ("/", "\"/\""),
        ("\u{7f}", "\"\u{7f}\""),
        ("\u{80}\u{9f}", "\"\u{80}\u{9f}\""),
        ("\u{2028}\u{2029}", "\"\u{2028}\u{2029}\""),
        ("\u{fffe}\u{ffff}", "\"\u{fffe}\u{ffff}\""),
        ("\u{1f600}", "\"\u{1f600}\""),
        ("</script>", "\"</script>\""),
        ("a\u{1}b\u{1f}c", "\"a\\u0001b\\u001fc\""),
        ("\u{1b}[0m", "\"\\u001b[0m\""),
    ];
    for (s, expected) in cases {
        assert_eq!(canonical_json(&json!(s)).unwrap(), *expected, "{s:?}");
        // As a key too.
        let mut map = serde_json::Map::new();
        map.insert((*s).to_owned(), json!(1));
        assert_eq!(
            canonical_json(&Value::Object(map)).unwrap(),
            format!("{{{expected}:1}}")
        );
    }
    // Escapes in the input never survive as such: `\u00e9` and `é` are one string.
    assert_canonical(r#""\u00e9\/\u2028""#, "\"\u{e9}/\u{2028}\"".as_bytes());
}

#[test]
fn keys_above_u_ffff_sort_before_keys_from_u_e000_to_u_ffff() {
    // By UTF-16 code units: a surrogate pair (D800..DBFF first) is below E000..FFFF,
    // though its UTF-8 bytes (F0..) are above theirs (EE.., EF..).
    let keys = [
        "\u{ffff}",
        "\u{e000}",
        "\u{fb33}",
        "\u{10000}",
        "\u{10ffff}",
        "\u{1f600}",
        "\u{d7ff}",
        "z",
        "",
        "\u{ff}",
    ];
    let mut map = serde_json::Map::new();
    for (i, k) in keys.iter().enumerate() {
        map.insert((*k).to_owned(), json!(i));
    }
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    assert_eq!(
        sorted,
        [
            "",
            "z",
            "\u{ff}",
            "\u{d7ff}",
            "\u{10000}",
            "\u{1f600}",
            "\u{10ffff}",
            "\u{e000}",
            "\u{fb33}",
            "\u{ffff}"
        ]
    );
    let expected = format!(
        "{{{}}}",
        sorted
            .iter()
            .map(|k| {
                let i = keys.iter().position(|x| x == k).unwrap();
                format!("\"{k}\":{i}")
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    let v = Value::Object(map);
    assert_eq!(canonical_json(&v).unwrap(), expected);
    assert_eq!(
        payload_digest(&v).unwrap(),
        Digest::of_bytes(expected.as_bytes())
    );
    // Keys that share a prefix and differ only there, nested at once.
    let nested = json!({"k": {"a\u{e000}": 1, "a\u{10000}": 2, "a": 3}});
    assert_eq!(
        canonical_json(&nested).unwrap(),
        "{\"k\":{\"a\":3,\"a\u{10000}\":2,\"a\u{e000}\":1}}"
    );
}

/// `depth` arrays and objects, each holding the next, built without recursion.
fn nested_levels(depth: usize) -> Value {
    let mut v = json!("leaf");
    for i in 0..depth {
        v = if i % 2 == 0 {
            Value::Array(vec![v])
        } else {
            let mut map = serde_json::Map::new();
            map.insert("\u{e000}k".to_owned(), v);
            map.insert("\u{10000}k".to_owned(), json!(i));
            Value::Object(map)
        };
    }
    v
}

/// Drops `value` level by level (dropping a `Value` recurses once per level).
fn drop_iteratively(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

#[test]
fn exactly_max_depth_levels_have_a_canonical_form_and_one_more_is_invalid_input() {
    use toolshield_core::canonical::MAX_DEPTH;
    use toolshield_core::ErrorKind;
    // On a thread with a 2 MiB stack, as a tokio worker has, in the unoptimised build.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let deepest = nested_levels(MAX_DEPTH);
            let text = canonical_json(&deepest).expect("MAX_DEPTH levels are allowed");
            assert_eq!(
                payload_digest(&deepest).unwrap(),
                Digest::of_bytes(text.as_bytes())
            );
            assert_eq!(
                text.matches('[').count() + text.matches('{').count(),
                MAX_DEPTH
            );
            drop_iteratively(deepest);
            let too_deep = nested_levels(MAX_DEPTH + 1);
            for err in [
                canonical_json(&too_deep).unwrap_err(),
                payload_digest(&too_deep).unwrap_err(),
            ] {
                assert_eq!(err.kind(), ErrorKind::InvalidInput);
                assert!(err.message().contains("deep"), "{}", err.message());
            }
            drop_iteratively(too_deep);
            // Scalars at the deepest level do not count as a level.
            let mut v = json!(1);
            for _ in 0..MAX_DEPTH {
                v = Value::Array(vec![v]);
            }
            assert!(payload_digest(&v).is_ok());
            drop_iteratively(v);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_large_payload_has_the_digest_of_its_canonical_bytes() {
    // Many members (some of them sorting otherwise by UTF-16), long strings with escapes,
    // a wide array: streamed into the digest, it matches the text's hash.
    let mut map = serde_json::Map::new();
    for i in 0..20_000u32 {
        let key = match i % 3 {
            0 => format!("k{i}"),
            1 => format!("\u{e000}{i}"),
            _ => format!("\u{1f600}{i}"),
        };
        map.insert(key, json!(i));
    }
    let long = "x\"\\\n\u{1}\u{2028}".repeat(200_000);
    let v = json!({"members": map, "long": long, "wide": (0..100_000).collect::<Vec<u32>>()});
    let text = canonical_json(&v).unwrap();
    assert_eq!(text, serde_jcs::to_string(&v).unwrap());
    assert_eq!(
        payload_digest(&v).unwrap(),
        Digest::of_bytes(text.as_bytes())
    );
}
