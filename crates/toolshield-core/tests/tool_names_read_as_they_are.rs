//! A tool name shows in logs, metric labels, admin answers and texts for a model, so a
//! name that would break a line there, reorder the text around it (a bidirectional
//! control, as in CVE-2021-42574) or hide part of itself (an invisible space, a tag
//! character) is refused, as control characters are. Joiners that scripts and emoji
//! need (ZWJ, ZWNJ) and ordinary non-ASCII names are accepted.

use toolshield_core::keys::check_tool_name;

#[test]
fn names_that_break_reorder_or_hide_text_are_refused() {
    for c in [
        '\u{2028}',
        '\u{2029}',
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{200E}',
        '\u{200F}',
        '\u{061C}',
        '\u{200B}',
        '\u{2060}',
        '\u{FEFF}',
        '\u{E0001}',
        '\u{E0041}',
        '\u{E007F}',
        '\u{85}',
        '\u{0}',
        '\n',
    ] {
        let name = format!("pay{c}ment");
        let why = check_tool_name(&name);
        assert!(why.is_some(), "{name:?} accepted");
        assert!(why.unwrap().contains(&format!("{c:?}")), "{c:?}");
    }
}

#[test]
fn ordinary_names_in_any_script_are_accepted() {
    for name in [
        "get_weather",
        "météo",
        "天気",
        "погода",
        "طقس",
        "family\u{200D}tool",
        "कि\u{200C}ताब",
        "a.b-c_d:e/f",
    ] {
        assert_eq!(check_tool_name(name), None, "{name:?}");
    }
}
