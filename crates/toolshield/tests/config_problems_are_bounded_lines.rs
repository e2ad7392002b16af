//! A configuration refused lists its problems as bounded, printable lines, whatever its
//! text holds: keys, values and lines of any length (a reload's body is as long as its
//! sender makes it), control characters in keys, and nesting as deep as the parsers
//! refuse. Each problem's field path and message is at most `MAX_PROBLEM_TEXT` bytes of
//! one line, and a TOML syntax error says where it is (line and column) without
//! repeating the line.

use toolshield::ShieldConfig;
use toolshield_core::config::MAX_PROBLEM_TEXT;
use toolshield_core::ConfigError;

const LONG: usize = 200_000;

fn assert_bounded(what: &str, err: &ConfigError) {
    assert!(!err.problems().is_empty(), "{what}");
    for p in err.problems() {
        for (part, text) in [("field", &p.field), ("message", &p.message)] {
            assert!(
                text.len() <= MAX_PROBLEM_TEXT,
                "{what}: {part} of {} bytes",
                text.len()
            );
            assert!(
                !text.chars().any(|c| c.is_control() || c == '\u{2028}'),
                "{what}: {part} breaks its line: {text:?}"
            );
        }
    }
    let shown = err.to_string();
    let bound = 64 + err.problems().len() * (2 * MAX_PROBLEM_TEXT + 8);
    assert!(shown.len() <= bound, "{what}: {} bytes shown", shown.len());
    assert_eq!(
        shown.lines().count(),
        err.problems().len() + 1,
        "{what}: one line per problem"
    );
}

fn refused_toml(what: &str, text: &str) -> ConfigError {
    let err = ShieldConfig::from_toml_str(text).expect_err(what);
    assert_bounded(what, &err);
    err
}

#[test]
fn unknown_keys_and_values_of_any_length_are_cut() {
    let k = "k".repeat(LONG);
    let docs = [
        (
            "a long unknown retry key",
            format!("[defaults.retry]\n{k} = 1"),
        ),
        ("a long unknown section", format!("[defaults.{k}]\nq = 1")),
        (
            "a long unknown key in a tool",
            format!("[tools.x]\n{k} = 1"),
        ),
        ("a long unknown top-level key", format!("{k} = 1")),
        (
            "a long duration string",
            format!("[defaults.timeout]\nattempt = \"{}\"", "9".repeat(LONG)),
        ),
        ("a long kind", format!("[defaults]\nkind = \"{k}\"")),
        (
            "a long string where a number goes",
            format!("[defaults.retry]\nmax_attempts = \"{k}\""),
        ),
        (
            "many long unknown keys",
            (0..50)
                .map(|n| format!("[tools.t{n}]\n{k}{n} = 1\n"))
                .collect::<String>(),
        ),
    ];
    for (what, doc) in &docs {
        let err = refused_toml(what, doc);
        // The problem still says which key it is about, cut.
        let first = &err.problems()[0];
        assert!(
            first.field.contains("kkkk")
                || first.message.contains("kkkk")
                || first.message.contains("9999"),
            "{what}: {first}"
        );
    }
}

#[test]
fn control_characters_in_keys_do_not_break_the_list() {
    let doc = "[defaults.retry]\n\"a\\nb\\r- injected: yes\\u2028c\" = 1\n\"\\u0000\" = 2\n";
    let err = refused_toml("keys with line breaks", doc);
    assert_eq!(err.problems().len(), 2, "{err}");
}

#[test]
fn a_syntax_error_says_where_it_is_without_repeating_the_line() {
    let doc = format!(
        "enabled = true\n[defaults.retry]\nmax_attempts = [{}",
        "1,".repeat(LONG)
    );
    let err = refused_toml("an unclosed array on a long line", &doc);
    let message = &err.problems()[0].message;
    assert!(message.contains("line 3"), "{message}");
    assert!(message.contains("column"), "{message}");
    assert!(
        !message.contains("1,1,1,1,1,1"),
        "the line is repeated: {message}"
    );

    let err = refused_toml("a duplicate table", "[tools.a]\n[tools.a]\n");
    assert!(err.problems()[0].message.contains("line 2"), "{err}");
}

#[test]
fn nesting_as_deep_as_a_sender_likes_is_refused_in_a_few_bytes() {
    let n = 100_000;
    for (what, doc) in [
        (
            "nested arrays",
            format!("x = {}{}", "[".repeat(n), "]".repeat(n)),
        ),
        (
            "nested inline tables",
            format!("x = {}{}", "{a=".repeat(n), "}".repeat(n)),
        ),
        (
            "a long dotted key",
            format!("{} = 1", vec!["a"; n].join(".")),
        ),
    ] {
        let err = refused_toml(what, &doc);
        assert!(err.to_string().len() < 512, "{what}: {err}");
    }
    let json = format!("{{\"x\": {}{}}}", "[".repeat(n), "]".repeat(n));
    let err = ShieldConfig::from_json_str(&json).unwrap_err();
    assert_bounded("nested JSON arrays", &err);
}

#[test]
fn a_json_document_with_long_keys_is_cut_too() {
    let k = "k".repeat(LONG);
    let json = format!("{{\"defaults\": {{\"retry\": {{\"{k}\": 1, \"{k}\": 2}}}}}}");
    let err = ShieldConfig::from_json_str(&json).unwrap_err();
    assert_bounded("a long duplicate JSON key", &err);
}

#[test]
fn a_file_with_a_long_bad_line_is_refused_in_bounded_lines() {
    let dir = std::env::temp_dir().join(format!("toolshield-bounded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shield.toml");
    std::fs::write(
        &path,
        format!("[defaults.retry]\nmax_attempts = [{}", "7,".repeat(LONG)),
    )
    .unwrap();
    let err = ShieldConfig::load(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    assert_bounded("a file", &err);
    let message = &err.problems()[0].message;
    assert!(
        message.contains("shield.toml") && message.contains("line 2"),
        "{message}"
    );
}

#[test]
fn hundreds_of_thousands_of_problems_list_the_first_thousand_and_count_the_rest() {
    use toolshield_core::config::MAX_PROBLEMS;
    let n = 200_000;
    let doc: String = (0..n).map(|i| format!("unknown{i} = 1\n")).collect();
    let err = ShieldConfig::from_toml_str(&doc).unwrap_err();
    assert_eq!(err.problems().len(), MAX_PROBLEMS);
    assert_eq!(
        err.problems().len() + err.unlisted(),
        n,
        "every problem counted"
    );
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("invalid configuration: {n} problems")),
        "{}",
        &shown[..80]
    );
    assert!(shown.ends_with(&format!("and {} more, not listed", n - MAX_PROBLEMS)));
    assert!(shown.len() < 100_000, "{} bytes", shown.len());

    let doc: String = (0..20_000)
        .map(|i| format!("[tools.t{i}]\nbogus = 1\n"))
        .collect();
    let err = ShieldConfig::from_toml_str(&doc).unwrap_err();
    assert_eq!(err.problems().len(), MAX_PROBLEMS);
    assert!(err.unlisted() >= 19_000, "{}", err.unlisted());
}

#[test]
fn a_tool_name_that_reorders_or_hides_text_is_refused() {
    for name in [
        "a\\u202Eb",
        "a\\u2028b",
        "a\\u200Bb",
        "a\\uFEFFb",
        "a\\U000E0041b",
    ] {
        let doc = format!("[tools.\"{name}\"]\n");
        let err = refused_toml(name, &doc);
        assert_eq!(err.problems()[0].field, "tools", "{err}");
    }
}
