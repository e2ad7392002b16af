//! Cost of the canonical payload digest (RFC 8785 + SHA-256) of a 200-byte payload:
//! toolshield's streaming writer against `serde_jcs` then SHA-256, in one group; and of
//! the smallest output (`true`) against SHA-256 of its four bytes.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use sha2::{Digest as _, Sha256};
use toolshield_benches::payload_200b;
use toolshield_core::payload_digest;

fn canonical(c: &mut Criterion) {
    let payload = payload_200b();
    let len = toolshield_core::canonical::canonical_json(&payload)
        .map(|s| s.len())
        .unwrap_or(0);
    let mut group = c.benchmark_group(format!("payload_digest_{len}B"));
    group.bench_function("toolshield_streaming", |b| {
        b.iter(|| payload_digest(black_box(&payload)))
    });
    group.bench_function("serde_jcs_then_sha256", |b| {
        b.iter(|| {
            let bytes = serde_jcs::to_vec(black_box(&payload)).unwrap_or_default();
            Sha256::digest(&bytes)
        })
    });
    group.bench_function("sha256_only", |b| {
        let bytes = serde_jcs::to_vec(&payload).unwrap_or_default();
        b.iter(|| Sha256::digest(black_box(&bytes)))
    });
    group.finish();

    // The smallest output a tool gives (`true`): the provenance layer digests every
    // response, so this is what a call pays for its `response_digest` at the least.
    let small = serde_json::Value::Bool(true);
    let mut group = c.benchmark_group("payload_digest_4B");
    group.bench_function("toolshield_streaming", |b| {
        b.iter(|| payload_digest(black_box(&small)))
    });
    group.bench_function("sha256_only", |b| {
        b.iter(|| Sha256::digest(black_box(b"true")))
    });
    group.finish();
}

criterion_group!(benches, canonical);
criterion_main!(benches);
