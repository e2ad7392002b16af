//! End-to-end tests across toolshield crates live in `tests/`.
